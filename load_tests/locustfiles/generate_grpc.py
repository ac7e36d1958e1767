"""Generation over gRPC streaming (one stream per user, one response per token), closed or open
loop. TTFT, TPOT, inter-token latency and output tokens/s appear in the web UI's "Tokens" tab, at the
end of a headless run, and in <csv prefix>_tokens.csv.

    locust -f load_tests/locustfiles/generate_grpc.py --headless -u 8 -r 8 -t 60s \
        --host 127.0.0.1:8001 --csv out/generate_grpc
    locust -f load_tests/locustfiles/generate_grpc.py --web-host 127.0.0.1  # web UI on :8089

`--model gpt2_static` for the static-batching baseline; `--max-tokens 16` caps every request;
`--arrival-rate 1` switches to open-loop arrivals. Every setting: load_tests/options.py.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for `locust -f` from anywhere

from locust import events, run_single_user  # noqa: E402

from load_tests import options, users  # noqa: E402


class GenerateGrpc(users.GenerateGrpcUser):
    model = "gpt2"


options.install(events, GenerateGrpc)

if __name__ == "__main__":
    run_single_user(GenerateGrpc)

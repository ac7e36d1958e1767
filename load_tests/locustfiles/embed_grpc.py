"""Sentence embeddings over gRPC (unary ModelInfer, one client per user), closed or open loop.

    locust -f load_tests/locustfiles/embed_grpc.py --headless -u 16 -r 16 -t 30s \
        --host 127.0.0.1:8001 --csv out/embed_grpc
    locust -f load_tests/locustfiles/embed_grpc.py --web-host 127.0.0.1     # web UI on :8089

The gRPC host is host:port, with or without a grpc:// scheme. `--model minilm` sends token ids;
`--arrival-rate 50` switches to open-loop arrivals. Every setting: load_tests/options.py.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for `locust -f` from anywhere

from locust import events, run_single_user  # noqa: E402

from load_tests import options, users  # noqa: E402


class EmbedGrpc(users.EmbedGrpcUser):
    model = "embed"


options.install(events, EmbedGrpc)

if __name__ == "__main__":
    run_single_user(EmbedGrpc)

"""Sentence embeddings over HTTP (binary tensors), closed loop or open loop.

    locust -f load_tests/locustfiles/embed_http.py --headless -u 16 -r 16 -t 30s \
        --host http://127.0.0.1:8000 --csv out/embed_http
    locust -f load_tests/locustfiles/embed_http.py --web-host 127.0.0.1     # web UI on :8089

`--model minilm` sends token ids instead of text; `--arrival-rate 50` switches to open-loop Poisson
arrivals (`--arrival-distribution gamma --arrival-cv 2` for bursts); `--workload FILE` replays a file
from `python -m load_tests.workload`. Every setting: load_tests/options.py (and the web UI's start form).
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for `locust -f` from anywhere

from locust import events, run_single_user  # noqa: E402

from load_tests import options, users  # noqa: E402


class EmbedHttp(users.EmbedHttpUser):
    model = "embed"


options.install(events, EmbedHttp)

if __name__ == "__main__":
    run_single_user(EmbedHttp)

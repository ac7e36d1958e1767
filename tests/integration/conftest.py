"""One real embedded Triton per test session, on free ports, over a temporary copy of the model
repository (plus a probe model that imports ssl). Always stopped in teardown."""
import shutil
from pathlib import Path

import pytest

from clients.model_spec import MODEL_REPOSITORY
from scripts.serve import EmbeddedServer, ServerOptions, free_port

ONNX_MODEL = MODEL_REPOSITORY / "minilm" / "1" / "model.onnx"
SSL_PROBE = Path(__file__).resolve().parent.parent / "fixtures" / "ssl_probe"


def distinct_free_ports(n: int) -> list[int]:
    ports: list[int] = []
    while len(ports) < n:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


def copy_repository(dest: Path) -> Path:
    if not ONNX_MODEL.is_file():
        pytest.fail(f"{ONNX_MODEL} is missing: run `make export` (or `make test`, which does it first)")
    shutil.copytree(MODEL_REPOSITORY, dest, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def server_options(repository: Path) -> ServerOptions:
    http, grpc, metrics = distinct_free_ports(3)
    return ServerOptions(model_repository=repository, http_port=http, grpc_port=grpc, metrics_port=metrics)


@pytest.fixture(scope="session")
def model_repository(tmp_path_factory) -> Path:
    repo = copy_repository(tmp_path_factory.mktemp("triton") / "model_repository")
    shutil.copytree(SSL_PROBE, repo / "ssl_probe")
    return repo


@pytest.fixture(scope="session")
def server(model_repository, tmp_path_factory):
    opts = server_options(model_repository)
    log = tmp_path_factory.mktemp("logs") / "tritonserver.log"
    with EmbeddedServer(opts, log_path=log) as running:
        yield running

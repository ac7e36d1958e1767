"""One real embedded Triton per test session, on free ports, over a temporary copy of the model
repository (plus a probe model that imports ssl). Always stopped in teardown."""
import shutil
import time
from pathlib import Path

import pytest

from clients.model_spec import MODEL_REPOSITORY
from scripts.serve import EmbeddedServer, options_on_free_ports

ONNX_MODEL = MODEL_REPOSITORY / "minilm" / "1" / "model.onnx"
SSL_PROBE = Path(__file__).resolve().parent.parent / "fixtures" / "ssl_probe"


def settled_delta(admin, model: str, before, inferences: int, timeout_s: float = 5.0):
    """The statistics since `before` (a ModelStatistics), read again until the batch counts account
    for `inferences`: Triton records a batch's statistics after it has sent the responses, so a read
    made as soon as the last response arrives can miss the last batch."""
    deadline = time.monotonic() + timeout_s
    while True:
        delta = admin.statistics(model) - before
        counted = sum(size * n for size, n in delta.batch_executions.items())
        if (delta.inference_count, counted) == (inferences, inferences) or time.monotonic() > deadline:
            return delta
        time.sleep(0.05)


def copy_repository(dest: Path, models: tuple[str, ...] | None = None) -> Path:
    """A model repository of its own: configs copied (a test may change them), version folders
    linked to the generated weights (hundreds of MB that no test changes)."""
    if not ONNX_MODEL.is_file():
        pytest.fail(f"{ONNX_MODEL} is missing: run `make export` (or `make test`, which does it first)")
    for model_dir in sorted(p for p in MODEL_REPOSITORY.iterdir() if (p / "config.pbtxt").is_file()):
        if models is not None and model_dir.name not in models:
            continue
        (dest / model_dir.name).mkdir(parents=True)
        shutil.copy(model_dir / "config.pbtxt", dest / model_dir.name / "config.pbtxt")
        for version in (v for v in model_dir.iterdir() if v.name.isdigit()):
            (dest / model_dir.name / version.name).symlink_to(version.resolve(), target_is_directory=True)
    return dest


@pytest.fixture(scope="session")
def model_repository(tmp_path_factory) -> Path:
    repo = copy_repository(tmp_path_factory.mktemp("triton") / "model_repository")
    shutil.copytree(SSL_PROBE, repo / "ssl_probe")
    return repo


@pytest.fixture(scope="session")
def server(model_repository, tmp_path_factory):
    opts = options_on_free_ports(model_repository)
    log = tmp_path_factory.mktemp("logs") / "tritonserver.log"
    with EmbeddedServer(opts, log_path=log) as running:
        yield running

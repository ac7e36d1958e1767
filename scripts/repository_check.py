"""Checks a model repository before the server starts, so that a broken one fails with a message
that says which model and what to do, not a page of server log."""
from __future__ import annotations

from pathlib import Path

from google.protobuf.text_format import ParseError

from clients.model_spec import parse_config
from scripts.triton_dist import LauncherError

# The file each backend loads from a version folder, and the command that generates it.
_MODEL_FILES = {
    "onnxruntime": ("model.onnx", "make export"),
    "python": ("model.py", None),
    "continuous_decoding": ("model.safetensors", "make export"),
}


def check_model_repository(repository: Path) -> list[str]:
    """Return the names of the models found; raise LauncherError naming the first problem."""
    repository = Path(repository)
    if not repository.is_dir():
        raise LauncherError(f"model repository {repository} does not exist or is not a directory")
    models = sorted(p for p in repository.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not models:
        raise LauncherError(f"model repository {repository} holds no models")
    for model_dir in models:
        _check_model(model_dir)
    return [m.name for m in models]


def _check_model(model_dir: Path) -> None:
    config_path = model_dir / "config.pbtxt"
    if not config_path.is_file():
        raise LauncherError(f"model {model_dir.name!r} has no config.pbtxt ({config_path})")
    try:
        config = parse_config(config_path.read_text())
    except ParseError as e:
        raise LauncherError(f"{config_path} is not a valid model config: {e}") from None
    if config.name and config.name != model_dir.name:
        raise LauncherError(
            f"{config_path} names the model {config.name!r} but its folder is {model_dir.name!r}; they must agree"
        )
    if config.platform == "ensemble":
        return
    versions = sorted(p for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit())
    if not versions:
        raise LauncherError(f"model {model_dir.name!r} has no version folder (e.g. {model_dir / '1'})")
    backend = config.backend or config.platform
    expected = _MODEL_FILES.get(backend)
    if expected is None:
        return
    filename, make_target = expected
    filename = config.default_model_filename or filename
    for version in versions:
        path = version / filename
        if not path.is_file():
            hint = f": run `{make_target}` to generate it" if make_target else ""
            raise LauncherError(f"model {model_dir.name!r}: {path} is missing{hint}")

"""Where the tritonserver binary, Triton's Python backend and its stubs live inside nvidia-pytriton,
and how a backend directory and environment for them are assembled."""
from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
REPO_BACKENDS = REPO_ROOT / "backends"


class LauncherError(RuntimeError):
    """A problem the user can fix: the message says what and how."""


@dataclass(frozen=True)
class TritonDist:
    """The Triton build that the nvidia-pytriton wheel carries."""

    root: Path  # .../pytriton/tritonserver

    @property
    def binary(self) -> Path:
        return self.root / "bin" / "tritonserver"

    @property
    def python_backend(self) -> Path:
        return self.root / "backends" / "python"

    @property
    def libs(self) -> Path:
        # The wheel's bundled shared libraries (libcudart, libtritonserver, ...), found through the
        # binaries' RPATH at their original place; a copied stub needs them on LD_LIBRARY_PATH.
        return self.root.parent.parent / "nvidia_pytriton.libs"

    def stub(self, python_version: str) -> Path:
        return self.root / "python_backend_stubs" / python_version / "triton_python_backend_stub"


def find_triton() -> TritonDist:
    spec = importlib.util.find_spec("pytriton")
    if spec is None or spec.origin is None:
        raise LauncherError(
            "nvidia-pytriton is not installed in this Python "
            f"({sys.executable}); run `make venv` or `pip install nvidia-pytriton`"
        )
    dist = TritonDist(Path(spec.origin).parent / "tritonserver")
    if not dist.binary.is_file():
        raise LauncherError(f"the tritonserver binary is missing from nvidia-pytriton: {dist.binary}")
    return dist


def running_python_version() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def assemble_backend_directory(dist: TritonDist, dest: Path, repo_backends: Path = REPO_BACKENDS) -> Path:
    """Lay out a Triton backend directory: Triton's Python backend with the stub built for the
    running Python, plus each of this repository's Python-based backends (a folder with model.py)."""
    stub = dist.stub(running_python_version())
    if not stub.is_file():
        raise LauncherError(
            f"nvidia-pytriton ships no Python backend stub for Python {running_python_version()} "
            f"(looked for {stub}); use Python 3.8 to 3.13"
        )
    python_dir = dest / "python"
    shutil.copytree(dist.python_backend, python_dir, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(stub, python_dir / "triton_python_backend_stub")
    for backend in sorted(repo_backends.iterdir()):
        if (backend / "model.py").is_file():
            # A link, so that edits to the repository's backend take effect on the next start.
            (dest / backend.name).symlink_to(backend.resolve(), target_is_directory=True)
    return dest


def server_environment(dist: TritonDist, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for tritonserver and the Python backend stubs it starts.

    The stub links `libpython3.11.so.1.0` by name. The running interpreter's LIBDIR goes first on
    LD_LIBRARY_PATH so the loader takes that copy and not the system's (an older 3.11 whose
    missing symbols break any model that imports ssl). The interpreter's bin directory goes first on
    PATH because the embedded interpreter finds its prefix, and so this environment's site-packages,
    from the `python3` it sees there.
    """
    env = dict(os.environ if base is None else base)
    libdir = sysconfig.get_config_var("LIBDIR")
    lib_paths = [p for p in (libdir, str(dist.libs)) if p]
    if env.get("LD_LIBRARY_PATH"):
        lib_paths.append(env["LD_LIBRARY_PATH"])
    env["LD_LIBRARY_PATH"] = os.pathsep.join(lib_paths)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env

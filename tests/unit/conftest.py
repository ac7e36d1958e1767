"""Loads the Triton edges (model.py) with the fake `triton_python_backend_utils`, the way the Python
backend stub does: the model's own folder on sys.path, the module imported by file."""
import importlib.util
import sys
from pathlib import Path

import pytest

from tests.fixtures import fake_pb_utils

REPO = Path(__file__).resolve().parents[2]


def load_model_module(folder: Path, module_name: str):
    sys.modules["triton_python_backend_utils"] = fake_pb_utils
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    spec = importlib.util.spec_from_file_location(module_name, folder / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def pb_utils():
    return fake_pb_utils

"""Tensor names, dtypes and shapes of the served models, read from their checked-in config.pbtxt.

The model repository owns these facts; the export script, the clients and the tests read them here
instead of repeating string literals.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2
from tritonclient.utils import triton_to_np_dtype

REPO_ROOT = Path(__file__).resolve().parent.parent
MODEL_REPOSITORY = REPO_ROOT / "model_repository"

@dataclass(frozen=True)
class TensorSpec:
    name: str
    config_dtype: str  # e.g. "TYPE_INT64"
    dims: tuple[int, ...]  # without the batch dimension; -1 is variable

    @property
    def numpy_dtype(self) -> type:
        return triton_to_np_dtype(self.wire_dtype)

    @property
    def wire_dtype(self) -> str:
        """The datatype string of the inference protocol ("INT64", "FP32", "BYTES")."""
        return "BYTES" if self.config_dtype == "TYPE_STRING" else self.config_dtype.removeprefix("TYPE_")


@dataclass(frozen=True)
class ModelSpec:
    name: str
    max_batch_size: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    config: model_config_pb2.ModelConfig

    def input(self, name: str) -> TensorSpec:
        return _by_name(self.inputs, name, self.name)

    def output(self, name: str) -> TensorSpec:
        return _by_name(self.outputs, name, self.name)

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.inputs)

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.outputs)


def _by_name(tensors: tuple[TensorSpec, ...], name: str, model: str) -> TensorSpec:
    for t in tensors:
        if t.name == name:
            return t
    raise KeyError(f"model {model!r} declares no tensor {name!r}; it has {[t.name for t in tensors]}")


def parse_config(text: str) -> model_config_pb2.ModelConfig:
    return text_format.Parse(text, model_config_pb2.ModelConfig())


def render_config(config: model_config_pb2.ModelConfig) -> str:
    """The whole config as text, for generated variants (never edited in place)."""
    return text_format.MessageToString(config)


def _tensor(t) -> TensorSpec:
    return TensorSpec(t.name, model_config_pb2.DataType.Name(t.data_type), tuple(int(d) for d in t.dims))


def spec_from_config(config: model_config_pb2.ModelConfig, name: str | None = None) -> ModelSpec:
    return ModelSpec(
        name=name or config.name,
        max_batch_size=config.max_batch_size,
        inputs=tuple(_tensor(t) for t in config.input),
        outputs=tuple(_tensor(t) for t in config.output),
        config=config,
    )


@lru_cache(maxsize=None)
def load_spec(model: str, repository: Path = MODEL_REPOSITORY) -> ModelSpec:
    path = Path(repository) / model / "config.pbtxt"
    if not path.is_file():
        raise FileNotFoundError(f"no config for model {model!r}: {path} does not exist")
    return spec_from_config(parse_config(path.read_text()), name=model)

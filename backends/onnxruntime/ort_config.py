"""The model configuration as Triton hands it to a backend (JSON), parsed once into frozen
dataclasses with the fields that Triton's native ONNX Runtime backend honours."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# Triton config data types and their numpy and ONNX counterparts.
NUMPY_DTYPES = {
    "TYPE_BOOL": np.bool_,
    "TYPE_UINT8": np.uint8,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}
ONNX_TYPES = {
    "TYPE_BOOL": "tensor(bool)",
    "TYPE_UINT8": "tensor(uint8)",
    "TYPE_INT8": "tensor(int8)",
    "TYPE_INT16": "tensor(int16)",
    "TYPE_INT32": "tensor(int32)",
    "TYPE_INT64": "tensor(int64)",
    "TYPE_FP16": "tensor(float16)",
    "TYPE_FP32": "tensor(float)",
    "TYPE_FP64": "tensor(double)",
    "TYPE_STRING": "tensor(string)",
}

# Parameter keys that Triton's native ONNX Runtime backend reads for its thread pools.
INTRA_OP_THREADS_KEY = "intra_op_thread_count"
INTER_OP_THREADS_KEY = "inter_op_thread_count"


class ConfigError(ValueError):
    """The model configuration cannot be served; the message names the field."""


@dataclass(frozen=True)
class TensorConfig:
    name: str
    data_type: str  # "TYPE_INT64", ...
    dims: tuple[int, ...]  # without the batch dimension; -1 is variable
    allow_ragged_batch: bool = False

    @property
    def numpy_dtype(self) -> type:
        return NUMPY_DTYPES[self.data_type]

    @property
    def onnx_type(self) -> str:
        return ONNX_TYPES[self.data_type]


@dataclass(frozen=True)
class Accelerator:
    name: str  # "tensorrt", "cuda", "openvino", ...
    parameters: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class OrtModelConfig:
    name: str
    max_batch_size: int
    inputs: tuple[TensorConfig, ...]
    outputs: tuple[TensorConfig, ...]
    model_filename: str = "model.onnx"
    intra_op_threads: int = 0  # 0: ONNX Runtime's default (one per physical core)
    inter_op_threads: int = 0
    gpu_accelerators: tuple[Accelerator, ...] = ()
    cpu_accelerators: tuple[Accelerator, ...] = ()

    @property
    def is_batching(self) -> bool:
        return self.max_batch_size > 0

    def model_path(self, model_dir: str | Path, version: str) -> Path:
        return Path(model_dir) / str(version) / self.model_filename


def _data_type(raw: str, where: str) -> str:
    if raw not in NUMPY_DTYPES:
        raise ConfigError(f"{where}.data_type {raw!r} is not supported; use one of {sorted(NUMPY_DTYPES)}")
    return raw


def _tensor(raw: dict, where: str) -> TensorConfig:
    name = raw.get("name")
    if not name:
        raise ConfigError(f"{where} has no name")
    dims = tuple(int(d) for d in raw.get("dims", []))
    if not dims and "reshape" not in raw:
        raise ConfigError(f"{where} ({name!r}).dims is empty")
    if any(d == 0 or d < -1 for d in dims):
        raise ConfigError(f"{where} ({name!r}).dims {list(dims)}: each dim must be positive or -1")
    return TensorConfig(
        name=name,
        data_type=_data_type(raw.get("data_type", ""), f"{where} ({name!r})"),
        dims=dims,
        allow_ragged_batch=bool(raw.get("allow_ragged_batch", False)),
    )


def _int_parameter(parameters: dict, key: str) -> int:
    raw = parameters.get(key, {}).get("string_value", "0")
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"parameters[{key!r}] must be an integer, got {raw!r}") from None
    if value < 0:
        raise ConfigError(f"parameters[{key!r}] must be >= 0, got {value}")
    return value


def _accelerators(raw: list) -> tuple[Accelerator, ...]:
    return tuple(
        Accelerator(a.get("name", ""), tuple(sorted((a.get("parameters") or {}).items()))) for a in raw or []
    )


def parse_model_config(model_config: str | dict) -> OrtModelConfig:
    """Parse the JSON model config that Triton passes to `initialize(args)`."""
    raw = json.loads(model_config) if isinstance(model_config, str) else model_config
    max_batch_size = int(raw.get("max_batch_size", 0))
    if max_batch_size < 0:
        raise ConfigError(f"max_batch_size must be >= 0, got {max_batch_size}")
    inputs = tuple(_tensor(t, f"input[{i}]") for i, t in enumerate(raw.get("input", [])))
    outputs = tuple(_tensor(t, f"output[{i}]") for i, t in enumerate(raw.get("output", [])))
    if not inputs:
        raise ConfigError("the config declares no input")
    if not outputs:
        raise ConfigError("the config declares no output")
    parameters = raw.get("parameters") or {}
    accelerators = (raw.get("optimization") or {}).get("execution_accelerators") or {}
    return OrtModelConfig(
        name=raw.get("name", ""),
        max_batch_size=max_batch_size,
        inputs=inputs,
        outputs=outputs,
        model_filename=raw.get("default_model_filename") or "model.onnx",
        intra_op_threads=_int_parameter(parameters, INTRA_OP_THREADS_KEY),
        inter_op_threads=_int_parameter(parameters, INTER_OP_THREADS_KEY),
        gpu_accelerators=_accelerators(accelerators.get("gpu_execution_accelerator")),
        cpu_accelerators=_accelerators(accelerators.get("cpu_execution_accelerator")),
    )

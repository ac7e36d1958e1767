"""Builds the ONNX Runtime session for a model config and checks that config against the graph,
as Triton's native ONNX Runtime backend does at load time."""
from __future__ import annotations

from pathlib import Path

import onnxruntime as ort

from ort_config import ConfigError, OrtModelConfig, TensorConfig

# Triton's accelerator names and the ONNX Runtime providers they map to.
_GPU_PROVIDERS = {"tensorrt": "TensorrtExecutionProvider", "cuda": "CUDAExecutionProvider"}
_CPU_PROVIDERS = {"openvino": "OpenVINOExecutionProvider"}


def choose_providers(config: OrtModelConfig, instance_kind: str, device_id: int,
                     available: list[str] | None = None) -> list[tuple[str, dict]]:
    """Providers in priority order: the configured accelerators that this ONNX Runtime build has,
    then CUDA for a GPU instance, CPU always last. A GPU instance on a build without CUDA fails."""
    available = ort.get_available_providers() if available is None else available
    providers: list[tuple[str, dict]] = []
    if instance_kind == "GPU":
        if "CUDAExecutionProvider" not in available:
            raise ConfigError(
                "instance_group kind KIND_GPU needs onnxruntime-gpu with the CUDA execution provider; "
                f"this onnxruntime has {available}"
            )
        for acc in config.gpu_accelerators:
            provider = _GPU_PROVIDERS.get(acc.name)
            if provider is None:
                raise ConfigError(f"gpu_execution_accelerator {acc.name!r} is not supported; use {sorted(_GPU_PROVIDERS)}")
            if provider in available and provider != "CUDAExecutionProvider":
                options = {"device_id": device_id, **_tensorrt_options(acc.parameters)}
                providers.append((provider, options))
        providers.append(("CUDAExecutionProvider", {"device_id": device_id}))
    else:
        for acc in config.cpu_accelerators:
            provider = _CPU_PROVIDERS.get(acc.name)
            if provider is None:
                raise ConfigError(f"cpu_execution_accelerator {acc.name!r} is not supported; use {sorted(_CPU_PROVIDERS)}")
            if provider in available:
                providers.append((provider, {}))
    providers.append(("CPUExecutionProvider", {}))
    return providers


def _tensorrt_options(parameters: tuple[tuple[str, str], ...]) -> dict:
    # Triton's names for the TensorRT accelerator's settings and ONNX Runtime's for the same.
    names = {"precision_mode": None, "max_workspace_size_bytes": "trt_max_workspace_size",
             "trt_engine_cache_enable": "trt_engine_cache_enable", "trt_engine_cache_path": "trt_engine_cache_path"}
    options = {}
    for key, value in parameters:
        if key == "precision_mode":
            options["trt_fp16_enable"] = value.upper() == "FP16"
        elif key in names:
            options[names[key]] = value
    return options


def create_session(config: OrtModelConfig, model_path: Path, instance_kind: str = "CPU",
                   device_id: int = 0) -> ort.InferenceSession:
    if not Path(model_path).is_file():
        raise ConfigError(f"model file {model_path} does not exist")
    options = ort.SessionOptions()
    options.intra_op_num_threads = config.intra_op_threads
    options.inter_op_num_threads = config.inter_op_threads
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    providers = choose_providers(config, instance_kind, device_id)
    session = ort.InferenceSession(str(model_path), sess_options=options, providers=providers)
    check_against_graph(config, session)
    return session


def check_against_graph(config: OrtModelConfig, session: ort.InferenceSession) -> None:
    """Every config tensor must exist in the graph with the same type and a compatible shape, and
    every graph input must be in the config."""
    graph_inputs = {i.name: i for i in session.get_inputs()}
    graph_outputs = {o.name: o for o in session.get_outputs()}
    for spec in config.inputs:
        _check_tensor(config, spec, graph_inputs, "input")
    for spec in config.outputs:
        _check_tensor(config, spec, graph_outputs, "output")
    missing = sorted(set(graph_inputs) - {t.name for t in config.inputs})
    if missing:
        raise ConfigError(f"the ONNX graph needs input(s) {missing} that the config does not declare")


def _check_tensor(config: OrtModelConfig, spec: TensorConfig, graph: dict, kind: str) -> None:
    node = graph.get(spec.name)
    if node is None:
        raise ConfigError(f"config {kind} {spec.name!r} is not in the ONNX graph, which has {sorted(graph)}")
    if node.type != spec.onnx_type:
        raise ConfigError(f"config {kind} {spec.name!r} is {spec.data_type} but the ONNX graph has {node.type}")
    shape = list(node.shape)
    if config.is_batching:
        if not shape:
            raise ConfigError(f"config {kind} {spec.name!r}: the ONNX tensor has no batch dimension")
        if isinstance(shape[0], int) and shape[0] > 0:
            raise ConfigError(
                f"max_batch_size is {config.max_batch_size} but ONNX {kind} {spec.name!r} has a fixed "
                f"batch dimension {shape[0]}; export it with a dynamic batch axis or set max_batch_size: 0"
            )
        shape = shape[1:]
    expected = list(spec.dims)
    fixed_mismatch = any(isinstance(g, int) and g > 0 and d != -1 and g != d for g, d in zip(shape, expected))
    if len(shape) != len(expected) or fixed_mismatch:
        raise ConfigError(
            f"config {kind} {spec.name!r} has dims {expected} but the ONNX graph has {shape}"
            + (" after the batch dimension" if config.is_batching else "")
        )

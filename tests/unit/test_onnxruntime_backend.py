"""The Python-based ONNX Runtime backend: config parsing, checks against the graph, and a dynamic
batch run through model.py with the fake pb_utils and a real ONNX Runtime session."""
import json

import numpy as np
import pytest

from tests.fixtures.tiny_onnx import DIM, INPUTS, OUTPUT, expected_embedding, make_token_sum_model
from tests.unit.conftest import REPO, load_model_module

BACKEND_DIR = REPO / "backends" / "onnxruntime"


def model_config(max_batch_size=8, ragged=True, output_dims=(DIM,), parameters=None, **extra):
    dims = [-1] if max_batch_size else [-1, -1]
    config = {
        "name": "tiny",
        "max_batch_size": max_batch_size,
        "input": [
            {"name": n, "data_type": "TYPE_INT64", "dims": dims, "allow_ragged_batch": ragged} for n in INPUTS
        ],
        "output": [{"name": OUTPUT, "data_type": "TYPE_FP32", "dims": list(output_dims)}],
        "parameters": parameters or {},
    }
    config.update(extra)
    return config


@pytest.fixture(scope="module", autouse=True)
def backend():
    return load_model_module(BACKEND_DIR, "ort_backend_model")


@pytest.fixture
def model_dir(tmp_path):
    make_token_sum_model(tmp_path / "1" / "model.onnx")
    return tmp_path


def start(backend, model_dir, config):
    model = backend.TritonPythonModel()
    model.initialize({
        "model_config": json.dumps(config),
        "model_repository": str(model_dir),
        "model_version": "1",
        "model_instance_kind": "CPU",
        "model_instance_device_id": "0",
    })
    return model


def request(pb_utils, ids, mask=None, types=None, **overrides):
    ids = np.asarray(ids, dtype=np.int64)
    arrays = {
        "input_ids": ids,
        "attention_mask": np.ones_like(ids) if mask is None else np.asarray(mask, dtype=np.int64),
        "token_type_ids": np.zeros_like(ids) if types is None else np.asarray(types, dtype=np.int64),
    }
    arrays.update(overrides)
    return pb_utils.InferenceRequest([pb_utils.Tensor(n, a) for n, a in arrays.items() if a is not None])


def output(response):
    assert not response.has_error(), response.error().message()
    (tensor,) = response.output_tensors()
    assert tensor.name() == OUTPUT
    return tensor.as_numpy()


# --- config ---------------------------------------------------------------------------------------

def test_parse_config_reads_threads_and_accelerators():
    from ort_config import parse_model_config

    config = parse_model_config(model_config(
        parameters={"intra_op_thread_count": {"string_value": "2"}, "inter_op_thread_count": {"string_value": "1"}},
        optimization={"execution_accelerators": {"gpu_execution_accelerator": [
            {"name": "tensorrt", "parameters": {"precision_mode": "FP16"}}]}},
    ))
    assert (config.intra_op_threads, config.inter_op_threads) == (2, 1)
    assert config.gpu_accelerators[0].name == "tensorrt"
    assert config.inputs[0].allow_ragged_batch and config.is_batching


@pytest.mark.parametrize("change, message", [
    ({"max_batch_size": -1}, "max_batch_size"),
    ({"input": []}, "no input"),
    ({"parameters": {"intra_op_thread_count": {"string_value": "two"}}}, "intra_op_thread_count"),
    ({"parameters": {"inter_op_thread_count": {"string_value": "-3"}}}, "inter_op_thread_count"),
    ({"output": [{"name": OUTPUT, "data_type": "TYPE_COMPLEX", "dims": [3]}]}, "data_type"),
])
def test_parse_config_names_the_bad_field(change, message):
    from ort_config import ConfigError, parse_model_config

    with pytest.raises(ConfigError, match=message):
        parse_model_config({**model_config(), **change})


def test_providers_cpu_by_default_and_gpu_needs_cuda():
    from ort_config import ConfigError, parse_model_config
    from ort_session import choose_providers

    config = parse_model_config(model_config(optimization={"execution_accelerators": {
        "gpu_execution_accelerator": [{"name": "tensorrt"}]}}))
    assert [p for p, _ in choose_providers(config, "CPU", 0, ["CPUExecutionProvider"])] == ["CPUExecutionProvider"]
    gpu = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
    names = [p for p, _ in choose_providers(config, "GPU", 1, gpu)]
    assert names == gpu
    with pytest.raises(ConfigError, match="CUDA"):
        choose_providers(config, "GPU", 0, ["CPUExecutionProvider"])


@pytest.mark.parametrize("change, message", [
    ({"input": [{"name": "ids", "data_type": "TYPE_INT64", "dims": [-1]}]}, "not in the ONNX graph"),
    ({"output": [{"name": OUTPUT, "data_type": "TYPE_FP16", "dims": [DIM]}]}, "TYPE_FP16"),
    ({"output": [{"name": OUTPUT, "data_type": "TYPE_FP32", "dims": [DIM + 1]}]}, "dims"),
    ({"input": [{"name": "input_ids", "data_type": "TYPE_INT64", "dims": [-1]}]}, "does not declare"),
])
def test_config_is_checked_against_the_graph(backend, model_dir, change, message):
    from ort_config import ConfigError

    with pytest.raises(ConfigError, match=message):
        start(backend, model_dir, {**model_config(), **change})


def test_fixed_batch_graph_refuses_batching_config(backend, tmp_path):
    from ort_config import ConfigError

    make_token_sum_model(tmp_path / "1" / "model.onnx", fixed_batch=1)
    with pytest.raises(ConfigError, match="fixed batch dimension"):
        start(backend, tmp_path, model_config())


# --- execution ------------------------------------------------------------------------------------

def test_one_batch_runs_once_and_is_split_back(backend, model_dir, pb_utils, monkeypatch):
    model = start(backend, model_dir, model_config())
    calls = []
    run = model.session.run
    monkeypatch.setattr(model.session, "run", lambda names, feed: calls.append(feed) or run(names, feed),
                        raising=False)
    reqs = [
        request(pb_utils, [[5, 6, 7]]),                         # length 3
        request(pb_utils, [[1, 2], [3, 4]], types=[[0, 1], [1, 1]]),  # length 2, batch 2
        request(pb_utils, [[9, 9, 9, 9, 9]], mask=[[1, 1, 1, 0, 0]]),  # length 5, padded by the caller
    ]
    responses = model.execute(reqs)
    assert len(calls) == 1, "the dynamic batch must be one ONNX Runtime call"
    assert calls[0]["input_ids"].shape == (4, 5), "padded to the batch's longest"
    assert calls[0]["attention_mask"][1:3, 2:].sum() == 0, "padding is masked out"
    np.testing.assert_array_equal(output(responses[0]), [[18, 3, 0]])
    np.testing.assert_array_equal(output(responses[1]), [[3, 2, 1], [7, 2, 2]])
    np.testing.assert_array_equal(output(responses[2]), [[27, 3, 0]])


def test_batched_equals_alone(backend, model_dir, pb_utils):
    model = start(backend, model_dir, model_config())
    rng = np.random.default_rng(0)
    reqs = []
    for length in (1, 4, 7, 2):
        ids = rng.integers(1, 1000, size=(1, length))
        reqs.append(request(pb_utils, ids))
    together = [output(r) for r in model.execute(reqs)]
    alone = [output(model.execute([r])[0]) for r in reqs]
    for t, a, r in zip(together, alone, reqs):
        np.testing.assert_allclose(t, a, rtol=0, atol=1e-6)
        ids = r.inputs()[0].as_numpy()
        np.testing.assert_allclose(t, expected_embedding(ids, np.ones_like(ids), np.zeros_like(ids)))


@pytest.mark.parametrize("make, message", [
    (lambda pb: request(pb, [[1, 2]], attention_mask=np.ones((1, 2), dtype=np.int32)), "dtype int32"),
    (lambda pb: request(pb, [1, 2]), "shape"),
    (lambda pb: request(pb, [[1, 2]], token_type_ids=None), "missing input 'token_type_ids'"),
    (lambda pb: request(pb, np.zeros((0, 4))), "empty batch"),
    (lambda pb: request(pb, np.ones((9, 2))), "above max_batch_size 8"),
    (lambda pb: request(pb, [[1, 2, 3]], mask=[[1, 1]]), "same length"),
    (lambda pb: request(pb, [[1, 2]], mask=[[1, 1], [1, 1]]), "batch size"),
    (lambda pb: request(pb, [[1, 2]], extra=np.ones((1, 2), dtype=np.int64)), "unknown input"),
])
def test_bad_request_fails_alone(backend, model_dir, pb_utils, make, message):
    model = start(backend, model_dir, model_config())
    good = request(pb_utils, [[4, 4]])
    bad = make(pb_utils)
    responses = model.execute([good, bad, good])
    assert responses[1].has_error()
    assert responses[1].error().code() == pb_utils.TritonError.INVALID_ARG
    assert message in responses[1].error().message()
    np.testing.assert_array_equal(output(responses[0]), [[8, 2, 0]])
    np.testing.assert_array_equal(output(responses[2]), [[8, 2, 0]])


def test_unbatched_model_runs_each_request_alone(backend, model_dir, pb_utils):
    model = start(backend, model_dir, model_config(max_batch_size=0, ragged=False, output_dims=(-1, DIM)))
    reqs = [request(pb_utils, [[1, 2, 3]]), request(pb_utils, [[5], [6]])]
    responses = model.execute(reqs)
    np.testing.assert_array_equal(output(responses[0]), [[6, 3, 0]])
    np.testing.assert_array_equal(output(responses[1]), [[5, 1, 0], [6, 1, 0]])

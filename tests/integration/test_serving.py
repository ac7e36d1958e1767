"""A real embedded Triton: HTTP and gRPC inference, numerics against in-process ONNX Runtime and
PyTorch, batching that Triton's dynamic batcher actually does, and the ssl trap."""
import platform
import ssl
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from clients.connection import Endpoint
from clients.health import Admin
from clients.model_spec import load_spec
from tests.integration.conftest import ONNX_MODEL, settled_delta

MINILM = load_spec("minilm")
EMBED = load_spec("embed")
TEXTS = [
    "Triton's dynamic batcher merges concurrent requests.",
    "A cat sat on the mat.",
    "Continuous batching schedules at the level of one decoding step, which keeps the batch full.",
    "short",
]


@pytest.fixture(scope="module")
def tokenizer():
    from scripts.export_onnx import default_model_dir, load_tokenizer

    return load_tokenizer(default_model_dir())


def token_batch(tokenizer, texts):
    """[batch, longest] int64 arrays padded with zeros, as a client that pads itself would send."""
    tokenizer.no_truncation()
    tokenizer.no_padding()
    encodings = tokenizer.encode_batch(texts)
    length = max(len(e.ids) for e in encodings)
    arrays = {}
    for name, field in (("input_ids", "ids"), ("attention_mask", "attention_mask"), ("token_type_ids", "type_ids")):
        out = np.zeros((len(texts), length), dtype=np.int64)
        for i, e in enumerate(encodings):
            out[i, : len(e.ids)] = getattr(e, field)
        arrays[name] = out
    assert set(arrays) == set(MINILM.input_names)
    return arrays


def infer_minilm(client_module, client, arrays):
    inputs = []
    for spec in MINILM.inputs:
        tensor = client_module.InferInput(spec.name, list(arrays[spec.name].shape), spec.wire_dtype)
        tensor.set_data_from_numpy(arrays[spec.name])
        inputs.append(tensor)
    result = client.infer(MINILM.name, inputs)
    return result.as_numpy(MINILM.outputs[0].name)


def infer_embed(client_module, client, texts):
    spec = EMBED.inputs[0]
    data = np.array([[t.encode()] for t in texts], dtype=object)
    tensor = client_module.InferInput(spec.name, list(data.shape), spec.wire_dtype)
    tensor.set_data_from_numpy(data)
    return client.infer(EMBED.name, [tensor]).as_numpy(EMBED.outputs[0].name)


@pytest.fixture(scope="module")
def http(server):
    with httpclient.InferenceServerClient(server.opts.http_url) as client:
        yield client


@pytest.fixture(scope="module")
def grpc(server):
    with grpcclient.InferenceServerClient(server.opts.grpc_url) as client:
        yield client


@pytest.fixture(scope="module")
def reference(tokenizer):
    """In-process ONNX Runtime and PyTorch embeddings of TEXTS."""
    import torch

    from scripts.export_onnx import default_model_dir, load_encoder

    arrays = token_batch(tokenizer, TEXTS)
    session = ort.InferenceSession(str(ONNX_MODEL), providers=["CPUExecutionProvider"])
    onnx_out = session.run([MINILM.outputs[0].name], arrays)[0]
    with torch.no_grad():
        torch_out = load_encoder(default_model_dir())(**{k: torch.from_numpy(v) for k, v in arrays.items()}).numpy()
    return arrays, onnx_out, torch_out


def test_server_and_models_are_ready(http, grpc):
    assert http.is_server_ready() and grpc.is_server_ready()
    for model in ("minilm", "embed", "ssl_probe"):
        assert http.is_model_ready(model) and grpc.is_model_ready(model)


def test_served_config_is_the_checked_in_one(http):
    config = http.get_model_config("minilm")
    assert config["max_batch_size"] == MINILM.max_batch_size
    batching = config["dynamic_batching"]
    expected = MINILM.config.dynamic_batching
    assert [int(s) for s in batching["preferred_batch_size"]] == list(expected.preferred_batch_size)
    assert int(batching["max_queue_delay_microseconds"]) == expected.max_queue_delay_microseconds
    assert int(batching["priority_levels"]) == 2


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_minilm_matches_onnxruntime_and_pytorch(request, protocol, reference):
    arrays, onnx_out, torch_out = reference
    module = httpclient if protocol == "http" else grpcclient
    served = infer_minilm(module, request.getfixturevalue(protocol), arrays)
    assert served.shape == (len(TEXTS), MINILM.outputs[0].dims[0])
    np.testing.assert_allclose(served, onnx_out, rtol=0, atol=1e-5)
    np.testing.assert_allclose(served, torch_out, rtol=0, atol=1e-4)
    np.testing.assert_allclose(np.linalg.norm(served, axis=1), 1.0, atol=1e-5)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_embed_text_matches_the_encoder(request, protocol, reference):
    _, onnx_out, torch_out = reference
    module = httpclient if protocol == "http" else grpcclient
    served = infer_embed(module, request.getfixturevalue(protocol), TEXTS)
    np.testing.assert_allclose(served, onnx_out, rtol=0, atol=1e-5)
    np.testing.assert_allclose(served, torch_out, rtol=0, atol=1e-4)


def test_similar_sentences_are_closer(http):
    a, b, c = infer_embed(httpclient, http, ["A man is playing guitar.", "Someone plays a guitar.",
                                             "The stock market fell sharply today."])
    assert a @ b > a @ c + 0.3


def test_concurrent_requests_are_batched(server, grpc, reference):
    """Under concurrent load the dynamic batcher forms batches larger than one, and each caller
    still gets its own row. (gRPC: its client is thread-safe; the HTTP one is gevent-based.)"""
    arrays, onnx_out, _ = reference
    one = {k: v[1:2, : int(arrays["attention_mask"][1].sum())] for k, v in arrays.items()}
    admin = Admin(Endpoint(server.opts.http_url, "http", 60))
    before = admin.statistics("minilm")
    num_requests = 128
    with ThreadPoolExecutor(32) as pool:
        results = list(pool.map(lambda _: infer_minilm(grpcclient, grpc, one), range(num_requests)))
    for r in results:
        np.testing.assert_allclose(r[0], onnx_out[1], rtol=0, atol=1e-5)
    delta = settled_delta(admin, "minilm", before, num_requests)
    admin.close()
    assert delta.inference_count == num_requests
    assert delta.execution_count < num_requests, \
        f"{delta.execution_count} executions for {num_requests} requests: nothing was batched"
    grown = delta.batch_executions
    assert any(n > 0 for size, n in grown.items() if size > 1), f"batches executed during the burst: {grown}"


def test_summary_latency_metrics_are_on(server, http):
    infer_embed(httpclient, http, ["warm the counters"])
    with urllib.request.urlopen(server.opts.metrics_url, timeout=5) as r:
        text = r.read().decode()
    assert 'nv_inference_queue_summary_us{' in text and 'quantile="0.99"' in text


def test_a_model_that_imports_ssl_runs_on_this_interpreter(http):
    data = np.array([b"version"], dtype=object)
    tensor = httpclient.InferInput("query", [1], "BYTES")
    tensor.set_data_from_numpy(data)
    python_version, openssl = http.infer("ssl_probe", [tensor]).as_numpy("answer")
    assert python_version.decode() == platform.python_version()
    assert openssl.decode() == ssl.OPENSSL_VERSION

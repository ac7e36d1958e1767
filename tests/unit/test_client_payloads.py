"""Client-side encoding: endpoints from flags and environment, generation bodies from the model's
declared inputs, SSE parsing, progress text."""
import io

import pytest

from clients.connection import Endpoint
from clients.model_spec import load_spec
from clients.payloads import Sampling, chunk_from_event, generate_body, generate_values, parse_sse
from clients.progress import Progress

GPT2 = load_spec("gpt2")


def test_endpoint_defaults_environment_and_explicit_values(monkeypatch):
    for name in ("BATCHWISE_URL", "BATCHWISE_PROTOCOL", "BATCHWISE_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)
    assert Endpoint.resolve() == Endpoint("127.0.0.1:8000", "http", 60.0)
    assert Endpoint.resolve(protocol="grpc").url == "127.0.0.1:8001"
    monkeypatch.setenv("BATCHWISE_URL", "http://10.0.0.5:9000/")
    monkeypatch.setenv("BATCHWISE_PROTOCOL", "grpc")
    monkeypatch.setenv("BATCHWISE_TIMEOUT", "2.5")
    assert Endpoint.resolve() == Endpoint("10.0.0.5:9000", "grpc", 2.5)
    assert Endpoint.resolve(url="h:1", protocol="http", timeout_s=1).url == "h:1"
    monkeypatch.setenv("BATCHWISE_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="BATCHWISE_TIMEOUT"):
        Endpoint.resolve()


@pytest.mark.parametrize("kwargs", [{"url": "nohost"}, {"protocol": "udp"}, {"timeout_s": 0}])
def test_bad_endpoints_are_refused(kwargs):
    with pytest.raises(ValueError):
        Endpoint(**({"url": "h:1"} | kwargs))


def test_generation_values_use_the_declared_inputs_and_only_the_set_fields():
    values = generate_values(GPT2, [5, 6], Sampling(max_tokens=3, top_p=0.9, stop_token_ids=(7,)), stream=True)
    assert values == {"input_ids": [5, 6], "max_tokens": [3], "top_p": [0.9], "stop_token_ids": [7], "stream": [True]}
    assert generate_body(GPT2, "hi", Sampling(max_tokens=4, ignore_eos=True), stream=False) == \
        {"text_input": "hi", "max_tokens": 4, "ignore_eos": True, "stream": False}
    with pytest.raises(KeyError, match="declares no tensor"):
        generate_values(load_spec("minilm"), "hi", Sampling(), stream=False)


def test_the_client_names_are_the_ones_the_configs_declare():
    from clients import payloads

    for model in ("gpt2", "gpt2_static"):
        spec = load_spec(model)
        assert {payloads.TEXT_INPUT, payloads.INPUT_IDS, payloads.STREAM, *payloads.LIST_INPUTS} <= set(spec.input_names)
        assert set(Sampling.__dataclass_fields__) <= set(spec.input_names)
        assert {payloads.TEXT_OUTPUT, payloads.OUTPUT_IDS, payloads.FINISH_REASON, *payloads.COUNT_OUTPUTS} == \
            set(spec.output_names)
    assert set(load_spec("minilm").input_names) == set(payloads.ENCODING_FIELDS)


def test_token_values_pad_to_the_longest_text_and_keep_sep_when_truncating():
    from clients.payloads import token_values

    values = token_values(load_spec("minilm"), ["a b c", "hello there my friend"])
    assert values["input_ids"].tolist() == [[101, 1037, 1038, 1039, 102, 0], [101, 7592, 2045, 2026, 2767, 102]]
    assert values["attention_mask"].tolist() == [[1, 1, 1, 1, 1, 0], [1] * 6]
    assert values["token_type_ids"].tolist() == [[0] * 6] * 2
    long = token_values(load_spec("minilm"), ["word " * 400], max_length=64)["input_ids"]
    assert long.shape == (1, 64) and long[0, 0] == 101 and long[0, -1] == 102


def test_sse_events_and_chunks():
    raw = [b'data: {"output_ids": 5, "text_output": "a", "finish_reason": ""}\n', b"\n",
           b'data: {"output_ids": 6, "text_output": "b", "finish_reason": "length", "num_output_tokens": 2}\n', b"\n"]
    events = list(parse_sse(raw))
    chunks = [chunk_from_event(e) for e in events]
    assert [c.token_ids for c in chunks] == [(5,), (6,)]
    assert [c.is_final for c in chunks] == [False, True]
    assert chunks[1].finish_reason == "length" and chunks[1].num_output_tokens == 2
    assert list(parse_sse(['data: {"error": "x"}'])) == [{"error": "x"}]  # no trailing blank line


def test_progress_line_counts_rate_without_the_earlier_run():
    out = io.StringIO()
    progress = Progress(100, stream=out, min_interval_s=0, already_done=40)
    progress.start -= 10  # ten seconds ago
    progress.update(20, errors=1)
    line = out.getvalue().strip().splitlines()[-1]
    assert line.startswith("60/100 records  60%") and "2.0 records/s" in line
    assert "ETA 0:00:20" in line and "1 errors" in line

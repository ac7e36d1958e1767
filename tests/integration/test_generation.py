"""The continuous-decoding model through the real embedded Triton: gRPC streaming, HTTP generate
and SSE, bad input, and many concurrent streams with random cancels."""
import json
import queue
import random
import re
import time
import urllib.error
import urllib.request

import pytest
import tritonclient.grpc as grpcclient

from clients.model_spec import load_spec
from clients.payloads import tensors

GPT2 = load_spec("gpt2")


def grpc_inputs(**values):
    return tensors(grpcclient, GPT2, values)


def stream(server, model="gpt2", outputs=(), **values):
    """All responses of one request over gRPC streaming, until the final one; `outputs` names the
    outputs to ask for (none: every output)."""
    results: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(server.opts.grpc_url) as client:
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        client.async_stream_infer(model, grpc_inputs(**values),
                                  outputs=[grpcclient.InferRequestedOutput(name) for name in outputs] or None)
        responses = []
        while True:
            result, error = results.get(timeout=120)
            if error is not None:
                raise error
            responses.append(result)
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
        client.stop_stream()
    return responses


def http_post(server, path, body):
    request = urllib.request.Request(f"http://{server.opts.http_url}{path}", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as r:
        return r.read().decode()


def engine_metric(server, model, name):
    with urllib.request.urlopen(server.opts.metrics_url, timeout=5) as r:
        text = r.read().decode()
    match = re.search(rf'{name}{{model="{model}"}} (\S+)', text)
    assert match, f"the metric {name} is missing"
    return float(match.group(1))


def kv_blocks_used(server, model):
    return engine_metric(server, model, "batchwise_kv_blocks_used")


PROMPT = [2023, 2003, 1037, 3231, 1997]


@pytest.mark.parametrize("model", ["gpt2", "gpt2_static"])
def test_grpc_streaming_matches_non_streaming(server, model):
    streamed = stream(server, model, input_ids=PROMPT, max_tokens=[8], ignore_eos=[True], stream=[True])
    assert len(streamed) == 8
    tokens = [int(r.as_numpy("output_ids")[0]) for r in streamed]
    assert streamed[-1].as_numpy("finish_reason")[0] == b"length"
    (whole,) = stream(server, model, input_ids=PROMPT, max_tokens=[8], ignore_eos=[True])
    assert whole.as_numpy("output_ids").tolist() == tokens
    text = "".join(r.as_numpy("text_output")[0].decode() for r in streamed)
    assert text == whole.as_numpy("text_output")[0].decode()


def test_a_client_of_token_ids_gets_the_same_tokens_and_no_text(server):
    values = dict(input_ids=PROMPT, max_tokens=[6], ignore_eos=[True], stream=[True])
    ids_only = stream(server, outputs=["output_ids", "finish_reason"], **values)
    every = stream(server, **values)
    assert [r.as_numpy("output_ids").tolist() for r in ids_only] == [r.as_numpy("output_ids").tolist() for r in every]
    assert all(r.as_numpy("text_output") is None for r in ids_only)
    assert ids_only[-1].as_numpy("finish_reason")[0] == b"length"
    assert every[-1].as_numpy("text_output") is not None


def test_http_generate_and_sse(server):
    whole = json.loads(http_post(server, "/v2/models/gpt2/generate",
                                 {"input_ids": PROMPT, "max_tokens": 6, "ignore_eos": True}))
    assert whole["finish_reason"] == "length" and whole["num_output_tokens"] == 6
    raw = http_post(server, "/v2/models/gpt2/generate_stream",
                    {"input_ids": PROMPT, "max_tokens": 6, "ignore_eos": True, "stream": True})
    events = [json.loads(line[len("data: "):]) for line in raw.splitlines() if line.startswith("data: ")]
    assert len(events) == 6
    assert [e["output_ids"] for e in events] == whole["output_ids"]
    assert events[-1]["finish_reason"] == "length"


def test_text_in_text_out(server):
    out = json.loads(http_post(server, "/v2/models/gpt2/generate",
                               {"text_input": "the cat is", "max_tokens": 4, "ignore_eos": True}))
    assert out["num_input_tokens"] == 3 and isinstance(out["text_output"], str) and out["text_output"]


@pytest.mark.parametrize("body, field", [
    ({"input_ids": [1, 2], "max_tokens": -1}, "max_tokens"),
    ({"input_ids": [1, 99999999]}, "input_ids"),
    ({"input_ids": [1, 2], "top_p": 0.0}, "top_p"),
    ({"text_input": ""}, "text_input"),
    ({"input_ids": list(range(1, 1100))}, "prompt"),
])
def test_bad_generation_input_is_refused_and_the_engine_carries_on(server, body, field):
    with pytest.raises(urllib.error.HTTPError) as caught:
        http_post(server, "/v2/models/gpt2/generate", body)
    assert caught.value.code == 400
    assert field in caught.value.read().decode()
    ok = json.loads(http_post(server, "/v2/models/gpt2/generate", {"input_ids": PROMPT, "max_tokens": 2}))
    assert ok["num_output_tokens"] >= 1


def test_many_streams_with_random_cancels_leave_no_kv_blocks(server):
    """100 concurrent streams; a third are cancelled mid-stream by stopping their stream. Every other
    request ends with exactly one final response, the cancelled ones stop generating, every KV block
    is free at the end, and the server still answers correctly."""
    rng = random.Random(0)
    generated_before = engine_metric(server, "gpt2", "batchwise_generated_tokens_total")
    clients, finals, max_tokens = [], queue.Queue(), []
    for i in range(100):
        client = grpcclient.InferenceServerClient(server.opts.grpc_url)

        def callback(result, error, i=i):
            if error is not None or result.get_response().parameters["triton_final_response"].bool_param:
                finals.put(i)

        client.start_stream(callback=callback)
        prompt = [rng.randrange(1000, 29000) for _ in range(rng.randint(4, 48))]
        max_tokens.append(rng.randint(48, 96))
        client.async_stream_infer("gpt2", grpc_inputs(input_ids=prompt, max_tokens=[max_tokens[-1]],
                                                      ignore_eos=[True], stream=[True]))
        clients.append(client)
    time.sleep(1.0)
    cancelled = set(rng.sample(range(100), 33))
    for i in cancelled:
        clients[i].stop_stream(cancel_requests=True)
    final_counts: dict[int, int] = {}
    deadline = time.monotonic() + 240
    while len(set(final_counts) | cancelled) < 100 and time.monotonic() < deadline:
        try:
            i = finals.get(timeout=1)
            final_counts[i] = final_counts.get(i, 0) + 1
        except queue.Empty:
            pass
    time.sleep(0.5)  # a second final response, if any, would arrive now
    while not finals.empty():
        i = finals.get()
        final_counts[i] = final_counts.get(i, 0) + 1
    for client in clients:
        client.stop_stream()
        client.close()
    missing = set(range(100)) - cancelled - set(final_counts)
    assert not missing, f"{len(missing)} streams never finished"
    assert all(n == 1 for n in final_counts.values()), f"more than one final response: {final_counts}"
    deadline = time.monotonic() + 30
    while kv_blocks_used(server, "gpt2") > 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert kv_blocks_used(server, "gpt2") == 0
    generated = engine_metric(server, "gpt2", "batchwise_generated_tokens_total") - generated_before
    uncancelled = sum(m for i, m in enumerate(max_tokens) if i not in cancelled)
    assert uncancelled <= generated < sum(max_tokens), "cancelled requests must stop generating"
    (whole,) = stream(server, input_ids=PROMPT, max_tokens=[3], ignore_eos=[True])
    assert len(whole.as_numpy("output_ids")) == 3

"""The client toolkit against the real embedded server: every CLI command, both protocols, sync and
asyncio, streaming, cancellation, and batch jobs that survive kill -9 and a server restart."""
import asyncio
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from clients.async_generation import AsyncGenerationClient
from clients.cli import main as cli
from clients.connection import Endpoint
from clients.embeddings import AsyncEmbeddingClient, EmbeddingClient
from clients.errors import InvalidArgumentError, NotFoundError
from clients.generation import GenerationClient
from clients.health import Admin
from clients.payloads import Sampling
from scripts.serve import EmbeddedServer, options_on_free_ports
from tests.integration.conftest import copy_repository, settled_delta

REPO_ROOT = Path(__file__).resolve().parents[2]
TEXTS = [f"document {i} is about {'batching ' * (i % 7)}inference" for i in range(24)]
PROMPT = [2023, 2003, 1037, 3231, 1997]


def endpoints(server):
    return {"http": Endpoint(server.opts.http_url, "http", 60), "grpc": Endpoint(server.opts.grpc_url, "grpc", 60)}


def run_cli(*argv):
    out = io.StringIO()
    code = cli(list(argv), out=out)
    return code, out.getvalue()


def metric(server, name, model="gpt2"):
    with urllib.request.urlopen(server.opts.metrics_url, timeout=5) as r:
        match = re.search(rf'{name}{{model="{model}"}} (\S+)', r.read().decode())
    assert match, f"metric {name} missing"
    return float(match.group(1))


def test_http_grpc_sync_and_asyncio_give_the_same_embeddings(server):
    results = {}
    for protocol, endpoint in endpoints(server).items():
        for model in ("embed", "minilm"):
            with EmbeddingClient(endpoint, model=model, batch_size=5, concurrency=3) as client:
                results[(protocol, model, "sync")] = client.embed(TEXTS)

            async def run():
                async with AsyncEmbeddingClient(endpoint, model=model, batch_size=7, concurrency=4) as client:
                    return await client.embed(TEXTS)
            results[(protocol, model, "asyncio")] = asyncio.run(run())
    reference = results[("http", "embed", "sync")]
    assert reference.shape == (len(TEXTS), 384)
    assert np.allclose(np.linalg.norm(reference, axis=1), 1.0, atol=1e-5)
    for key, vectors in results.items():
        # Different batch compositions change the last bits only; a wrong row would differ by far more.
        assert np.abs(vectors - reference).max() < 1e-4, key
    assert (reference @ reference.T)[0, 1:].max() < 0.9999  # rows really differ: order is checked


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_streaming_yields_the_same_tokens_as_non_streaming(server, protocol):
    client = GenerationClient(endpoints(server)[protocol])
    sampling = Sampling(max_tokens=6, ignore_eos=True)
    whole = client.generate(PROMPT, sampling)
    stream = client.stream(PROMPT, sampling)
    events = list(stream)
    streamed = stream.result()
    assert len(events) == 6 and events[-1].is_final and events[-1].finish_reason == "length"
    assert streamed.token_ids == whole.token_ids and len(whole.token_ids) == 6
    assert streamed.text == whole.text
    t = streamed.timing
    assert 0 < t.ttft_s <= t.e2e_s and len(t.itls_s) == 5 and t.tpot_s > 0
    assert all(a <= b for a, b in zip(t.token_times_s, t.token_times_s[1:]))

    async def run():
        aclient = AsyncGenerationClient(endpoints(server)[protocol])
        s = aclient.stream(PROMPT, sampling)
        tokens = [t for e in [e async for e in s] for t in e.token_ids]
        return tokens, await aclient.generate(PROMPT, sampling)
    tokens, agen = asyncio.run(run())
    assert tuple(tokens) == whole.token_ids == agen.token_ids


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bad_generation_input_raises_invalid_argument_naming_the_field(server, protocol):
    client = GenerationClient(endpoints(server)[protocol])
    for sampling, field in [(Sampling(max_tokens=-1), "max_tokens"), (Sampling(top_p=0.0), "top_p")]:
        with pytest.raises(InvalidArgumentError, match=field):
            client.generate(PROMPT, sampling)
        with pytest.raises(InvalidArgumentError, match=field):
            list(client.stream(PROMPT, sampling))


def wait_for_no_kv_blocks(server):
    deadline = time.monotonic() + 30
    while metric(server, "batchwise_kv_blocks_used") > 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    return metric(server, "batchwise_kv_blocks_used")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_leaving_a_stream_cancels_the_request_on_the_server(server, protocol):
    endpoint = endpoints(server)[protocol]
    before = metric(server, "batchwise_generated_tokens_total")
    with GenerationClient(endpoint).stream(PROMPT, Sampling(max_tokens=400, ignore_eos=True)) as stream:
        for i, _ in enumerate(stream):
            if i == 2:
                assert metric(server, "batchwise_kv_blocks_used") > 0
                break
    assert wait_for_no_kv_blocks(server) == 0

    async def cancel_a_task():
        async def consume():
            async for _ in AsyncGenerationClient(endpoint).stream(PROMPT, Sampling(max_tokens=400, ignore_eos=True)):
                pass
        task = asyncio.create_task(consume())
        while metric(server, "batchwise_kv_blocks_used") == 0:
            await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    asyncio.run(cancel_a_task())
    assert wait_for_no_kv_blocks(server) == 0
    time.sleep(0.5)
    generated = metric(server, "batchwise_generated_tokens_total") - before
    assert generated < 400, "cancelled requests must stop generating"


def test_health_models_and_statistics(server):
    admin = Admin(endpoints(server)["grpc"])
    with EmbeddingClient(endpoints(server)["grpc"], model="minilm", batch_size=4, concurrency=4) as client:
        before = admin.statistics("minilm")
        client.embed(TEXTS)
        delta = settled_delta(admin, "minilm", before, len(TEXTS))
    assert delta.inference_count == len(TEXTS) and delta.success.count == len(TEXTS) // 4
    assert sum(size * n for size, n in delta.batch_executions.items()) == len(TEXTS)
    assert delta.avg_batch_size >= 4 and delta.avg_compute_us > 0 and delta.avg_queue_us >= 0
    health = admin.health()
    assert health.live and health.ready and {"minilm", "embed", "gpt2"} <= {m.name for m in health.models}
    assert admin.model_spec("minilm").max_batch_size > 0
    with pytest.raises(NotFoundError):
        admin.statistics("no_such_model")
    admin.close()


def test_every_cli_command(server, tmp_path):
    http = ["--url", server.opts.http_url]
    grpc = ["--url", server.opts.grpc_url, "--protocol", "grpc"]
    code, out = run_cli("health", *http)
    assert code == 0 and "ready" in out and "minilm" in out
    code, out = run_cli("models", *grpc)
    assert code == 0 and re.search(r"minilm\s+READY\s+onnxruntime\s+dynamic", out) and "continuous" in out
    code, out = run_cli("embed", "hello world", "a second text", *grpc)
    assert code == 0 and out.count("dim 384, norm 1.000") == 2
    texts = tmp_path / "texts.txt"
    texts.write_text("one\ntwo\n\nthree\n")
    code, out = run_cli("embed", "--input", str(texts), "--json", "--model", "minilm", *http)
    assert code == 0 and [json.loads(l)["text"] for l in out.splitlines()] == ["one", "two", "three"]
    # after the embeds above, so that minilm has batches to show even when this test runs alone
    code, out = run_cli("stats", "minilm", *http)
    assert code == 0 and "average batch" in out and "batch size" in out
    code, out = run_cli("generate", "the cat", "--max-tokens", "4", "--ignore-eos", "--stream", *grpc)
    assert code == 0 and out.strip()
    records = tmp_path / "in.jsonl"
    records.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(TEXTS[:10])))
    output = tmp_path / "out.jsonl"
    code, out = run_cli("batch", "--input", str(records), "--output", str(output), "--model", "minilm", *grpc)
    assert code == 0 and "10 done now" in out
    assert len(output.read_text().splitlines()) == 10


def test_cli_exit_codes_and_one_line_reasons(server, tmp_path):
    env = os.environ | {"BATCHWISE_URL": server.opts.http_url, "PYTHONPATH": str(REPO_ROOT)}

    def run(*argv, extra_env=None):
        return subprocess.run([sys.executable, "-m", "clients", *argv], cwd=REPO_ROOT, env=env | (extra_env or {}),
                              capture_output=True, text=True, timeout=120)
    ok = run("generate", "hello", "--max-tokens", "3", "--ignore-eos")
    assert ok.returncode == 0 and "3 tokens, finish length" in ok.stderr
    missing = run("stats", "no_such_model")
    assert missing.returncode == 1 and missing.stderr.startswith("error: NotFoundError")
    bad = run("generate", "hello", "--max-tokens", "-5")
    assert bad.returncode == 1 and "max_tokens" in bad.stderr
    down = run("health", extra_env={"BATCHWISE_URL": "127.0.0.1:9", "BATCHWISE_TIMEOUT": "2"})
    assert down.returncode == 3 and down.stderr.startswith("error:")
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"id": 1, "text": "ok"}\n{"id": 1, "text": "dup"}\nnot json\n')
    refused = run("batch", "--input", str(broken), "--output", str(tmp_path / "o.jsonl"))
    assert refused.returncode == 2 and "line 2: duplicate id '1'" in refused.stderr and "line 3" in refused.stderr
    assert not (tmp_path / "o.jsonl").exists()
    for command in ("health", "models", "stats", "embed", "generate", "batch"):
        helped = run(command, "--help")
        assert helped.returncode == 0 and "--url" in helped.stdout


def batch_command(input_path, output_path, url, *extra):
    return [sys.executable, "-m", "clients", "batch", "--input", str(input_path), "--output", str(output_path),
            "--model", "minilm", "--url", url, "--protocol", "grpc", *extra]


def write_records(path, n):
    texts = {f"r{i}": f"record {i}: " + " ".join(f"word{(i * 7 + k) % 50}" for k in range(3 + i % 20)) for i in range(n)}
    path.write_text("".join(json.dumps({"id": k, "text": v}) + "\n" for k, v in texts.items()))
    return texts


def check_exactly_once(output_path, texts, endpoint):
    rows = [json.loads(line) for line in output_path.read_text().splitlines()]
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)) == len(texts) and set(ids) == set(texts)
    assert not [r for r in rows if "error" in r]
    got = np.array([r["embedding"] for r in rows], dtype=np.float32)
    with EmbeddingClient(endpoint, model="minilm", batch_size=16, concurrency=2) as client:
        expected = client.embed([texts[i] for i in ids])
    assert np.abs(got - expected).max() < 1e-4  # each id carries its own text's embedding


def wait_for_lines(path, n, proc, timeout_s=120):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        if path.exists() and path.read_bytes().count(b"\n") >= n:
            return
        time.sleep(0.05)
    raise AssertionError(f"the job wrote fewer than {n} lines (exit {proc.poll()})")


def test_a_batch_job_killed_with_sigkill_resumes_to_every_id_exactly_once(server, tmp_path):
    texts = write_records(tmp_path / "in.jsonl", 400)
    output = tmp_path / "out.jsonl"
    env = os.environ | {"PYTHONPATH": str(REPO_ROOT)}
    command = batch_command(tmp_path / "in.jsonl", output, server.opts.grpc_url, "--concurrency", "8")
    job = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_for_lines(output, 60, job)
    job.send_signal(signal.SIGKILL)
    job.wait(timeout=30)
    written = output.read_bytes().count(b"\n")
    assert 60 <= written < 400
    done = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"{written} done earlier" in done.stdout
    check_exactly_once(output, texts, endpoints(server)["grpc"])


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_a_batch_job_completes_across_a_server_restart(tmp_path, protocol):
    repo = copy_repository(tmp_path / "model_repository", models=("minilm",))
    opts = options_on_free_ports(repo)
    # Enough records that the job is still running when the server has gone (at ~100 records/s).
    texts = write_records(tmp_path / "in.jsonl", 1500)
    output = tmp_path / "out.jsonl"
    env = os.environ | {"PYTHONPATH": str(REPO_ROOT)}
    url = opts.grpc_url if protocol == "grpc" else opts.http_url
    command = batch_command(tmp_path / "in.jsonl", output, url, "--concurrency", "4", "--max-unavailable", "120")
    command[command.index("--protocol") + 1] = protocol
    with EmbeddedServer(opts, log_path=tmp_path / "first.log"):
        job = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
        wait_for_lines(output, 40, job)
    # The server is down now; the job waits it out and finishes once it is back.
    time.sleep(1.0)
    assert job.poll() is None, "the job must wait for the server, not fail"
    with EmbeddedServer(opts, log_path=tmp_path / "second.log") as restarted:
        stdout, stderr = job.communicate(timeout=240)
        assert job.returncode == 0, stderr
        assert "0 errors, 0 remaining" in stdout
        check_exactly_once(output, texts, Endpoint(restarted.opts.grpc_url, "grpc", 60))

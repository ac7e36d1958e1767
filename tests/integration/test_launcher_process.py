"""The launcher as a user runs it: `scripts/serve.py` in its own process, ready message, Ctrl-C,
and clear failures for a taken port and a repository that Triton refuses."""
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scripts.serve import EmbeddedServer, port_in_use
from scripts.triton_dist import LauncherError
from scripts.serve import free_ports, options_on_free_ports
from tests.integration.conftest import copy_repository

EMBEDDING_MODELS = ("minilm", "embed")  # enough to start; the decoders only add load time
SERVE = Path(__file__).resolve().parents[2] / "scripts" / "serve.py"


def start_serve(repository, ports):
    http, grpc, metrics = ports
    return subprocess.Popen(
        [sys.executable, str(SERVE), "--model-repository", str(repository), "--http-port", str(http),
         "--grpc-port", str(grpc), "--metrics-port", str(metrics)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def read_until(proc, marker, timeout_s=120):
    lines = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if marker in line:
            return "".join(lines)
    raise AssertionError(f"{marker!r} not seen; output:\n{''.join(lines)}")


@pytest.fixture
def serve_process():
    procs = []
    yield procs
    for p in procs:
        if p.poll() is None:  # SIGTERM first: serve.py then stops its tritonserver, which a kill would orphan
            p.terminate()
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_serve_reports_ready_and_stops_cleanly_on_signal(tmp_path, serve_process, signum):
    repository = copy_repository(tmp_path / "repo", EMBEDDING_MODELS)
    ports = free_ports(3)
    proc = start_serve(repository, ports)
    serve_process.append(proc)
    out = read_until(proc, "ready:")
    assert f"HTTP 127.0.0.1:{ports[0]}" in out and f"gRPC 127.0.0.1:{ports[1]}" in out
    proc.send_signal(signum)
    rest, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, rest
    assert "stopped" in rest
    for port in ports:  # the server is gone: its ports are free again
        assert not port_in_use("127.0.0.1", port)


def test_serve_fails_clearly_when_a_port_is_taken(tmp_path):
    repository = copy_repository(tmp_path / "repo", EMBEDDING_MODELS)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        _, grpc, metrics = free_ports(3)
        result = subprocess.run(
            [sys.executable, str(SERVE), "--model-repository", str(repository), "--http-port", str(taken),
             "--grpc-port", str(grpc), "--metrics-port", str(metrics)],
            capture_output=True, text=True, timeout=60,
        )
    assert result.returncode == 1
    assert f"port {taken}" in result.stderr and "already in use" in result.stderr


def test_a_config_that_disagrees_with_the_graph_fails_with_the_reason(tmp_path):
    """Passes the launcher's own checks; Triton loads it, the backend refuses it, and the launcher
    reports the backend's reason instead of hanging."""
    repository = copy_repository(tmp_path / "repo", EMBEDDING_MODELS)
    shutil.rmtree(repository / "embed")
    config = repository / "minilm" / "config.pbtxt"
    config.write_text(config.read_text().replace("dims: [ 384 ]", "dims: [ 512 ]"))
    server = EmbeddedServer(options_on_free_ports(repository), log_path=tmp_path / "log.txt")
    with pytest.raises(LauncherError) as caught:
        server.start(ready_timeout_s=120)
    assert "exited" in str(caught.value)
    assert "[512]" in str(caught.value) and "384" in str(caught.value)
    assert server.process.poll() is not None


def group_members(pgid: int) -> list[int]:
    """Live processes in a process group (zombies excluded), read from /proc."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":  # fields: state, ppid, pgrp, ...
            members.append(int(stat.parent.name))
    return members


def test_stop_ends_whatever_is_left_of_a_server_that_died(tmp_path):
    """A tritonserver that crashes while giving up on its exit timeout ("Exiting immediately", then
    signal 11, with inferences in flight) has been seen to leave its Python backend stubs running.
    Stopping the launcher must end everything in the server's process group. A stub stopped with
    SIGSTOP stands in for a stuck one (left alone, it cannot notice that its server is gone)."""
    repo = copy_repository(tmp_path / "model_repository", models=("minilm",))
    server = EmbeddedServer(options_on_free_ports(repo), log_path=tmp_path / "server.log").start()
    pgid = server.process.pid
    try:
        stubs = [pid for pid in group_members(pgid) if pid != pgid]
        assert stubs, "the minilm instances run in backend stubs of the server's process group"
        os.kill(stubs[0], signal.SIGSTOP)
        server.process.send_signal(signal.SIGKILL)  # the server alone, as a crash would
        server.process.wait(timeout=30)
    finally:
        server.stop()
    deadline = time.monotonic() + 10
    while group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert group_members(pgid) == []

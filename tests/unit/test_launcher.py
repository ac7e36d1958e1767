"""The embedded launcher without a server: arguments, ports, the repository check, the backend
directory it lays out and the environment it gives tritonserver."""
import shutil
import socket
import sys
import sysconfig
from pathlib import Path

import pytest

from scripts import serve
from scripts.repository_check import check_model_repository
from scripts.triton_dist import LauncherError, assemble_backend_directory, find_triton, server_environment

REPO = Path(__file__).resolve().parents[2]


def test_defaults_match_the_documented_ports():
    opts = serve.options_from_args(serve.parse_args([]))
    assert (opts.http_port, opts.grpc_port, opts.metrics_port) == (8000, 8001, 8002)
    assert opts.host == "127.0.0.1"
    assert opts.model_repository == (REPO / "model_repository").resolve()


def test_command_line_flags_reach_the_server_command(tmp_path):
    args = serve.parse_args(["--http-port", "9000", "--grpc-port", "9001", "--metrics-port", "9002",
                             "--model-repository", str(tmp_path), "--", "--log-info=false"])
    opts = serve.options_from_args(args)
    cmd = serve.server_command(Path("/bin/tritonserver"), Path("/b"), opts, "p_")
    assert "--http-port=9000" in cmd and "--grpc-port=9001" in cmd and "--metrics-port=9002" in cmd
    assert f"--model-repository={tmp_path.resolve()}" in cmd
    assert "--model-control-mode=none" in cmd
    assert "--metrics-config=summary_latencies=true" in cmd
    assert "--http-address=127.0.0.1" in cmd and "--grpc-address=127.0.0.1" in cmd
    assert cmd[-1] == "--log-info=false"


def test_a_taken_port_is_named():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        grpc, metrics = serve.free_ports(2)
        opts = serve.ServerOptions(http_port=port, grpc_port=grpc, metrics_port=metrics)
        with pytest.raises(LauncherError, match=f"port {port} .*--http-port.* already in use"):
            serve.check_ports(opts)


def test_ports_must_differ():
    with pytest.raises(LauncherError, match="must differ"):
        serve.check_ports(serve.ServerOptions(http_port=9100, grpc_port=9100, metrics_port=9102))


@pytest.fixture
def repo_copy(tmp_path):
    repo = tmp_path / "repo"
    for model in ("minilm", "embed"):
        shutil.copytree(REPO / "model_repository" / model, repo / model,
                        ignore=shutil.ignore_patterns("*.onnx", "tokenizer.json", "__pycache__"))
    (repo / "minilm" / "1" / "model.onnx").write_bytes(b"stand-in")
    return repo


def test_repository_check_accepts_the_shipped_layout(repo_copy):
    assert check_model_repository(repo_copy) == ["embed", "minilm"]


@pytest.mark.parametrize("breakage, message", [
    (lambda r: (r / "minilm" / "1" / "model.onnx").unlink(), r"model\.onnx is missing: run `make export`"),
    (lambda r: (r / "embed" / "config.pbtxt").write_text("max_batch_size: [oops"), "not a valid model config"),
    (lambda r: (r / "embed" / "config.pbtxt").unlink(), "has no config.pbtxt"),
    (lambda r: (r / "minilm" / "config.pbtxt").write_text('name: "other"\nbackend: "onnxruntime"'), "folder is 'minilm'"),
    (lambda r: shutil.rmtree(r / "embed" / "1"), "no version folder"),
])
def test_repository_check_names_the_problem(repo_copy, breakage, message):
    breakage(repo_copy)
    with pytest.raises(LauncherError, match=message):
        check_model_repository(repo_copy)


def test_missing_repository_is_named(tmp_path):
    with pytest.raises(LauncherError, match="does not exist"):
        check_model_repository(tmp_path / "nowhere")


def test_backend_directory_has_python_backend_stub_and_repo_backends(tmp_path):
    dist = find_triton()
    dest = assemble_backend_directory(dist, tmp_path / "backends")
    assert (dest / "python" / "libtriton_python.so").is_file()
    assert (dest / "python" / "triton_python_backend_stub").is_file()
    assert (dest / "onnxruntime" / "model.py").is_file()
    assert (dest / "onnxruntime").resolve() == (REPO / "backends" / "onnxruntime").resolve()


def test_environment_puts_this_interpreters_libpython_first():
    dist = find_triton()
    env = server_environment(dist, {"LD_LIBRARY_PATH": "/elsewhere", "PATH": "/usr/bin"})
    paths = env["LD_LIBRARY_PATH"].split(":")
    assert paths[0] == sysconfig.get_config_var("LIBDIR")
    assert paths[-1] == "/elsewhere"
    assert env["PATH"].split(":")[0] == str(Path(sys.executable).parent)

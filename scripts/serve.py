"""The embedded launcher: the real tritonserver that nvidia-pytriton ships, on 127.0.0.1, serving
this repository's model repository with this repository's Python-based backends.

    python scripts/serve.py [--http-port 8000] [--grpc-port 8001] [--metrics-port 8002]
                            [--model-repository model_repository]
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

if __package__ in (None, ""):  # run as a file: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scripts.repository_check import check_model_repository
from scripts.triton_dist import (
    REPO_ROOT,
    LauncherError,
    assemble_backend_directory,
    find_triton,
    server_environment,
)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_HTTP_PORT = 8000
DEFAULT_GRPC_PORT = 8001
DEFAULT_METRICS_PORT = 8002
DEFAULT_MODEL_REPOSITORY = REPO_ROOT / "model_repository"
DEFAULT_READY_TIMEOUT_S = 120.0
_LOG_TAIL_LINES = 40


@dataclass(frozen=True)
class ServerOptions:
    model_repository: Path = DEFAULT_MODEL_REPOSITORY
    host: str = DEFAULT_HOST
    http_port: int = DEFAULT_HTTP_PORT
    grpc_port: int = DEFAULT_GRPC_PORT
    metrics_port: int = DEFAULT_METRICS_PORT
    log_verbose: int = 0
    extra_args: tuple[str, ...] = field(default_factory=tuple)

    @property
    def ports(self) -> dict[str, int]:
        return {"--http-port": self.http_port, "--grpc-port": self.grpc_port, "--metrics-port": self.metrics_port}

    @property
    def http_url(self) -> str:
        return f"{self.host}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}/metrics"


def server_command(binary: Path, backend_dir: Path, opts: ServerOptions, shm_prefix: str) -> list[str]:
    return [
        str(binary),
        f"--model-repository={opts.model_repository}",
        f"--backend-directory={backend_dir}",
        # Models are loaded once at start; the repository API cannot load or unload anything.
        "--model-control-mode=none",
        f"--http-address={opts.host}",
        f"--grpc-address={opts.host}",
        f"--metrics-address={opts.host}",
        f"--http-port={opts.http_port}",
        f"--grpc-port={opts.grpc_port}",
        f"--metrics-port={opts.metrics_port}",
        "--allow-metrics=true",
        "--allow-gpu-metrics=false",
        # Summaries give p50/p90/p99 of queue and compute time per model, beside the counters.
        "--metrics-config=summary_latencies=true",
        "--strict-readiness=true",
        "--exit-on-error=true",
        "--exit-timeout-secs=10",
        # A prefix of its own, so that two servers on one machine never share a shared-memory region.
        f"--backend-config=python,shm-region-prefix-name={shm_prefix}",
        f"--log-verbose={opts.log_verbose}",
        *opts.extra_args,
    ]


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def free_port(host: str = DEFAULT_HOST) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def free_ports(count: int, host: str = DEFAULT_HOST) -> list[int]:
    """`count` distinct ports that are free now (a later bind may still lose a race)."""
    ports: list[int] = []
    while len(ports) < count:
        if (port := free_port(host)) not in ports:
            ports.append(port)
    return ports


def options_on_free_ports(model_repository: Path, host: str = DEFAULT_HOST) -> ServerOptions:
    http, grpc, metrics = free_ports(3, host)
    return ServerOptions(model_repository=Path(model_repository), host=host, http_port=http, grpc_port=grpc,
                         metrics_port=metrics)


def check_ports(opts: ServerOptions) -> None:
    ports = list(opts.ports.values())
    if len(set(ports)) != len(ports):
        raise LauncherError(f"the HTTP, gRPC and metrics ports must differ, got {opts.ports}")
    for flag, port in opts.ports.items():
        if not 0 < port < 65536:
            raise LauncherError(f"{flag} {port} is not a valid port (1-65535)")
        if port_in_use(opts.host, port):
            raise LauncherError(
                f"port {port} on {opts.host} ({flag}) is already in use: stop what holds it "
                f"(`ss -ltnp 'sport = :{port}'` shows it) or choose another with {flag}"
            )


class EmbeddedServer:
    """One tritonserver process and the temporary backend directory it runs with.

    Owned by the thread that created it; use as a context manager so the process always stops.
    """

    def __init__(self, opts: ServerOptions, log_path: Path | None = None):
        self.opts = opts
        self._workdir: Path | None = None
        self._log_path = log_path
        self._owns_log = log_path is None  # a log we chose is removed after a clean run, kept otherwise
        self._was_ready = False
        self._log_file = None
        self.process: subprocess.Popen | None = None

    @property
    def log_path(self) -> Path | None:
        return self._log_path

    def start(self, ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S,
              should_stop: Callable[[], bool] | None = None) -> "EmbeddedServer":
        """Start and wait until ready; should_stop (e.g. Ctrl-C seen) abandons the wait."""
        check_ports(self.opts)
        check_model_repository(self.opts.model_repository)
        dist = find_triton()
        try:
            self._workdir = Path(tempfile.mkdtemp(prefix="batchwise-triton-"))
            backend_dir = assemble_backend_directory(dist, self._workdir / "backends")
            if self._log_path is None:
                fd, name = tempfile.mkstemp(prefix="batchwise-tritonserver-", suffix=".log")
                os.close(fd)
                self._log_path = Path(name)
            self._log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log_file = open(self._log_path, "wb")
            shm_prefix = f"batchwise_{os.getpid()}_{self.opts.http_port}_"
            cmd = server_command(dist.binary, backend_dir, self.opts, shm_prefix)
            self.process = subprocess.Popen(
                cmd,
                env=server_environment(dist),
                stdout=self._log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # signals reach it through us only, so shutdown stays orderly
            )
            self.wait_ready(ready_timeout_s, should_stop)
        except BaseException:
            self.stop()
            raise
        self._was_ready = True
        return self

    def is_ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.opts.http_url}/v2/health/ready", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            return False

    def wait_ready(self, timeout_s: float, should_stop: Callable[[], bool] | None = None) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if should_stop is not None and should_stop():
                raise LauncherError("interrupted before tritonserver was ready")
            if self.process.poll() is not None:
                raise LauncherError(
                    f"tritonserver exited with code {self.process.returncode} before it was ready.\n"
                    f"{self.problem_summary()}"
                )
            if self.is_ready():
                return
            time.sleep(0.25)
        raise LauncherError(f"tritonserver was not ready after {timeout_s:.0f} s.\n{self.problem_summary()}")

    def log_text(self) -> str:
        if self._log_path is None or not self._log_path.exists():
            return ""
        return self._log_path.read_text(errors="replace")

    def problem_summary(self) -> str:
        """The log lines that say what went wrong, or the log's tail when none stands out."""
        lines = self.log_text().splitlines()
        errors = [ln for ln in lines if ln.startswith("E") or "error" in ln.lower() or "UNAVAILABLE" in ln]
        shown = errors[-_LOG_TAIL_LINES:] or lines[-_LOG_TAIL_LINES:]
        return f"log: {self._log_path}\n" + "\n".join(shown)

    def stop(self, timeout_s: float = 20.0) -> int | None:
        code = None
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                code = self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                code = self.process.wait()
        elif self.process is not None:
            code = self.process.returncode
        if self.process is not None:
            # A tritonserver that crashed or gave up on its exit timeout ("Exiting immediately") leaves
            # its Python backend stubs running; they share its process group, so end the group.
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        if self._owns_log and self._was_ready and code == 0 and self._log_path is not None:
            self._log_path.unlink(missing_ok=True)  # a clean run: nothing in it to read
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None
        return code

    def __enter__(self) -> "EmbeddedServer":
        return self.start() if self.process is None else self

    def __exit__(self, *exc) -> None:
        self.stop()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-repository", type=Path, default=DEFAULT_MODEL_REPOSITORY)
    p.add_argument("--host", default=DEFAULT_HOST, help="address to listen on (default: %(default)s)")
    p.add_argument("--http-port", type=int, default=DEFAULT_HTTP_PORT)
    p.add_argument("--grpc-port", type=int, default=DEFAULT_GRPC_PORT)
    p.add_argument("--metrics-port", type=int, default=DEFAULT_METRICS_PORT)
    p.add_argument("--log-verbose", type=int, default=0, help="tritonserver's log verbosity")
    p.add_argument("--log-file", type=Path, help="write the server log here (default: a temporary file)")
    p.add_argument("--ready-timeout", type=float, default=DEFAULT_READY_TIMEOUT_S, help="seconds")
    p.add_argument("extra", nargs="*", help="further tritonserver flags, after `--`")
    return p.parse_args(argv)


def options_from_args(args: argparse.Namespace) -> ServerOptions:
    return ServerOptions(
        model_repository=args.model_repository.resolve(),
        host=args.host,
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        log_verbose=args.log_verbose,
        extra_args=tuple(args.extra),
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    opts = options_from_args(args)
    server = EmbeddedServer(opts, log_path=args.log_file)
    stopping = []

    def on_signal(signum, _frame):
        stopping.append(signum)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    print(f"starting tritonserver on {opts.host} (model repository {opts.model_repository}) ...", flush=True)
    try:
        server.start(args.ready_timeout, should_stop=lambda: bool(stopping))
    except LauncherError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(
        f"ready: HTTP {opts.http_url}  gRPC {opts.grpc_url}  metrics {opts.metrics_url}\n"
        f"  curl http://{opts.http_url}/v2/models/minilm/config\n"
        f"  curl http://{opts.http_url}/v2/models/gpt2/generate -d '{{\"text_input\": \"hello\", \"max_tokens\": 8}}'\n"
        f"log: {server.log_path}   (Ctrl-C stops the server)",
        flush=True,
    )
    while not stopping and server.process.poll() is None:
        time.sleep(0.2)
    if not stopping:
        print(f"error: tritonserver exited with code {server.process.returncode}\n{server.problem_summary()}",
              file=sys.stderr)
        server.stop()
        return 1
    print("stopping tritonserver ...", flush=True)
    code = server.stop()
    print(f"stopped (exit code {code})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

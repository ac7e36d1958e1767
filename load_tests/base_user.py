"""The request loop and the transports that the users of users.py share: settings as class
attributes, `call()` firing exactly one request event, the closed-loop task and the hand-over to the
open-loop dispatcher; HTTP over FastHttpUser's connection pool, gRPC over one tritonclient client per
user in gRPC's gevent mode."""
from __future__ import annotations

import os
import time
from functools import lru_cache
from pathlib import Path

from geventhttpclient.url import URL
from locust import User, constant, task
from locust.contrib.fasthttp import FastHttpUser
from locust.exception import StopUser

from clients.model_spec import ModelSpec, load_spec

from . import open_loop
from .instrument import attach
from .prepared import prepared_requests

DEFAULT_HTTP_HOST = "http://127.0.0.1:8000"
DEFAULT_GRPC_HOST = "127.0.0.1:8001"


class RequestFailed(Exception):
    """The server answered, but not with a successful result."""


class LoadUser(User):
    """Settings and the request loop of every user in users.py."""

    abstract = True
    wait_time = constant(0)
    kind = "embed"  # which workload records the user sends
    request_type = ""
    model = "embed"
    spec: ModelSpec | None = None  # default: the checked-in config of `model`
    workload: str | Path | object | None = None
    workload_order = "round-robin"
    workload_seed = 0
    priority = 0
    timeout_s = 60.0
    arrival_rate = 0.0
    arrival_distribution = "poisson"
    arrival_cv = 1.0
    arrival_seed = 0
    arrival_window_s: float | None = 0.0  # 0: unpinned; > 0 or None (auto): pinned, see arrivals.py
    late_threshold_ms = 10.0

    def on_start(self) -> None:
        attach(self.environment)
        if self.arrival_rate > 0:
            open_loop.dispatcher_for(self)  # a bad open-loop setting fails here, once per user
        self._requests = prepared_requests(self)

    @task
    def send_next(self) -> None:
        if self.arrival_rate > 0:
            open_loop.dispatcher_for(self).serve(self)
            raise StopUser()  # the schedule has ended: the test is stopping
        self.call()

    def model_spec(self) -> ModelSpec:
        return self.spec or load_spec(self.model)

    def call(self, scheduled_at: float | None = None) -> None:
        started = time.perf_counter()
        t0 = started if scheduled_at is None else scheduled_at
        context = {} if scheduled_at is None else {"scheduled_at": scheduled_at, "late_ms": (started - t0) * 1e3}
        length, exception = 0, None
        try:
            length = self.send(self._requests.next(), t0, context)
        except Exception as e:  # any failure of this request is its result, reported once below
            exception = e
        self.environment.events.request.fire(
            request_type=self.request_type, name=self.model, response_time=(time.perf_counter() - t0) * 1e3,
            response_length=length, exception=exception, context=context)

    def prepare(self, record):
        """The request for one workload record, built once per process."""
        raise NotImplementedError

    def send(self, request, t0: float, context: dict) -> int:
        """Send one prepared request; return the response's length in bytes, raise on failure."""
        raise NotImplementedError


class HttpLoadUser(LoadUser, FastHttpUser):
    abstract = True
    host = DEFAULT_HTTP_HOST
    request_type = "http"

    def __init__(self, environment):
        self.network_timeout = self.connection_timeout = self.timeout_s
        super().__init__(environment)

    def on_start(self) -> None:
        super().on_start()
        # FastHttpUser's own connection pool, without its per-request event (call() fires ours)
        self._http = self.client.client.clientpool.get_client(URL(self.host))

    def post(self, path: str, body: bytes, headers: dict):
        response = self._http.request("POST", path, body=body, headers=headers)
        if response.status_code != 200:
            raise RequestFailed(f"HTTP {response.status_code}: {response.read()[:300].decode(errors='replace')}")
        return response


def grpc_target(host: str | None) -> str:
    host = host or DEFAULT_GRPC_HOST
    for scheme in ("grpc://", "http://", "https://"):
        host = host.removeprefix(scheme)
    return host.rstrip("/")


_gevent_grpc_pid: int | None = None


@lru_cache(maxsize=1)
def _client_class():
    import tritonclient.grpc as grpcclient

    class Client(grpcclient.InferenceServerClient):
        """Closes its channel once, and never from __del__: in gRPC's gevent mode a channel closed
        a second time, or while the interpreter shuts down, can hang the process at exit."""

        _is_closed = False

        def close(self):
            if not self._is_closed:
                self._is_closed = True
                super().close()

        def __del__(self):
            pass

    return Client


def grpc_client(host: str | None):
    """A tritonclient.grpc client for this greenlet world: gRPC's gevent mode is switched on once per
    process (after any fork of `--processes`), before the first channel. Close it in on_stop."""
    global _gevent_grpc_pid
    if _gevent_grpc_pid != os.getpid():
        import grpc.experimental.gevent as grpc_gevent

        grpc_gevent.init_gevent()
        _gevent_grpc_pid = os.getpid()
    return _client_class()(grpc_target(host))


class GrpcLoadUser(LoadUser):
    abstract = True
    host = DEFAULT_GRPC_HOST

    def on_start(self) -> None:
        super().on_start()
        self._client = grpc_client(self.host)

    def on_stop(self) -> None:
        # Locust calls on_stop also for a user stopped before on_start got as far as its client.
        if (client := getattr(self, "_client", None)) is not None:
            client.close()


def configured(cls: type[LoadUser], name: str | None = None, **settings) -> type[LoadUser]:
    """A subclass of `cls` with other settings, e.g. configured(EmbedHttpUser, model="minilm",
    arrival_rate=50). Unknown settings are refused."""
    unknown = sorted(k for k in settings if not hasattr(cls, k))
    if unknown:
        raise AttributeError(f"{cls.__name__} has no setting(s) {unknown}")
    return type(name or cls.__name__, (cls,), dict(settings))

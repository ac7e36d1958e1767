"""Where the server is and how to talk to it: URL, protocol and timeout, with defaults taken once from
the environment, and the tritonclient module and client for each protocol, sync or asyncio."""
from __future__ import annotations

import os
from dataclasses import dataclass

PROTOCOLS = ("http", "grpc")
DEFAULT_PORTS = {"http": 8000, "grpc": 8001}  # Triton's defaults, the embedded launcher's too
DEFAULT_HOST = "127.0.0.1"
DEFAULT_TIMEOUT_S = 60.0
ENV_URL = "BATCHWISE_URL"
ENV_PROTOCOL = "BATCHWISE_PROTOCOL"
ENV_TIMEOUT = "BATCHWISE_TIMEOUT"


@dataclass(frozen=True)
class Endpoint:
    """A server address for one protocol. `url` is HOST:PORT (a scheme, if given, is dropped)."""

    url: str = f"{DEFAULT_HOST}:{DEFAULT_PORTS['http']}"
    protocol: str = "http"
    timeout_s: float = DEFAULT_TIMEOUT_S

    def __post_init__(self):
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {PROTOCOLS}, got {self.protocol!r}")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {self.timeout_s}")
        url = self.url.split("://", 1)[-1].rstrip("/")
        host, _, port = url.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"url must be HOST:PORT, got {self.url!r}")
        object.__setattr__(self, "url", url)

    @classmethod
    def resolve(cls, url: str | None = None, protocol: str | None = None,
                timeout_s: float | None = None) -> "Endpoint":
        """Explicit values first, then BATCHWISE_URL / BATCHWISE_PROTOCOL / BATCHWISE_TIMEOUT, then
        the defaults (HTTP on 8000, gRPC on 8001, on 127.0.0.1)."""
        protocol = protocol or os.environ.get(ENV_PROTOCOL) or "http"
        url = url or os.environ.get(ENV_URL) or f"{DEFAULT_HOST}:{DEFAULT_PORTS.get(protocol, 8000)}"
        if timeout_s is None:
            raw = os.environ.get(ENV_TIMEOUT)
            try:
                timeout_s = float(raw) if raw else DEFAULT_TIMEOUT_S
            except ValueError:
                raise ValueError(f"{ENV_TIMEOUT} must be a number of seconds, got {raw!r}") from None
        return cls(url=url, protocol=protocol, timeout_s=timeout_s)

    @property
    def host(self) -> str:
        return self.url.rpartition(":")[0]

    @property
    def port(self) -> int:
        return int(self.url.rpartition(":")[2])

    def module(self, asyncio: bool = False):
        """tritonclient.http, .grpc, or their asyncio variants."""
        if self.protocol == "http":
            if asyncio:
                import tritonclient.http.aio as module
            else:
                import tritonclient.http as module
        elif asyncio:
            import tritonclient.grpc.aio as module
        else:
            import tritonclient.grpc as module
        return module

    def client(self, asyncio: bool = False, concurrency: int = 1):
        """A new tritonclient InferenceServerClient. The sync HTTP one is not safe to share between
        threads (it is gevent-based); `concurrency` sizes its connection pool."""
        module = self.module(asyncio)
        if self.protocol == "http":
            if asyncio:
                return module.InferenceServerClient(self.url, conn_limit=max(concurrency, 1),
                                                    conn_timeout=self.timeout_s)
            return module.InferenceServerClient(self.url, concurrency=max(concurrency, 1),
                                                connection_timeout=self.timeout_s,
                                                network_timeout=self.timeout_s)
        return module.InferenceServerClient(self.url)

    def request_timeout(self, timeout_s: float | None = None) -> dict:
        """The per-call timeout keyword for this protocol's infer(): gRPC takes a client-side
        deadline; HTTP has only the connection's network timeout, set when the client is made."""
        if self.protocol == "grpc":
            return {"client_timeout": timeout_s or self.timeout_s}
        return {}


class ClientOwner:
    """Closes the tritonclient client in `self.client`; usable as a context manager."""

    client: object

    def close(self) -> None:
        self.client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

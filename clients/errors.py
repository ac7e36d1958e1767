"""The toolkit's own exceptions: server and transport errors from either protocol mapped to a small
hierarchy, with the server's message kept, and a flag for whether a retry is safe."""
from __future__ import annotations

import asyncio
import json
import socket

import grpc


class ClientError(Exception):
    """Any failure of a call to the server. `status` is the raw status the transport reported (a gRPC
    code name or an HTTP status), kept for logs."""

    retryable = False

    def __init__(self, message: str, status: str | None = None):
        super().__init__(message)
        self.message = message
        self.status = status

    def __str__(self) -> str:
        return f"{self.message} ({self.status})" if self.status else self.message


class InvalidArgumentError(ClientError):
    """The request was refused as malformed: the message names the field."""


class NotFoundError(ClientError):
    """No such model (or version) on the server."""


class UnavailableError(ClientError):
    """The server could not be reached or is not serving: safe to retry, nothing ran."""

    retryable = True


class OverloadedError(UnavailableError):
    """The model's queue is full (`max_queue_size`): safe to retry after a pause."""


class DeadlineExceededError(ClientError):
    """The request's timeout expired, in the client or in the server's queue. Not retried: the work
    may have run, and the caller's time budget is spent."""


class CancelledError(ClientError):
    """The request was cancelled (by the caller, or the server ended it)."""


class ServerError(ClientError):
    """The server failed the request for another reason (an internal error)."""


_GRPC_CODES = {
    "INVALID_ARGUMENT": InvalidArgumentError,
    "OUT_OF_RANGE": InvalidArgumentError,
    "NOT_FOUND": NotFoundError,
    "UNAVAILABLE": UnavailableError,
    "RESOURCE_EXHAUSTED": OverloadedError,
    "DEADLINE_EXCEEDED": DeadlineExceededError,
    "CANCELLED": CancelledError,
}
_HTTP_CODES = {
    400: InvalidArgumentError,
    404: NotFoundError,
    408: DeadlineExceededError,
    429: OverloadedError,
    499: CancelledError,
    502: UnavailableError,
    503: UnavailableError,
    504: DeadlineExceededError,
}
# Triton reports these with a generic status code; their message tells them apart.
_MESSAGES = (
    ("invalid argument", InvalidArgumentError),  # the decoding models' prefix, for gRPC streams
    ("exceeds maximum queue size", OverloadedError),
    ("request timeout expired", DeadlineExceededError),
    ("deadline exceeded", DeadlineExceededError),
    ("has no available versions", UnavailableError),  # loading or unloading (a server restart)
    ("is not ready", UnavailableError),
    ("unknown model", NotFoundError),
    ("requested model", NotFoundError),  # "requested model 'x' is not available" (statistics, config)
    ("is not found", NotFoundError),
    ("failed to connect", UnavailableError),
    ("connection refused", UnavailableError),
)


# The server went away mid-request (it died or restarted), as gRPC's UNAVAILABLE says for its streams:
# aiohttp's (tritonclient.http.aio, the SSE client) and geventhttpclient's (tritonclient.http) names.
_DISCONNECTS = ("ServerDisconnectedError", "HTTPConnectionClosed")


def error_class(status: str | int | None, message: str) -> type[ClientError]:
    """The exception class for a status (gRPC code, with or without `StatusCode.`, or HTTP status)
    and the server's message."""
    lowered = message.lower()
    for fragment, cls in _MESSAGES:
        if fragment in lowered:
            return cls
    if status is None:
        return ServerError
    text = str(status).removeprefix("StatusCode.")
    if text.isdigit():
        return _HTTP_CODES.get(int(text), ServerError)
    return _GRPC_CODES.get(text, ServerError)


def http_error(status: int, body: str) -> ClientError:
    """The error of an HTTP answer with a non-200 status; Triton's body is {"error": "..."}."""
    try:
        message = json.loads(body).get("error", body)
    except (ValueError, AttributeError):
        message = body
    return error_class(status, message)(message, str(status))


def to_client_error(exc: BaseException) -> ClientError:
    """Map an exception raised by tritonclient, the HTTP stack or the OS to a ClientError. A
    ClientError passes through unchanged."""
    from tritonclient.utils import InferenceServerException

    if isinstance(exc, ClientError):
        return exc
    if isinstance(exc, InferenceServerException):
        message = exc.message() or ""
        status = exc.status()
        return error_class(status, message)(message, status)
    if isinstance(exc, grpc.RpcError) and callable(getattr(exc, "code", None)):
        # tritonclient's asyncio stream lets the channel's own error through unwrapped
        message, status = exc.details() or "", str(exc.code())
        return error_class(status, message)(message, status)
    if isinstance(exc, (ConnectionRefusedError, ConnectionResetError, BrokenPipeError)):
        return UnavailableError(f"cannot reach the server: {exc}", type(exc).__name__)
    if isinstance(exc, (socket.timeout, TimeoutError, asyncio.TimeoutError)) or type(exc).__name__ == "Timeout":
        return DeadlineExceededError(f"no answer within the timeout: {exc}", type(exc).__name__)
    if isinstance(exc, OSError):  # DNS failure, unreachable network: nothing was sent
        return UnavailableError(f"cannot reach the server: {exc}", type(exc).__name__)
    if type(exc).__name__ in _DISCONNECTS:  # the HTTP stacks' own classes, not OSErrors
        return UnavailableError(f"the server closed the connection without an answer: {exc}", type(exc).__name__)
    return ServerError(f"{type(exc).__name__}: {exc}")

"""Server and model health, configuration and statistics as typed results, over either protocol.
Statistics give what the dynamic batcher did: executed batch sizes, queue and compute time."""
from __future__ import annotations

from dataclasses import dataclass, field

from google.protobuf import json_format

from .connection import ClientOwner, Endpoint
from .errors import to_client_error
from .model_spec import ModelSpec, parse_config, spec_from_config


@dataclass(frozen=True)
class ModelState:
    name: str
    version: str
    state: str  # READY, UNAVAILABLE, ...
    reason: str = ""


@dataclass(frozen=True)
class ServerHealth:
    live: bool
    ready: bool
    version: str
    models: tuple[ModelState, ...]


@dataclass(frozen=True)
class Duration:
    count: int
    ns: int

    @property
    def avg_us(self) -> float | None:
        return self.ns / self.count / 1e3 if self.count else None


@dataclass(frozen=True)
class ModelStatistics:
    """Cumulative since the server started; subtract two snapshots (`-`) for a window."""

    model: str
    version: str
    inference_count: int  # requests (rows) inferred
    execution_count: int  # model executions (batches)
    success: Duration  # end to end in the server
    fail: Duration
    queue: Duration
    compute_input: Duration
    compute_infer: Duration
    compute_output: Duration
    batch_executions: dict[int, int] = field(default_factory=dict)  # batch size -> executions

    @property
    def avg_batch_size(self) -> float | None:
        return self.inference_count / self.execution_count if self.execution_count else None

    @property
    def avg_queue_us(self) -> float | None:
        return self.queue.avg_us

    @property
    def avg_compute_us(self) -> float | None:
        """Per request: Triton adds a batch's compute time once for each request in it."""
        ns = self.compute_input.ns + self.compute_infer.ns + self.compute_output.ns
        return ns / self.success.count / 1e3 if self.success.count else None

    def __sub__(self, earlier: "ModelStatistics") -> "ModelStatistics":
        def d(a: Duration, b: Duration) -> Duration:
            return Duration(a.count - b.count, a.ns - b.ns)

        sizes = {size: n - earlier.batch_executions.get(size, 0) for size, n in self.batch_executions.items()}
        return ModelStatistics(
            self.model, self.version, self.inference_count - earlier.inference_count,
            self.execution_count - earlier.execution_count, d(self.success, earlier.success),
            d(self.fail, earlier.fail), d(self.queue, earlier.queue), d(self.compute_input, earlier.compute_input),
            d(self.compute_infer, earlier.compute_infer), d(self.compute_output, earlier.compute_output),
            {size: n for size, n in sizes.items() if n},
        )


def _duration(stats: dict, key: str) -> Duration:
    entry = stats.get(key, {})
    return Duration(int(entry.get("count", 0)), int(entry.get("ns", 0)))


def parse_statistics(entry: dict) -> ModelStatistics:
    """One element of `model_stats`, as the HTTP API returns it (or gRPC's message as JSON with the
    proto field names; 64-bit numbers may arrive as strings)."""
    inference = entry.get("inference_stats", {})
    return ModelStatistics(
        model=entry.get("name", ""),
        version=str(entry.get("version", "")),
        inference_count=int(entry.get("inference_count", 0)),
        execution_count=int(entry.get("execution_count", 0)),
        success=_duration(inference, "success"),
        fail=_duration(inference, "fail"),
        queue=_duration(inference, "queue"),
        compute_input=_duration(inference, "compute_input"),
        compute_infer=_duration(inference, "compute_infer"),
        compute_output=_duration(inference, "compute_output"),
        batch_executions={int(b["batch_size"]): int(b.get("compute_infer", {}).get("count", 0))
                          for b in entry.get("batch_stats", [])},
    )


def _as_dict(message_or_dict) -> dict:
    if isinstance(message_or_dict, dict):
        return message_or_dict
    if isinstance(message_or_dict, list):  # HTTP's repository index is a bare list
        return {"models": message_or_dict}
    return json_format.MessageToDict(message_or_dict, preserving_proto_field_name=True)


class Admin(ClientOwner):
    """Health, metadata and statistics; one short-lived tritonclient client per instance."""

    def __init__(self, endpoint: Endpoint | None = None):
        self.endpoint = endpoint or Endpoint.resolve()
        self.client = self.endpoint.client()

    def _call(self, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            raise to_client_error(exc) from exc

    def health(self) -> ServerHealth:
        live = self._call(self.client.is_server_live)
        ready = self._call(self.client.is_server_ready)
        metadata = _as_dict(self._call(self.client.get_server_metadata))
        index = _as_dict(self._call(self.client.get_model_repository_index))
        models = tuple(ModelState(m.get("name", ""), str(m.get("version", "")), m.get("state", ""),
                                  m.get("reason", "")) for m in index.get("models", []))
        return ServerHealth(live, ready, metadata.get("version", ""), models)

    def is_model_ready(self, model: str) -> bool:
        return self._call(self.client.is_model_ready, model)

    def model_spec(self, model: str) -> ModelSpec:
        """The model's configuration as the server runs it (not the checked-in file)."""
        raw = self._call(self.client.get_model_config, model)
        config = _as_dict(raw)
        config = config.get("config", config)
        return spec_from_config(json_format.ParseDict(config, parse_config(""), ignore_unknown_fields=True), model)

    def statistics(self, model: str) -> ModelStatistics:
        raw = _as_dict(self._call(self.client.get_inference_statistics, model))
        entries = raw.get("model_stats", [])
        if not entries:
            raise to_client_error(LookupError(f"the server has no statistics for {model!r}"))
        return parse_statistics(entries[0])

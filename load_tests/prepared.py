"""Request bodies built once per process from a user class's workload and settings, and the cursor
that picks the next one, shared by all users of the class so that the record order is the
workload's. Sending then costs no encoding. State lives on the gevent hub thread of its process."""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from .workload import Cursor, Workload, load_workload, make_workload

DEFAULT_NUM_RECORDS = {"embed": 256, "generate": 64}
_SETTINGS = ("model", "spec", "workload_order", "workload_seed", "priority", "max_tokens", "ignore_eos")


class PreparedRequests:
    def __init__(self, requests: list, cursor: Cursor):
        if not requests:
            raise ValueError("the workload has no records")
        self.requests, self._cursor = requests, cursor

    def next(self):
        return self.requests[self._cursor.next()]


@lru_cache(maxsize=16)
def _load(path: str) -> Workload:
    return load_workload(Path(path))


def resolve_workload(workload, kind: str, seed: int) -> Workload:
    """A Workload from a user's `workload` setting: a path, a Workload, or None (made in memory)."""
    if workload is None:
        return make_workload(kind, DEFAULT_NUM_RECORDS[kind], seed)
    resolved = workload if isinstance(workload, Workload) else _load(str(Path(workload).resolve()))
    if resolved.kind != kind:
        raise ValueError(f"the workload is for {resolved.kind!r} requests, the user sends {kind!r} requests: "
                         f"make one with `python -m load_tests.workload --kind {kind}`")
    return resolved


_cache: dict[tuple, PreparedRequests] = {}


def _hashable(value):
    if isinstance(value, Path):
        return str(value.resolve())
    return value if isinstance(value, (str, int, float, bool, type(None))) else id(value)


def prepared_requests(user) -> PreparedRequests:
    """The prepared requests of `user`'s class and settings (built on first use in this process)."""
    from .open_loop import worker_index

    cls = type(user)
    key = (cls, cls.kind, *(_hashable(getattr(cls, name, None)) for name in ("workload", *_SETTINGS)))
    if key not in _cache:
        records = resolve_workload(cls.workload, cls.kind, cls.workload_seed).records
        cursor = Cursor(len(records), cls.workload_order, cls.workload_seed, worker_index(user.environment))
        _cache[key] = PreparedRequests([user.prepare(r) for r in records], cursor)
    return _cache[key]

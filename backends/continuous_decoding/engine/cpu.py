"""How many cores this process may use: the kernels size their thread pools from it."""
from __future__ import annotations

import os
from functools import cache


@cache
def available_cores() -> int:
    """The CPU affinity set's size where the platform has one (a container pinned to 2 of 64 cores
    gets 2), else the machine's count."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1

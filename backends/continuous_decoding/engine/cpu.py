"""How many cores this process may use: the kernels size their thread pools from it."""
from __future__ import annotations

import math
import os
from functools import cache
from pathlib import Path

_CGROUP_V2 = Path("/sys/fs/cgroup/cpu.max")  # "<quota> <period>" or "max <period>"
_CGROUP_V1 = Path("/sys/fs/cgroup/cpu")  # cpu.cfs_quota_us (-1: none) and cpu.cfs_period_us


@cache
def available_cores() -> int:
    """The CPU affinity set's size (a process pinned to 2 of 64 cores gets 2), lowered to a container's
    CPU quota where one is set (`docker run --cpus 2` on a 64-core host gets 2)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = cpu_quota()
    return max(1, min(cores, math.ceil(quota)) if quota else cores)


def cpu_quota(v2: Path = _CGROUP_V2, v1: Path = _CGROUP_V1) -> float | None:
    """The cgroup CPU quota in cores, None where there is none or it cannot be read."""
    try:
        if v2.is_file():
            quota, period = v2.read_text().split()[:2]
            return None if quota == "max" else int(quota) / int(period)
        quota_file, period_file = v1 / "cpu.cfs_quota_us", v1 / "cpu.cfs_period_us"
        if quota_file.is_file() and period_file.is_file():
            quota = int(quota_file.read_text())
            return None if quota <= 0 else quota / int(period_file.read_text())
    except (OSError, ValueError):
        return None
    return None

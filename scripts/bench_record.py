"""What a benchmark writes beside its figures: the machine and the settings they came from."""
from __future__ import annotations

import json
import os
import platform
from pathlib import Path

import onnxruntime as ort


def machine() -> dict:
    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(), "python": platform.python_version(), "onnxruntime": ort.__version__}


def write_record(path: Path, benchmark: str, args, **fields) -> None:
    """bench_results/<name>.json: {"benchmark", "machine", "settings" (the parsed flags), **fields}."""
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"benchmark": benchmark, "machine": machine(), "settings": settings, **fields},
                               indent=2))
    print(f"wrote {path}")

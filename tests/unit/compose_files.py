"""docker-compose.yml read as Compose reads it with every variable unset, and the host paths behind its
bind mounts: what tests/unit/test_compose_services.py and test_compose_monitoring.py check."""
import re
from pathlib import Path, PurePosixPath

import yaml

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "docker-compose.yml"
GPU_OVERRIDE = REPO / "docker-compose.gpu.yml"

_VARIABLE = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}")


def with_defaults(value):
    """Compose's `${NAME:-default}` read with every variable unset."""
    if isinstance(value, dict):
        return {k: with_defaults(v) for k, v in value.items()}
    if isinstance(value, list):
        return [with_defaults(v) for v in value]
    if not isinstance(value, str):
        return value

    def default(m):
        assert m.group(2) is not None, f"{value!r}: ${{{m.group(1)}}} has no default"
        return m.group(2)

    return _VARIABLE.sub(default, value)


def load(path: Path) -> dict:
    return with_defaults(yaml.safe_load(path.read_text()))


def mounts(service: dict) -> list[tuple[Path, PurePosixPath]]:
    """(host path, container path) of each bind mount; compose resolves host paths from the file's folder."""
    out = []
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        out.append(((COMPOSE.parent / source).resolve(), PurePosixPath(target)))
    return out


def host_path(service: dict, container_path) -> Path:
    container_path = PurePosixPath(container_path)
    for source, target in mounts(service):
        if container_path == target or target in container_path.parents:
            return source / container_path.relative_to(target)
    raise AssertionError(f"{container_path} is not mounted from the host")

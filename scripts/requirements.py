"""Prints the pinned requirements from pyproject.toml, one per line, for pip.

    python scripts/requirements.py [--extras export,test]   # the dependencies (and extras)
    python scripts/requirements.py --no-deps               # the packages installed with --no-deps
"""
import argparse
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def requirements(extras: list[str], no_deps: bool) -> list[str]:
    data = tomllib.loads(PYPROJECT.read_text())
    if no_deps:
        return list(data["tool"]["batchwise"]["no-deps"])
    optional = data["project"].get("optional-dependencies", {})
    unknown = sorted(set(extras) - set(optional))
    if unknown:
        raise SystemExit(f"unknown extras {unknown}; pyproject.toml has {sorted(optional)}")
    return list(data["project"]["dependencies"]) + [r for e in extras for r in optional[e]]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--extras", default="", help="comma-separated optional dependency groups")
    p.add_argument("--no-deps", action="store_true", help="list the packages to install with --no-deps")
    args = p.parse_args()
    print("\n".join(requirements([e for e in args.extras.split(",") if e], args.no_deps)))


if __name__ == "__main__":
    main()

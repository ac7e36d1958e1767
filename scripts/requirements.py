"""Prints the pinned requirements from pyproject.toml, one per line, for pip.

    python scripts/requirements.py [--extras export,test]   # the dependencies (and extras)
    python scripts/requirements.py --no-deps               # the packages installed with --no-deps
    python scripts/requirements.py --only numpy 'tritonclient[grpc]'
                                   # the pins of these packages alone (container images); extras
                                   # given with a name replace the ones pyproject.toml lists
"""
import argparse
import re
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"

# name, optional [extras], the rest (the version specifier): enough for the pins pyproject.toml holds.
_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*(.*)$")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(extras: list[str], no_deps: bool) -> list[str]:
    data = tomllib.loads(PYPROJECT.read_text())
    if no_deps:
        return list(data["tool"]["batchwise"]["no-deps"])
    optional = data["project"].get("optional-dependencies", {})
    unknown = sorted(set(extras) - set(optional))
    if unknown:
        raise SystemExit(f"unknown extras {unknown}; pyproject.toml has {sorted(optional)}")
    return list(data["project"]["dependencies"]) + [r for e in extras for r in optional[e]]


def selected(names: list[str]) -> list[str]:
    """The pins of the named packages, from the dependencies or any extra, in the order asked."""
    data = tomllib.loads(PYPROJECT.read_text())
    pins = list(data["project"]["dependencies"])
    pins += [r for group in data["project"].get("optional-dependencies", {}).values() for r in group]
    by_name = {}
    for pin in pins:
        name, pinned_extras, spec = _REQUIREMENT.match(pin).groups()
        by_name[_canonical(name)] = (name, pinned_extras or "", spec)
    out = []
    for asked in names:
        match = _REQUIREMENT.match(asked)
        if match is None or match.group(3):
            raise SystemExit(f"{asked!r}: give a package name, optionally with [extras], without a version")
        key = _canonical(match.group(1))
        if key not in by_name:
            raise SystemExit(f"{asked!r} is not pinned in pyproject.toml; it pins {sorted(by_name)}")
        name, pinned_extras, spec = by_name[key]
        out.append(f"{name}{match.group(2) or pinned_extras}{spec}")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    group = p.add_mutually_exclusive_group()
    group.add_argument("--extras", default="", help="comma-separated optional dependency groups")
    group.add_argument("--no-deps", action="store_true", help="list the packages to install with --no-deps")
    group.add_argument("--only", nargs="+", metavar="NAME", help="list the pins of these packages alone")
    args = p.parse_args()
    if args.only:
        print("\n".join(selected(args.only)))
    else:
        print("\n".join(requirements([e for e in args.extras.split(",") if e], args.no_deps)))


if __name__ == "__main__":
    main()

"""Input and output files of offline batch jobs: records (id, text) read from JSONL or CSV with every
problem reported by line number, and the ids an earlier run already wrote, so that a restarted job
skips them. The output is JSONL, one line per id, appended as results complete."""
from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass
from pathlib import Path


class InputError(Exception):
    """The job cannot start: an unreadable file, or problems in its records."""


@dataclass(frozen=True)
class Record:
    id: str
    text: str
    line: int  # 1-based line (JSONL) or row (CSV, the header being line 1) in the input file


@dataclass(frozen=True)
class Problem:
    line: int
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


def _format(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return "csv"
    if suffix in (".jsonl", ".ndjson", ".json"):
        return "jsonl"
    raise InputError(f"{path}: unknown input format {suffix!r}; use .jsonl (or .ndjson) or .csv")


def _rows(path: Path, fmt: str):
    """(line number, dict or a problem message) for each non-empty record in the file."""
    with open(path, newline="" if fmt == "csv" else None, encoding="utf-8") as f:
        if fmt == "csv":
            reader = csv.DictReader(f)
            if reader.fieldnames is None:
                return
            for row in reader:
                if None in row:
                    yield reader.line_num, f"more fields than the header's {len(reader.fieldnames)}"
                else:
                    yield reader.line_num, row
            return
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as e:
                yield number, f"not valid JSON ({e.msg} at column {e.colno})"
                continue
            yield number, value if isinstance(value, dict) else f"expected a JSON object, got {type(value).__name__}"


def read_records(path: str | Path, id_field: str = "id", text_field: str = "text") -> tuple[list[Record], list[Problem]]:
    """Every valid record and every problem (malformed line, missing or empty id or text, duplicate id)."""
    path = Path(path)
    fmt = _format(path)
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    records: list[Record] = []
    problems: list[Problem] = []
    first_line: dict[str, int] = {}
    try:
        for number, row in _rows(path, fmt):
            if isinstance(row, str):
                problems.append(Problem(number, row))
                continue
            record_id, text = row.get(id_field), row.get(text_field)
            if record_id is None or str(record_id).strip() == "" or isinstance(record_id, (dict, list, bool)):
                problems.append(Problem(number, f"missing {id_field!r} (a string or a number)"))
                continue
            if not isinstance(text, str) or not text:
                problems.append(Problem(number, f"missing {text_field!r} (a non-empty string)"))
                continue
            record_id = str(record_id)
            if record_id in first_line:
                problems.append(Problem(number, f"duplicate id {record_id!r} (first on line {first_line[record_id]})"))
                continue
            first_line[record_id] = number
            records.append(Record(record_id, text, number))
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise InputError(f"{path}: cannot read it: {e}") from e
    return records, problems


@dataclass(frozen=True)
class Resume:
    done_ids: frozenset[str]
    truncated_bytes: int  # a partial last line, cut off by a kill mid-write, removed from the file


def resume_state(path: str | Path) -> Resume:
    """The ids an earlier run wrote to the output. A partial last line (the process was killed while
    writing it) is removed, so the file again ends with whole lines; its record is done again. Any
    other unreadable line means the file is not this job's output: refuse rather than guess."""
    path = Path(path)
    if not path.exists():
        return Resume(frozenset(), 0)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise InputError(f"{path}: cannot read the output of the earlier run: {e}") from e
    cut = data.rfind(b"\n") + 1
    done: set[str] = set()
    for number, line in enumerate(data[:cut].splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record_id = json.loads(line)["id"]
        except (ValueError, KeyError, TypeError):
            raise InputError(f"{path}: line {number} is not a result line; is this the output of a batch job?") from None
        done.add(str(record_id))
    # Only once the file has proved to be a job's output: never cut the last line off someone else's file.
    if cut < len(data):
        with open(path, "r+b") as f:
            f.truncate(cut)
            os.fsync(f.fileno())
    return Resume(frozenset(done), len(data) - cut)


class ResultWriter:
    """Appends one JSON line per result with a single write() on an O_APPEND descriptor, so a line is
    in the file (the kernel's page cache) once write() returns and survives a kill -9 of the job;
    fsync every `fsync_every` lines and on close covers a machine crash too. One thread writes."""

    def __init__(self, path: str | Path, fsync_every: int = 64):
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.fsync_every = fsync_every
        self.unsynced = 0

    def write(self, result: dict) -> None:
        line = (json.dumps(result, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
        view = memoryview(line)
        while view:
            view = view[os.write(self.fd, view):]
        self.unsynced += 1
        if self.unsynced >= self.fsync_every:
            self.sync()

    def sync(self) -> None:
        os.fsync(self.fd)
        self.unsynced = 0

    def close(self) -> None:
        if self.fd >= 0:
            self.sync()
            os.close(self.fd)
            self.fd = -1

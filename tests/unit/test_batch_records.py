"""Batch-job input checking and resume logic: problems reported by line, a truncated last line
repaired, done ids skipped."""
import json
import os

import pytest

from clients.records import InputError, ResultWriter, read_records, resume_state


def write(path, text):
    path.write_text(text)
    return path


def test_jsonl_records_and_every_problem_with_its_line(tmp_path):
    path = write(tmp_path / "in.jsonl", "\n".join([
        '{"id": "a", "text": "first"}',
        '{"id": 2, "text": "second"}',
        '',
        '{"id": "c", "text": "third"',
        '{"text": "no id"}',
        '{"id": "e"}',
        '{"id": "a", "text": "again"}',
        '["not", "an", "object"]',
        '{"id": "f", "text": ""}',
        '{"id": "g", "text": "last"}',
    ]) + "\n")
    records, problems = read_records(path)
    assert [(r.id, r.text, r.line) for r in records] == [("a", "first", 1), ("2", "second", 2), ("g", "last", 10)]
    by_line = {p.line: p.message for p in problems}
    assert sorted(by_line) == [4, 5, 6, 7, 8, 9]
    assert "not valid JSON" in by_line[4]
    assert "missing 'id'" in by_line[5]
    assert "missing 'text'" in by_line[6] and "missing 'text'" in by_line[9]
    assert "duplicate id 'a' (first on line 1)" in by_line[7]
    assert "JSON object" in by_line[8]


def test_csv_records_with_other_field_names(tmp_path):
    path = write(tmp_path / "in.csv", 'doc,body\n1,"hello, world"\n2,\n1,dup\n3,"multi\nline"\n')
    records, problems = read_records(path, id_field="doc", text_field="body")
    assert [(r.id, r.text) for r in records] == [("1", "hello, world"), ("3", "multi\nline")]
    assert [p.line for p in problems] == [3, 4]


@pytest.mark.parametrize("name, content, match", [
    ("missing.jsonl", None, "no such file"),
    ("in.txt", "x", "unknown input format"),
    ("bad.jsonl", b"\xff\xfe\x00garbage", "cannot read"),
])
def test_unreadable_inputs_refuse_to_start_and_say_why(tmp_path, name, content, match):
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(InputError, match=match):
        read_records(path)


def test_resume_skips_done_ids_and_cuts_a_partial_last_line(tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_bytes(b'{"id":"a","embedding":[1]}\n{"id":"b","error":{"type":"X","message":"m"}}\n{"id":"c","embe')
    state = resume_state(out)
    assert state.done_ids == {"a", "b"}
    assert state.truncated_bytes == len(b'{"id":"c","embe')
    assert out.read_bytes().endswith(b"}\n") and len(out.read_bytes().splitlines()) == 2
    assert resume_state(out).truncated_bytes == 0  # repaired once, stable after


def test_resume_of_a_missing_output_is_empty_and_a_foreign_file_is_refused(tmp_path):
    assert resume_state(tmp_path / "none.jsonl").done_ids == frozenset()
    foreign = write(tmp_path / "foreign.jsonl", "hello\n")
    with pytest.raises(InputError, match="line 1 is not a result line"):
        resume_state(foreign)


def test_writer_appends_whole_lines_that_resume_reads_back(tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_text('{"id":"old"}\n')
    writer = ResultWriter(out, fsync_every=2)
    for i in range(5):
        writer.write({"id": f"n{i}", "text": "é"})
    writer.close()
    lines = out.read_text(encoding="utf-8").splitlines()
    assert [json.loads(l)["id"] for l in lines] == ["old", "n0", "n1", "n2", "n3", "n4"]
    assert resume_state(out).done_ids == {"old", "n0", "n1", "n2", "n3", "n4"}
    assert os.path.getsize(out) == len(out.read_bytes())

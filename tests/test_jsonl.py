"""The one fsynced JSONL appender (core/jsonl.py): rows round-trip byte for byte, a last line cut
by a crash is dropped and reported on reading and removed on appending, a broken complete line
is a named error wherever it is."""

from __future__ import annotations

import pytest

from nvfp4study.core.errors import JsonlError
from nvfp4study.core.jsonl import append_jsonl, read_jsonl


def test_rows_are_written_as_one_line_each(tmp_path):
    p = tmp_path / "sub" / "a.jsonl"
    assert append_jsonl(p, {"a": 1, "s": "é"}) is None
    append_jsonl(p, {"b": tmp_path}, ensure_ascii=False)  # a Path is written via str
    append_jsonl(p, {"s": "é"}, ensure_ascii=False)
    # by hand: json.dumps escapes non-ASCII unless asked not to; one newline per row
    assert p.read_bytes() == (b'{"a": 1, "s": "\\u00e9"}\n'
                              + b'{"b": "' + str(tmp_path).encode() + b'"}\n'
                              + '{"s": "é"}\n'.encode())
    rows = read_jsonl(p)
    assert rows == [{"a": 1, "s": "é"}, {"b": str(tmp_path)}, {"s": "é"}]
    assert rows.cut is None


def test_a_cut_last_line_is_dropped_and_reported(tmp_path):
    p = tmp_path / "a.jsonl"
    p.write_bytes(b'{"a": 1}\n\n{"a": 2}\n{"a": 3, "tex')
    rows = read_jsonl(p)
    assert rows == [{"a": 1}, {"a": 2}]
    assert rows.cut == '{"a": 3, "tex'


def test_a_cut_line_that_parses_is_still_cut(tmp_path):
    # a line is complete only with its newline: the crash may have cut the newline alone
    p = tmp_path / "a.jsonl"
    p.write_bytes(b'{"a": 1}\n{"a": 2}')
    rows = read_jsonl(p)
    assert rows == [{"a": 1}] and rows.cut == '{"a": 2}'


def test_append_after_a_crash_removes_the_cut_line(tmp_path):
    p = tmp_path / "a.jsonl"
    p.write_bytes(b'{"a": 1}\n{"a": 2, "cut mid-\xc3')  # cut inside a UTF-8 character too
    assert append_jsonl(p, {"a": 3}) == '{"a": 2, "cut mid-\ufffd'
    assert p.read_bytes() == b'{"a": 1}\n{"a": 3}\n'
    assert read_jsonl(p).cut is None


def test_append_to_a_file_that_is_only_a_cut_line(tmp_path):
    p = tmp_path / "a.jsonl"
    p.write_bytes(b'{"a"')
    assert append_jsonl(p, {"b": 1}) == '{"a"'
    assert p.read_bytes() == b'{"b": 1}\n'


def test_append_finds_the_cut_past_a_long_last_line(tmp_path):
    # the cut line is longer than the 64 KiB step the appender reads backwards with
    p = tmp_path / "a.jsonl"
    long_cut = b'{"x": "' + b"y" * 200_000
    p.write_bytes(b'{"a": 1}\n' + long_cut)
    assert append_jsonl(p, {"a": 2}) == long_cut.decode()
    assert p.read_bytes() == b'{"a": 1}\n{"a": 2}\n'


@pytest.mark.parametrize("body, line, what", [
    (b'{"a": 1}\n{"a": 2, "cut\n{"a": 3}\n', 2, "not JSON"),  # a cut line in the middle
    (b'not json\n', 1, "not JSON"),
    (b'{"a": 1}\n[1, 2]\n', 2, "not a JSON object"),
])
def test_a_broken_complete_line_is_an_error(tmp_path, body, line, what):
    p = tmp_path / "a.jsonl"
    p.write_bytes(body)
    with pytest.raises(JsonlError, match=f"line {line} is {what}"):
        read_jsonl(p)

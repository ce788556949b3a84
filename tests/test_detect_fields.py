"""The detector's entry points (``codeeval/detect.py``) field by field, and ``nvfp4study detect``'s
decisions (issue 37's mutation benchmark: every field a caller reads, each input path's prompt,
entry point and upstream findings passed on, the size bound's edges, the CLI's exit status and
output). The expected values are written out from the module's docstrings, not taken from it."""

from __future__ import annotations

import io
import json
import sys

import pytest

from nvfp4study.codeeval.bounds import MAX_BYTES
from nvfp4study.codeeval.detect import (
    detect_bytes,
    detect_code,
    detect_completion,
    main,
    non_ascii_scan,
)
from nvfp4study.codeeval.extract import extract_code
from nvfp4study.core.errors import CompletionFormatError, DetectInputError

JUNK = "def f(xs):\n    return culp\n"  # an undefined name: corrupted
CLEAN = "def f(xs):\n    return len(xs)\n"
UNDEF = {"kind": "undefined_name", "line": 2, "col": 11, "text": "culp", "detail": "UndefinedName"}
#: two blocks: the longer one first, so only the entry point picks the second
TWO = ("```python\ndef helper(a, b, c):\n    total = a + b + c\n    return total * culp\n```\n\n"
       "```python\ndef target():\n    return 1\n```\n")


def fields(det, **kw) -> dict:
    return det.to_dict(with_code=True, **kw)


def test_detect_code_fields_clean_junk_and_repaired():
    assert fields(detect_code(CLEAN)) == {"status": "clean", "reason": None, "label": "clean", "source": "bare",
                                          "parsed": True, "recovered": None, "non_ascii_in_text": 0, "findings": [],
                                          "code": CLEAN}
    det = detect_code(JUNK, source="file")
    assert fields(det) == {"status": "corrupted", "reason": None, "label": "undefined_name", "source": "file",
                           "parsed": True, "recovered": None, "non_ascii_in_text": 0, "findings": [UNDEF], "code": JUNK}
    assert det.extraction is None
    broken = "x = (1\ny = 2\n"
    d = fields(detect_code(broken))
    assert (d["status"], d["parsed"], d["recovered"], d["code"]) == ("corrupted", False, True, broken)
    assert [f["kind"] for f in d["findings"]] == ["syntax_error"]


def test_detect_code_body_with_prompt_shifts_lines_and_counts_only_its_own_text():
    """A body-only completion is checked appended to the prompt: its findings keep the body's line
    and column; a finding inside the prompt (its last line too) is dropped; non-ASCII in strings
    is counted in the body only."""
    prompt = 'def f(xs):\n    """héllo"""\n    y = missing_in_prompt\n'
    body = '    return "é" + culp\n'
    d = fields(detect_code(body, prompt=prompt))
    # col 18: pyflakes' column, in UTF-8 bytes of the line (é is two)
    assert d["findings"] == [{"kind": "undefined_name", "line": 1, "col": 18, "text": "culp",
                              "detail": "UndefinedName"}]
    assert (d["non_ascii_in_text"], d["code"], d["status"]) == (1, body, "corrupted")
    assert fields(detect_code(body))["non_ascii_in_text"] == 1  # no prompt: nothing subtracted
    assert fields(detect_code('x = "éé"\n', prompt=prompt))["non_ascii_in_text"] == 2  # not body-only: own text


def test_detect_code_no_code_and_what_counts_as_a_body():
    """Blank code is no_code; a body is code whose first line that is neither blank nor a comment
    is indented (by spaces or a tab); comment-only code is no body."""
    assert fields(detect_code("   \n", source="file")) == {
        "status": "no_code", "reason": None, "label": "no_code", "source": "file", "parsed": False, "recovered": None,
        "non_ascii_in_text": 0, "findings": [{"kind": "no_code", "line": None, "col": None, "text": "", "detail": ""}],
        "code": "   \n"}
    open_if = 'def f(xs):\n    """doc"""\n    if xs:\n'  # a prompt that needs an indented body
    assert detect_code("    # note\nx = 1\n", prompt=open_if).status == "clean"  # checked alone: not a body
    assert detect_code("# only a comment\n", prompt=open_if).status == "clean"
    assert detect_code("        return 1\n", prompt=open_if).status == "clean"  # the body of the if
    tabbed = 'def f(xs):\n\t"""doc"""\n'
    assert detect_code("\treturn len(xs)\n", prompt=tabbed).findings == []  # alone it would not parse


@pytest.mark.parametrize("where", ["code", "prompt"])
def test_detect_code_over_the_size_bound(where):
    big = "x = 1\n" * 20_001
    det = detect_code(big, source="file") if where == "code" else detect_code(CLEAN, prompt=big, source="file")
    why = f"{where} has 20,002 lines, over 20,000"
    assert fields(det) == {"status": "too_large", "reason": why, "label": "too_large", "source": "file",
                           "parsed": False, "recovered": None, "non_ascii_in_text": 0,
                           "findings": [{"kind": "too_large", "line": None, "col": None, "text": "", "detail": why}],
                           "code": big if where == "code" else CLEAN}


@pytest.mark.parametrize("field", ["content", "reasoning_content"])
def test_detect_completion_over_the_size_bound(field):
    big = "y\n" * 20_001
    det = detect_completion(**{"content": "x = 1\n", field: big})
    why = f"{field} has 20,002 lines, over 20,000"
    assert fields(det) == {"status": "too_large", "reason": why, "label": "too_large", "source": "none",
                           "parsed": False, "recovered": None, "non_ascii_in_text": 0,
                           "findings": [{"kind": "too_large", "line": None, "col": None, "text": "", "detail": why}],
                           "code": ""}


def test_detect_completion_passes_entry_point_prompt_and_fence_junk():
    det = detect_completion(TWO, entry_point="target")
    assert (det.status, det.code) == ("clean", "def target():\n    return 1\n")
    assert det.extraction == {k: v for k, v in extract_code(TWO, None, "target").to_dict().items() if k != "code"}
    assert det.extraction["chosen_by"] == "entry_point" and "code" not in det.extraction
    assert detect_completion(TWO).status == "corrupted"  # the longest block, with the junk
    uses = "```python\ndef g(xs: List[int]) -> int:\n    return len(xs)\n```\n"
    assert "missing_import" in {f.kind for f in detect_completion(uses).findings}
    assert detect_completion(uses, prompt="from typing import List\n").findings == []
    det = detect_completion("```python\nx = culp\n```ulp\n")
    assert fields(det)["findings"] == [
        {"kind": "junk_fence", "line": None, "col": None, "text": "ulp", "detail": "text after a closing fence"},
        {"kind": "undefined_name", "line": 1, "col": 4, "text": "culp", "detail": "UndefinedName"}]


def test_detect_bytes_size_bound_edges():
    exact = b"x = '" + b"a" * (MAX_BYTES - 7) + b"'\n"
    assert len(exact) == MAX_BYTES and detect_bytes(exact).status == "clean"
    det = detect_bytes(exact + b"\n")
    why = "input is over 1,000,000 bytes"
    assert fields(det) == {"status": "too_large", "reason": why, "label": "too_large", "source": "file",
                           "parsed": False, "recovered": None, "non_ascii_in_text": 0,
                           "findings": [{"kind": "too_large", "line": None, "col": None, "text": "", "detail": why}],
                           "code": ""}


def test_detect_bytes_message_detection():
    # a chat message after leading blank space; with only reasoning_content; a whole response
    for data in (b'\n  {"content": "x = culp\\n"}', b'{"reasoning_content": "x = culp\\n"}',
                 b'{"choices": [{"message": {"content": "x = culp\\n"}}]}'):
        det = detect_bytes(data)
        assert det.status == "corrupted" and det.code == "x = culp\n" and det.extraction is not None, data
    # a JSON object that is no chat message is code (a dict display); as a message it is refused
    other = b'{"a": 1}\n'
    det = detect_bytes(other)
    assert (det.status, det.source, det.extraction) == ("clean", "file", None)
    with pytest.raises(CompletionFormatError) as err:
        detect_bytes(other, kind="message")
    assert str(err.value) == "not a JSON chat message (object with 'content' or 'choices')"


def test_detect_bytes_passes_prompt_entry_point_and_decoding_findings():
    bad = {"kind": "invalid_utf8", "line": 1, "col": None}
    uses = "```python\ndef g(xs: List[int]) -> int:\n    return len(xs)\n```\n"
    for data in (json.dumps({"content": uses}).encode(), uses.encode()):  # message, completion
        assert detect_bytes(data, prompt="from typing import List\n").findings == [], data
        assert detect_bytes(data).status == "clean" and detect_bytes(data).findings, data
    for data in (json.dumps({"content": TWO}).encode(), TWO.encode()):
        assert detect_bytes(data, entry_point="target").status == "clean", data
        assert detect_bytes(data).status == "corrupted", data
    # invalid UTF-8 before a junk fence: the decoding finding first, then the fence's, then the code's
    for data in (b"# \xff\n```python\nx = culp\n```ulp\n", b'{"content": "```python\\nx = culp\\n```ulp\\n", "z": "\xff"}'):
        kinds = [f.kind for f in detect_bytes(data).findings]
        assert kinds == ["invalid_utf8", "junk_fence", "undefined_name"], (data, kinds)
    det = detect_bytes(b"x = 1 # \xff\n", kind="code")
    assert {k: fields(det)["findings"][0][k] for k in bad} == bad and det.source == "file"
    # a think tag in any case makes it a completion
    det = detect_bytes(b"<THINK>hm</THINK>\nx = culp\n")
    assert det.extraction is not None and det.extraction["think"] == "closed" and det.status == "corrupted"


# --- nvfp4study detect ---------------------------------------------------------------------------
def test_cli_exit_status_keeps_the_worst_and_prints_each_file(tmp_path, capsys):
    big, clean, junk = tmp_path / "big.py", tmp_path / "clean.py", tmp_path / "junk.py"
    big.write_bytes(b"x = 1\n" * 20_001)
    clean.write_text(CLEAN)
    junk.write_text(JUNK)
    assert main([str(big), str(clean)]) == 2  # an unjudged file, then a clean one
    out, err = capsys.readouterr()
    assert err == f"nvfp4study detect: {big}: too_large: code has 20,002 lines, over 20,000\n"
    assert out == (f"{big}: too_large (code has 20,002 lines, over 20,000; code from file)\n"
                   f"  too_large        -         ''  [code has 20,002 lines, over 20,000]\n"
                   f"{clean}: clean (clean; code from file)\n")
    assert main([str(junk), str(clean)]) == 1
    out, err = capsys.readouterr()
    assert err == "" and out == (f"{junk}: corrupted (undefined_name; code from file)\n"
                                 f"  undefined_name   line 2    'culp'  [UndefinedName]\n"
                                 f"{clean}: clean (clean; code from file)\n")
    assert main(["--json", str(clean)]) == 0
    assert json.loads(capsys.readouterr().out) == {"file": str(clean), **detect_code(CLEAN, source="file").to_dict()}


def test_cli_options_reach_the_detector(tmp_path, capsys, monkeypatch):
    two = tmp_path / "two.md"
    two.write_text(TWO)
    assert main([str(two)]) == 1 and main(["--entry-point", "target", str(two)]) == 0
    assert main(["--as", "code", str(two)]) == 1  # Markdown read as Python: a syntax error
    assert "syntax_error" in capsys.readouterr().out
    prompt = tmp_path / "prompt.py"
    prompt.write_bytes(b"# \xff\nfrom typing import List\n")  # invalid UTF-8 in the prompt is replaced
    uses = tmp_path / "uses.py"
    uses.write_text("def g(xs: List[int]) -> int:\n    return len(xs)\n")
    assert main(["--prompt", str(prompt), str(uses)]) == 0
    assert capsys.readouterr().out == f"{uses}: clean (clean; code from file)\n"
    with pytest.raises(CompletionFormatError) as err:
        main(["--as", "message", str(uses)])
    assert str(err.value) == f"{uses}: not a JSON chat message (object with 'content' or 'choices')"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(JUNK.encode())))
    assert main(["-"]) == 1
    assert capsys.readouterr().out.startswith("-: corrupted (undefined_name; code from file)\n")
    missing = tmp_path / "nope.py"
    with pytest.raises(DetectInputError) as err:
        main([str(missing)])
    assert str(err.value) == f"cannot read {missing}: No such file or directory"


def test_cli_plain_line_of_a_finding_without_detail(tmp_path, capsys):
    blank = tmp_path / "blank.py"
    blank.write_text("   \n")
    assert main([str(blank)]) == 0  # no code is not corrupted
    assert capsys.readouterr().out == f"{blank}: no_code (no_code; code from file)\n  no_code          -         ''\n"


def test_body_after_a_prompt_without_its_last_newline():
    prompt = 'def f(xs):\n    """doc"""'  # no newline at the end: one is put between prompt and body
    det = detect_code("    return len(xs)\n", prompt=prompt)
    assert (det.status, det.findings) == ("clean", [])


@pytest.mark.parametrize("code,why", [
    ("x = " + "(" * 300 + "1" + ")" * 300 + "\n", "expression nesting over 200 at line 1"),
    ("x = (1\n" + "+ 1\n" * 5000 + ")\n", "RecursionError in the parser or pyflakes: nested too deep"),
])
def test_detect_code_too_deep_fields(code, why):
    """Nested over the bound (found before parsing), or a chain continued over lines that the
    parser or pyflakes recurses on: too_deep, with the code and the source kept."""
    assert fields(detect_code(code, source="file")) == {
        "status": "too_deep", "reason": why, "label": "too_deep", "source": "file", "parsed": False,
        "recovered": None, "non_ascii_in_text": 0,
        "findings": [{"kind": "too_deep", "line": None, "col": None, "text": "", "detail": why}], "code": code}


def test_the_naive_non_ascii_scan_the_card_warns_against():
    """Flags any character above U+007F, and so misses the card's ASCII junk words."""
    assert non_ascii_scan("x = 'é'\n") and non_ascii_scan("\u00a0")
    assert not non_ascii_scan(JUNK) and not non_ascii_scan("seen.add(culp)  # ulp oly Advisory\n")

"""Junk detection: F-06's four lines (and the card's elif line) with clean twins, each class,
bad input, the CLI, and no false positive on the canonical solutions."""

import json

import pytest

from nvfp4study import cli
from nvfp4study.codeeval.detect import detect_bytes, detect_code, detect_completion, main
from nvfp4study.codeeval.findings import CORRUPTING, FindingKind, Status
from nvfp4study.codeeval.recovery import recover
from nvfp4study.codeeval.undefined import missing_import_for
from nvfp4study.core.errors import DetectInputError

# F-06: four spliced-junk programs, each with its clean twin, the class that must flag it and
# the offending token.
F06 = [
    ("def count_items(xs):\n    count = 0\n    for x in xs:\n        count += 1eville\n    return count\n",
     "def count_items(xs):\n    count = 0\n    for x in xs:\n        count += 1\n    return count\n",
     FindingKind.GLUED_NAME, "eville", 4),
    ("def dedupe(items):\n    seen = set()\n    out = []\n    for c in items:\n        if c not in seen:\n"
     "            seen.add(culp)\n            out.append(c)\n    return out\n",
     "def dedupe(items):\n    seen = set()\n    out = []\n    for c in items:\n        if c not in seen:\n"
     "            seen.add(c)\n            out.append(c)\n    return out\n",
     FindingKind.UNDEFINED_NAME, "culp", 6),
    ("def balanced(s):\n    stack = []\n    for c in s:\n        if c == '(':\n            stack.append(c)ulp\n"
     "        elif not stack:\n            return False\n        else:\n            stack.pop()\n    return not stack\n",
     "def balanced(s):\n    stack = []\n    for c in s:\n        if c == '(':\n            stack.append(c)\n"
     "        elif not stack:\n            return False\n        else:\n            stack.pop()\n    return not stack\n",
     FindingKind.GLUED_NAME, "ulp", 5),
    ("def search(arr, x):\n    low = 0\n    high = len(arr) -  Advisory\n    while low <= high:\n"
     "        mid = (low + high) // 2\n        if arr[mid] < x:\n            low = mid + 1\n"
     "        else:\n            high = mid - 1\n    return low\n",
     "def search(arr, x):\n    low = 0\n    high = len(arr) - 1\n    while low <= high:\n"
     "        mid = (low + high) // 2\n        if arr[mid] < x:\n            low = mid + 1\n"
     "        else:\n            high = mid - 1\n    return low\n",
     FindingKind.UNDEFINED_NAME, "Advisory", 3),
]


@pytest.mark.parametrize("bad,clean,kind,token,line", F06, ids=["1eville", "culp", "(c)ulp", "Advisory"])
def test_f06_flagged_with_class_and_clean_twin_is_clean(bad, clean, kind, token, line):
    det = detect_code(bad)
    assert det.status == Status.CORRUPTED
    hits = [f for f in det.findings if f.kind == kind]
    assert [(f.text, f.line) for f in hits] == [(token, line)]
    twin = detect_code(clean)
    assert twin.status == Status.CLEAN and twin.findings == []


@pytest.mark.parametrize("frag", ["ulp", "oly", "culp", "Advisory", "eville", "Zx9"])
def test_f06_shapes_with_any_fragment(frag):
    # the whole kind of fault, not only the card's token: each shape with other fragments
    shapes = {
        f"    count += 1{frag}\n": FindingKind.GLUED_NAME,
        f"    seen.add({frag})\n": FindingKind.UNDEFINED_NAME,
        f"    stack.append(c){frag}\n": FindingKind.GLUED_NAME,
        f"    high = len(arr) -  {frag}\n": FindingKind.UNDEFINED_NAME,
        f"    if arr[0] < c {frag}:\n        pass\n": FindingKind.SYNTAX_ERROR,
    }
    head = "def f(arr, c):\n    count, seen, stack, high = 0, set(), [], 0\n"
    for line, kind in shapes.items():
        det = detect_code(head + line + "    return count, seen, stack, high\n")
        assert det.corrupted and kind in det.kinds(), (line, det.findings)


def test_f06_inside_a_completion_too():
    bad, clean, kind, token, _ = F06[2]
    assert detect_completion(f"```python\n{bad}```\n").label == "glued_name"
    assert detect_completion(f"```python\n{clean}```\n").findings == []


def test_glued_number_is_also_a_syntax_error_repaired():
    det = detect_code(F06[0][0])
    syn = [f for f in det.findings if f.kind == FindingKind.SYNTAX_ERROR]
    assert len(syn) == 1 and "eville" in syn[0].detail and det.recovered is True and det.parsed is False


def test_recovery_pass_still_checks_the_rest():
    # the card's `elif arr[mid] < x Advisory:` (a syntax error) and a later undefined name
    code = ("def search(arr, x):\n    lo, hi = 0, len(arr) - 1\n    while lo <= hi:\n"
            "        mid = (lo + hi) // 2\n        if arr[mid] == x:\n            return mid\n"
            "        elif arr[mid] < x Advisory:\n            lo = mid + 1\n        else:\n"
            "            hi = mid - 1\n    return oly\n")
    det = detect_code(code)
    assert [(f.kind, f.line) for f in det.findings] == [
        (FindingKind.SYNTAX_ERROR, 7), (FindingKind.UNDEFINED_NAME, 11)]
    assert "Advisory" in det.findings[0].detail and det.findings[1].text == "oly"
    assert det.label == "syntax_error"


def test_recover_keeps_line_numbers_and_gives_up_cleanly():
    tree, found, repaired = recover("x = (\n")
    assert len(repaired.split("\n")) == 2 and found and found[0].line == 1
    tree, found, _ = recover("def f(:\n  return ulp\n")
    assert found[0].kind == FindingKind.SYNTAX_ERROR


def test_missing_import_kept_apart_from_junk():
    code = "def f(xs: List[int]) -> int:\n    return math.floor(sum(xs)) + culp\n"
    det = detect_code(code)
    by = {f.text: f.kind for f in det.findings}
    assert by == {"List": FindingKind.MISSING_IMPORT, "math": FindingKind.MISSING_IMPORT,
                  "culp": FindingKind.UNDEFINED_NAME}
    assert det.status == Status.CORRUPTED  # because of culp, not the imports
    only_missing = detect_code("def f(xs: List[int]) -> int:\n    return len(xs)\n")
    assert only_missing.status == Status.CLEAN and only_missing.label == "missing_import"


def test_prompt_imports_and_helpers_are_in_scope():
    prompt = "from typing import List\n\n\ndef helper(x):\n    return x\n\n\ndef f(xs: List[int]) -> int:\n    \"\"\"doc\"\"\"\n"
    full = "def f(xs: List[int]) -> int:\n    return helper(len(xs))\n"
    assert detect_code(full, prompt=prompt).findings == []
    assert {f.text for f in detect_code(full).findings} == {"List", "helper"}
    body = "    return helper(len(xs)) + ulp\n"  # body-only: checked after the prompt
    det = detect_code(body, prompt=prompt)
    assert [(f.kind, f.text, f.line) for f in det.findings] == [(FindingKind.UNDEFINED_NAME, "ulp", 1)]


def test_ulp_is_junk_not_a_missing_import():
    # math.ulp exists, but the card's most frequent junk token must stay junk
    assert missing_import_for("ulp") is None
    assert missing_import_for("defaultdict") == "from collections import defaultdict"
    assert detect_code("x = ulp\n").label == "undefined_name"


def test_star_imports():
    assert detect_code("from math import *\ny = sqrt(2)\n").findings == []
    det = detect_code("from math import *\ny = sqrt(culp)\n")
    assert [(f.kind, f.text) for f in det.findings] == [(FindingKind.UNDEFINED_NAME, "culp")]
    unknown = detect_code("from os.path import *\ny = join(culp)\n")
    assert {f.kind for f in unknown.findings} == {FindingKind.STAR_IMPORT_NAME}
    assert unknown.status == Status.CLEAN


def test_keywords_glued_to_brackets_are_legal():
    code = "def f(y):\n    a = [g(x)for x in y]\n    b = 'a'if y else'b'\n    return a, b\n\ndef g(x):\n    return x\n"
    assert detect_code(code).findings == []


def test_name_glued_before_a_string():
    det = detect_code("x = ulp'abc'\n")
    assert FindingKind.GLUED_NAME in det.kinds()
    assert detect_code("x = rb'abc' + f'{1}'\n").findings == []


def test_non_ascii_in_code_vs_in_text():
    det = detect_code("def f(x):\n    # \u2192 arrow\n    return x \uff0b 1\n")
    na = [f for f in det.findings if f.kind == FindingKind.NON_ASCII]
    assert [(f.line, f.text) for f in na] == [(3, "\uff0b")] and det.non_ascii_in_text == 1
    in_string = detect_code("def f():\n    return 'caf\u00e9'\n")
    assert in_string.findings == [] and in_string.non_ascii_in_text == 1
    assert FindingKind.NON_ASCII not in CORRUPTING


def test_invalid_utf8_is_its_own_class_and_the_rest_is_checked():
    data = b"def f():\n    s = '\xff\xfe'\n    return culp\n"
    det = detect_bytes(data, kind="code")
    kinds = [f.kind for f in det.findings]
    assert kinds.count(FindingKind.INVALID_UTF8) == 1 and FindingKind.UNDEFINED_NAME in kinds
    assert det.label == "invalid_utf8" and det.corrupted
    # a U+FFFD from a detokenizer and a lone surrogate count too
    assert detect_code("x = '\ufffd'\n").label == "invalid_utf8"
    assert detect_code("x = '\ud800'\n").label == "invalid_utf8"
    assert detect_bytes(b"def f():\n    return 1\n").findings == []


def test_binary_garbage_is_classified_not_raised():
    garbage = bytes((i * 97 + 13) % 256 for i in range(3000))
    det = detect_bytes(garbage)
    assert det.corrupted and det.label in ("invalid_utf8", "control_char")
    nul = detect_bytes(b"x = 1\x00\x00\ny = 2\n", kind="code")
    assert nul.label == "control_char" and nul.corrupted


def test_no_code():
    det = detect_completion("I'm sorry, I can't help with that.")
    assert det.status == Status.NO_CODE and det.label == "no_code" and not det.corrupted
    assert detect_code("   \n").status == Status.NO_CODE


def test_junk_fence_and_reasoning_leaks_through_detect():
    func = "def f(x):\n    return x\n"
    det = detect_completion(f"```python\n{func}```culp\nDone.\n")
    assert det.label == "junk_fence" and det.corrupted and det.source == "junk_fence"
    leak = detect_completion("", f"```python\n{func}```\n")
    assert leak.status == Status.CLEAN and leak.source == "reasoning_content"
    stray = detect_completion(f"let me think\n</think>\n```python\n{func}```\n")
    assert stray.status == Status.CLEAN and stray.source == "after_stray_think"


def test_canonical_solutions_have_no_finding():
    from nvfp4study.codeeval.tasks import load_tasks

    tasks = load_tasks(164, True)
    bad = {}
    for t in tasks:
        for det in (detect_code(t.prompt + t.canonical_solution),
                    detect_code(t.canonical_solution, prompt=t.prompt),
                    detect_completion(f"```python\n{t.prompt}{t.canonical_solution}```\n",
                                      prompt=t.prompt, entry_point=t.entry_point)):
            if det.findings:
                bad[t.task_id] = det.findings
    assert len(tasks) == 179 and bad == {}


# --- CLI ---------------------------------------------------------------------------------------
def test_cli_exit_status_and_json(tmp_path, capsys):
    clean = tmp_path / "clean.py"
    clean.write_text(F06[1][1])
    bad = tmp_path / "answer.md"
    bad.write_text(f"Sure:\n```python\n{F06[1][0]}```\n")
    msg = tmp_path / "msg.json"
    msg.write_text(json.dumps({"content": "", "reasoning_content": f"```python\n{F06[1][1]}```"}))
    assert main([str(clean), str(msg)]) == 0
    capsys.readouterr()
    assert main(["--json", str(clean), str(bad), str(msg)]) == 1
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [(r["status"], r["source"]) for r in rows] == [
        ("clean", "file"), ("corrupted", "fenced"), ("clean", "reasoning_content")]
    assert rows[1]["findings"][0]["text"] == "culp"


def test_cli_prompt_file(tmp_path, capsys):
    prompt = tmp_path / "prompt.py"
    prompt.write_text("from typing import List\n\n\ndef f(xs: List[int]) -> int:\n    \"\"\"doc\"\"\"\n")
    code = tmp_path / "code.py"
    code.write_text("def f(xs: List[int]) -> int:\n    return len(xs)\n")
    assert main([str(code)]) == 0 and "missing_import" in capsys.readouterr().out
    assert main(["--prompt", str(prompt), str(code)]) == 0
    assert "missing_import" not in capsys.readouterr().out


def test_cli_missing_file(tmp_path, capsys):
    with pytest.raises(DetectInputError):
        main([str(tmp_path / "nope.py")])
    assert cli.main(["detect", str(tmp_path / "nope.py")]) == 2
    assert "DetectInputError" in capsys.readouterr().err

"""Detector bounds: too-large and too-deep input is its own outcome (not clean, not corrupted,
not a crash) in the library, the CLI and the served study; and the glued-name pass that runs on
the repaired program (issue 14, items 4 and 10). Speed is measured in benchmarks/bench_detect.py."""

import json

import pytest

from nvfp4study import cli
from nvfp4study.codeeval import recovery
from nvfp4study.codeeval.bounds import MAX_BYTES, MAX_LINES, MAX_NESTING, check_nesting
from nvfp4study.codeeval.detect import detect_bytes, detect_code, detect_completion, main
from nvfp4study.codeeval.findings import FindingKind, Status
from nvfp4study.codeeval.served_analysis import classify_rows, summarize
from nvfp4study.codeeval.tasks import card_tasks
from nvfp4study.core.errors import CompletionFormatError

# The hostile inputs of issue 14 item 4, and two that the pre-scan cannot see (an expression
# continued over lines, a chain inside an f-string): those reach the parser, whose
# RecursionError/MemoryError is caught.
DEEP = {
    "plus_chain_200k": "x = 1" + "+1" * 200_000 + "\n",
    "attribute_chain_200k": "x = a" + ".a" * 200_000 + "\n",
    "nested_lambdas_3000": "f = " + "lambda: " * 3000 + "1\n",
    "parens_300": "x = " + "(" * 300 + "1" + ")" * 300 + "\n",
    "not_chain_100k": "x = " + "not " * 100_000 + "1\n",
    "call_chain_100k": "x = f" + "()" * 100_000 + "\n",
    "chain_over_lines_19k": "x = (1\n" + "+1\n" * 19_000 + ")\n",
    "chain_in_fstring": 'x = f"{1' + "+1" * 100_000 + '}"\n',
    "pyflakes_depth_600": "x = (1\n" + "+1\n" * 600 + ")\n",
}


@pytest.mark.parametrize("src", DEEP.values(), ids=DEEP.keys())
def test_deep_input_is_too_deep(src):
    det = detect_code(src)
    assert det.status == Status.TOO_DEEP and det.label == "too_deep"
    assert det.unjudged and not det.corrupted and det.reason
    assert [f.kind for f in det.findings] == [FindingKind.TOO_DEEP]
    d = det.to_dict()
    assert d["status"] == "too_deep" and d["reason"] == det.reason


def test_prescan_names_the_line():
    src = "def f(x):\n    return x\n\ny = 1" + "+1" * 5000 + "\n"
    assert check_nesting(src) == f"expression nesting over {MAX_NESTING} at line 4"
    assert detect_code(src).reason.endswith("at line 4")


def test_within_bounds_is_judged():
    # a 150-term chain, 150 nested brackets and a 10k-element literal are ordinary code
    assert detect_code("x = 1" + "+1" * 150 + "\n").status == Status.CLEAN
    assert detect_code("x = " + "[" * 150 + "]" * 150 + "\n").status == Status.CLEAN
    assert detect_code("x = [" + ", ".join(f"({i}, {i} + 1)" for i in range(10_000)) + "]\n").status == Status.CLEAN
    # an unclosed bracket in junk code stays a syntax error, however much code follows
    tail = "".join(f"y{i} = a + b * c - d\n" for i in range(300))
    det = detect_code("x = foo(1,\n" + tail)
    assert det.status == Status.CORRUPTED and FindingKind.SYNTAX_ERROR in det.kinds()


def test_too_large_bytes_and_lines():
    big = "x = 1\n" * (MAX_BYTES // 6 + 1)
    assert len(big) > MAX_BYTES
    for det in (detect_code(big), detect_bytes(big.encode()), detect_completion(big),
                detect_completion("", big), detect_code("pass\n", prompt=big)):
        assert det.status == Status.TOO_LARGE and det.unjudged and not det.corrupted
        assert "1,000,000 bytes" in det.reason
    many = "\n" * MAX_LINES + "x = 1\n"  # short but too many lines
    det = detect_code(many)
    assert det.status == Status.TOO_LARGE and f"over {MAX_LINES:,}" in det.reason
    # non-ASCII counts in bytes, not characters
    wide = "# " + "é" * (MAX_BYTES // 2) + "\n"
    assert len(wide) < MAX_BYTES and detect_code(wide).status == Status.TOO_LARGE
    assert detect_code("x = 1\n" * 1000).status == Status.CLEAN


def test_bounds_win_over_other_findings():
    # a junk fence and invalid UTF-8 were found, but the code itself was not judged
    det = detect_completion("```python\nx = 1" + "+1" * 1000 + "\n```ulp\n")
    assert det.status == Status.TOO_DEEP
    assert [f.kind for f in det.findings] == [FindingKind.JUNK_FENCE, FindingKind.TOO_DEEP]
    det = detect_bytes(b"x = 1\xff" + b"+1" * 1000 + b"\n")
    assert det.status == Status.TOO_DEEP and FindingKind.INVALID_UTF8 in det.kinds()


def test_deep_json_message():
    data = b"[" * 500_000
    assert detect_bytes(data).status == Status.TOO_DEEP  # not a message, then code nested too deep
    with pytest.raises(CompletionFormatError):
        detect_bytes(data, kind="message")
    msg = json.dumps({"content": "```python\nx = a" + ".a" * 5000 + "\n```"}).encode()
    assert detect_bytes(msg).status == Status.TOO_DEEP


def test_cli_status_2_json_and_stderr(tmp_path, capsys):
    deep = tmp_path / "deep.py"
    deep.write_text(DEEP["plus_chain_200k"])
    big = tmp_path / "big.py"
    big.write_bytes(b"x = 1\n" * (MAX_BYTES // 6 + 1))
    bad = tmp_path / "bad.py"
    bad.write_text("seen.add(culp)\n")
    assert main(["--json", str(bad), str(deep), str(big)]) == 2  # unjudged wins over corrupted
    out, err = capsys.readouterr()
    rows = [json.loads(x) for x in out.splitlines()]
    assert [(r["status"], r["reason"] is None) for r in rows] == [
        ("corrupted", True), ("too_deep", False), ("too_large", False)]
    assert f"{deep}: too_deep: expression nesting over {MAX_NESTING}" in err
    assert f"{big}: too_large:" in err
    assert main([str(bad)]) == 1
    capsys.readouterr()
    assert cli.main(["detect", str(deep)]) == 2  # through the command table: no traceback, not 3
    out, err = capsys.readouterr()
    assert "too_deep" in out and "internal error" not in err


def test_served_study_counts_unjudged_not_clean():
    task = card_tasks()[0]
    answers = {"clean": f"```python\n{task.prompt}{task.canonical_solution}```\n",
               "deep": "```python\nx = 1" + "+1" * 200_000 + "\n```\n",
               "large": "```python\n" + "x = 1\n" * (MAX_BYTES // 6 + 1) + "```\n"}
    rows = [{"clamp": "none", "sampling": "s", "task_id": task.task_id, "status": "ok",
             "content": c, "reasoning_content": None, "source": k} for k, c in answers.items()]
    df = classify_rows(rows, {task.task_id: task}, execute=False).set_index("source")
    assert df.loc["clean", "detector"] == "clean" and df.loc["clean", "clean"]
    for k, status in (("deep", "too_deep"), ("large", "too_large")):
        r = df.loc[k]
        assert (r.detector, r.clean, r.corrupted, r.no_code, r.unjudged) == (status, False, False, False, True)
    s = summarize(df.reset_index(), {}).iloc[0]
    assert (s.n, s.clean, s.corrupted, s.unjudged) == (3, 1, 0, 2)


def test_glued_name_seen_only_in_the_repaired_program():
    # the unterminated string on line 2 stops the tokenizer, so the first glued-name pass sees
    # nothing after it; MAX_REPAIRS broken lines use up the recovery before it reaches line
    # MAX_REPAIRS + 3, so that line is never repaired and only the pass on the repaired
    # program finds its glued "ulp"
    n = recovery.MAX_REPAIRS
    code = 'def f(s):\n    x = """abc\n' + "    y = 1 2\n" * n + "    return g(s)ulp\n"
    det = detect_completion(f"Here:\n```python\n{code}```\n")
    glued = [(f.text, f.line) for f in det.findings if f.kind == FindingKind.GLUED_NAME]
    assert glued == [("ulp", n + 3)]
    assert det.label == "glued_name" and det.recovered is False

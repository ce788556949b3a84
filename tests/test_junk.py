"""Junk injection: deterministic, only in the solution, the card's shapes."""

import io
import tokenize

import pytest

from nvfp4study.codeeval.junk import ALL_KINDS, FRAGMENTS, JunkKind, make_variants, wrap_completion

PROMPT = 'from typing import List\n\n\ndef search(arr: List[int], x: int) -> int:\n    """Find x."""\n'
SOLUTION = ("    low, high = 0, len(arr) - 1\n    while low <= high:\n        mid = (low + high) // 2\n"
            "        if arr[mid] < x:\n            low = mid + 1\n        else:\n            high = mid - 1\n"
            "    return low\n")


def test_same_seed_same_variants_other_seed_differs():
    a = make_variants("t/1", PROMPT, SOLUTION, per_kind=2, seed=0)
    b = make_variants("t/1", PROMPT, SOLUTION, per_kind=2, seed=0)
    c = make_variants("t/1", PROMPT, SOLUTION, per_kind=2, seed=1)
    assert a == b and [v.code for v in a] != [v.code for v in c]
    assert len(a) == 2 * len(ALL_KINDS)


def test_junk_only_in_solution_lines_and_prompt_untouched():
    first = PROMPT.count("\n") + 1
    for v in make_variants("t/2", PROMPT, SOLUTION, per_kind=3, seed=5):
        assert v.fragment in FRAGMENTS
        if v.kind is JunkKind.CLOSING_FENCE:
            assert v.code == PROMPT + SOLUTION and f"```{v.fragment}\n" in v.completion
            continue
        assert v.code.startswith(PROMPT) and v.line >= first
        changed = [i for i, (x, y) in enumerate(zip(v.code.split("\n"), (PROMPT + SOLUTION).split("\n"), strict=True), 1) if x != y]
        assert changed == [v.line], v
        assert v.fragment in v.injected_line and v.original_line != v.injected_line


def _tokens(line):
    return [t.string for t in tokenize.generate_tokens(io.StringIO(line.strip() + "\n").readline)
            if t.string.strip()]


@pytest.mark.parametrize("kind", [k for k in ALL_KINDS if k is not JunkKind.CLOSING_FENCE])
def test_shapes(kind):
    for v in make_variants("t/3", PROMPT, SOLUTION, kinds=[kind], per_kind=4, seed=2):
        before, after = _tokens(v.original_line), _tokens(v.injected_line)
        if kind is JunkKind.AFTER_BRACKET:
            i = after.index(v.fragment) if v.fragment in after else None
            assert i is not None and after[i - 1] in (")", "]", "}")
            assert f"){v.fragment}" in v.injected_line or f"]{v.fragment}" in v.injected_line
        elif kind is JunkKind.AFTER_NUMBER:
            assert any(ch.isdigit() for ch in v.injected_line.split(v.fragment)[0][-1:])
        elif kind is JunkKind.SPACED_WORD:
            assert f" {v.fragment}" in v.injected_line and len(after) == len(before) + 1
        elif kind is JunkKind.REPLACE_NUMBER:
            assert len(after) == len(before) and v.site == "number"
        elif kind is JunkKind.REPLACE_IDENTIFIER:
            assert len(after) == len(before) and v.fragment in after
        elif kind is JunkKind.GLUE_IDENTIFIER:
            assert len(after) == len(before) and any(t.endswith(v.fragment) and t != v.fragment for t in after)


def test_no_site_no_variant():
    vs = make_variants("t/4", "def f(s):\n", "    return s.upper()\n", kinds=[JunkKind.AFTER_NUMBER], seed=0)
    assert vs == []


def test_roles_recorded():
    roles = {v.site for v in make_variants("t/5", PROMPT, SOLUTION, kinds=[JunkKind.GLUE_IDENTIFIER], per_kind=50)}
    assert {"name_load", "name_store"} <= roles


def test_wrap_completion():
    assert wrap_completion("x = 1\n", "oly").count("```oly\n") == 1
    assert "```python\nx = 1\n```\n" in wrap_completion("x = 1\n")

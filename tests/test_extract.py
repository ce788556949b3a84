"""Code extraction from chat completions: each case, and F-07's reasoning leaks with clean twins."""

import pytest

from nvfp4study.codeeval.extract import (
    CodeSource,
    TextOrigin,
    ThinkState,
    extract_code,
    extract_message,
    find_blocks,
    strip_think,
)
from nvfp4study.core.errors import CompletionFormatError

FUNC = "def add(a, b):\n    return a + b\n"
COT = ("The user wants a function that adds two numbers. I could use sum() but the plain "
       "operator is clearer. Let me also think about edge cases: none really.\n")


def test_plain_fence():
    ex = extract_code(f"Here you go:\n\n```python\n{FUNC}```\n\nIt adds.", entry_point="add")
    assert (ex.code, ex.source, ex.origin, ex.blocks, ex.lang) == (FUNC, CodeSource.FENCED, TextOrigin.CONTENT, 1, "python")


def test_tilde_fence():
    ex = extract_code(f"~~~python\n{FUNC}~~~\nDone.")
    assert (ex.code, ex.source) == (FUNC, CodeSource.FENCED)


def test_longer_fence_keeps_inner_backticks():
    body = 's = """\n```\n"""\n' + FUNC
    ex = extract_code(f"````python\n{body}````\n")
    assert (ex.code, ex.source) == (body, CodeSource.FENCED)


def test_fence_inside_list_item_is_dedented():
    ex = extract_code("1. First:\n   ```python\n   x = 1\n   ```\n2. Then run it.\n")
    assert (ex.code, ex.source) == ("x = 1\n", CodeSource.FENCED)


def test_unclosed_fence_runs_to_end():
    ex = extract_code(f"Sure:\n```python\n{FUNC}")
    assert (ex.code, ex.source, ex.form) == (FUNC, CodeSource.UNCLOSED_FENCE, CodeSource.UNCLOSED_FENCE)


def test_junk_on_closing_fence_is_cut_and_recorded():
    text = f"Here:\n```python\n{FUNC}```culp\n\nThis adds two numbers.\n"
    ex = extract_code(text, entry_point="add")
    assert ex.code == FUNC  # not the swallowed prose
    assert ex.source == CodeSource.JUNK_FENCE and ex.fence_junk == ("culp",)


def test_junk_fence_clean_twin():
    ex = extract_code(f"Here:\n```python\n{FUNC}```\n\nThis adds two numbers.\n", entry_point="add")
    assert (ex.code, ex.source, ex.fence_junk) == (FUNC, CodeSource.FENCED, ())


def test_junk_fence_swallowed_blocks_are_recovered():
    # unclosed swallowed block stays unclosed
    tail = find_blocks(f"```python\n{FUNC}```ulp\n```python\nx = 1\n")
    assert [b.kind for b in tail] == [CodeSource.JUNK_FENCE, CodeSource.UNCLOSED_FENCE]
    # After "```ulp" CommonMark keeps the block open; the next "```python" line does not close
    # it either, and the final "```" does: the usage block is inside the swallowed text.
    text = f"```python\n{FUNC}```ulp\nUsage:\n```python\nprint(add(1, 2))\n```\n"
    blocks = find_blocks(text)
    assert [b.kind for b in blocks] == [CodeSource.JUNK_FENCE, CodeSource.FENCED]
    assert blocks[0].fence_junk == "ulp" and blocks[1].code == "print(add(1, 2))\n"


def test_language_tag_after_fence_inside_block_is_not_junk():
    # a model that opens a second block without closing the first: "```python" is no junk
    text = f"```python\n{FUNC}```python\nprint(1)\n```\n"
    blocks = find_blocks(text)
    assert [(b.code, b.kind, b.fence_junk) for b in blocks] == [
        (FUNC, CodeSource.FENCED, ""), ("print(1)\n", CodeSource.FENCED, "")]
    ex = extract_code(text, entry_point="add")
    assert (ex.code, ex.fence_junk, ex.source) == (FUNC, (), CodeSource.FENCED)


def test_several_blocks_entry_point_wins_over_longer_usage():
    usage = "".join(f"print(add({i}, {i}))\n" for i in range(6))
    text = f"```python\n{FUNC}```\nExample:\n```python\n{usage}```\n"
    ex = extract_code(text, entry_point="add")
    assert (ex.code, ex.chosen_by, ex.blocks) == (FUNC, "entry_point", 2)


def test_several_defining_blocks_last_one_wins():
    better = "def add(a, b):\n    return b + a\n"
    ex = extract_code(f"```python\n{FUNC}```\nImproved:\n```python\n{better}```\n", entry_point="add")
    assert ex.code == better


def test_without_entry_point_longest_python_block():
    text = f"```bash\npip install nothing\nmore\nlines\nhere\n```\n```python\n{FUNC}```\n```python\nx = 1\n```\n"
    ex = extract_code(text)
    assert (ex.code, ex.chosen_by) == (FUNC, "longest")


def test_indented_code_block():
    ex = extract_code("Code:\n\n    x = 1\n    y = x\n")
    assert (ex.code, ex.source) == ("x = 1\ny = x\n", CodeSource.INDENTED)


def test_bare_code_stops_at_trailing_prose():
    ex = extract_code(FUNC + "\nThis function returns the sum of its arguments.\n")
    assert (ex.code, ex.source) == (FUNC, CodeSource.BARE)


def test_no_code():
    ex = extract_code("I am sorry, I cannot help with that.")
    assert (ex.code, ex.source, ex.origin, ex.chosen_by) == ("", CodeSource.NONE, TextOrigin.NONE, "none")
    assert extract_code(None).source == CodeSource.NONE


def test_closed_think_section_is_removed():
    text = f"<think>\nmaybe:\n```python\ndef add(a, b):\n    return 0\n```\n</think>\n```python\n{FUNC}```\n"
    ex = extract_code(text, entry_point="add")
    assert (ex.code, ex.think, ex.source) == (FUNC, ThinkState.CLOSED, CodeSource.FENCED)


def test_unclosed_think_gives_no_code():
    ex = extract_code(f"<think>\nI will write:\n```python\n{FUNC}```\n")
    assert ex.source == CodeSource.NONE


# --- F-07 (i): chain of thought in content, a stray </think>, then the answer ----------------
def test_f07_i_stray_think_close():
    ex = extract_code(f"{COT}</think>\n\n```python\n{FUNC}```\n", entry_point="add")
    assert ex.code == FUNC
    assert (ex.source, ex.origin, ex.think) == (CodeSource.AFTER_STRAY_THINK, TextOrigin.AFTER_STRAY_THINK, ThinkState.STRAY)


def test_f07_i_chain_of_thought_code_is_not_taken():
    draft = "def add(a, b):\n    return sum([a, b])\n"
    ex = extract_code(f"{COT}```python\n{draft}```\n</think>\n```python\n{FUNC}```\n", entry_point="add")
    assert ex.code == FUNC


def test_f07_i_clean_twin():
    ex = extract_code(f"```python\n{FUNC}```\n", entry_point="add")
    assert (ex.code, ex.source, ex.think) == (FUNC, CodeSource.FENCED, ThinkState.NONE)


# --- F-07 (ii): content "" and the answer in reasoning_content -----------------------------------
def test_f07_ii_answer_in_reasoning_content():
    ex = extract_code("", f"Here:\n```python\n{FUNC}```\n", entry_point="add")
    assert (ex.code, ex.source, ex.origin, ex.form) == (
        FUNC, CodeSource.REASONING_CONTENT, TextOrigin.REASONING_CONTENT, CodeSource.FENCED)


def test_f07_ii_clean_twin_content_first():
    ex = extract_code(f"```python\n{FUNC}```\n", "some reasoning\n```python\nx = 1\n```\n", entry_point="add")
    assert (ex.code, ex.source, ex.origin) == (FUNC, CodeSource.FENCED, TextOrigin.CONTENT)


def test_f07_ii_junk_fence_in_reasoning_content_keeps_both_facts():
    ex = extract_code("", f"```python\n{FUNC}```oly\n")
    assert ex.source == CodeSource.JUNK_FENCE and ex.origin == TextOrigin.REASONING_CONTENT


def test_extract_message_shapes():
    msg = {"role": "assistant", "content": "", "reasoning_content": f"```python\n{FUNC}```"}
    assert extract_message(msg).source == CodeSource.REASONING_CONTENT
    resp = {"choices": [{"message": {"content": f"```python\n{FUNC}```"}}]}
    assert extract_message(resp).code == FUNC
    with pytest.raises(CompletionFormatError):
        extract_message({"text": "x"})
    with pytest.raises(CompletionFormatError):
        extract_message({"choices": []})
    with pytest.raises(CompletionFormatError):
        extract_message({"content": 42})
    parts = {"content": [{"type": "text", "text": "```python\n"}, {"type": "text", "text": FUNC + "```"}]}
    assert extract_message(parts).code == FUNC


def test_strip_think_states():
    assert strip_think("a<think>b</think>c") == ("ac", ThinkState.CLOSED)
    assert strip_think("cot</think>ans") == ("ans", ThinkState.STRAY)
    assert strip_think("ans<think>cot") == ("ans", ThinkState.UNCLOSED)
    assert strip_think("ans") == ("ans", ThinkState.NONE)


def test_to_dict_is_json_ready():
    import json

    d = extract_code(f"```python\n{FUNC}```culp\n").to_dict()
    assert json.loads(json.dumps(d))["source"] == "junk_fence" and d["fence_junk"] == ["culp"]

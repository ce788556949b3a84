"""Tasks: HumanEval offline, the card-style tasks, the chat prompt."""

from __future__ import annotations

import ast
import socket

import pytest

from nvfp4study.codeeval.sandbox import Outcome, check_many
from nvfp4study.codeeval.tasks import (
    CARD_TASK_IDS,
    HUMANEVAL_SIZE,
    card_tasks,
    chat_messages,
    chat_template_kwargs,
    humaneval_tasks,
    load_tasks,
)
from nvfp4study.core.errors import TaskSelectionError
from nvfp4study.core.params import SandboxParams


def test_humaneval_loads_offline(monkeypatch):
    def no_network(*a, **k):
        raise AssertionError("network access while loading HumanEval")

    monkeypatch.setattr(socket, "socket", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    tasks = humaneval_tasks()
    assert len(tasks) == HUMANEVAL_SIZE == 164
    assert [t.task_id for t in tasks] == [f"HumanEval/{i}" for i in range(164)]
    assert all(t.source == "humaneval" for t in tasks)
    assert tasks[0].entry_point == "has_close_elements"
    assert tasks[163].entry_point == "generate_integers"
    assert all("def check(candidate)" in t.test for t in tasks)
    assert all(f"def {t.entry_point}" in t.prompt for t in tasks)


def test_humaneval_prompts_with_imports():
    # 23 of the 164 prompts contain import lines: 22 at top level plus
    # HumanEval/115, whose `import math` sits inside the function before its docstring.
    tasks = humaneval_tasks()

    def imports(t, nodes):
        return any(isinstance(n, ast.Import | ast.ImportFrom) for n in nodes(ast.parse(t.prompt)))

    anywhere = [t.task_id for t in tasks if imports(t, ast.walk)]
    top = [t.task_id for t in tasks if imports(t, lambda tree: tree.body)]
    assert len(anywhere) == 23 and len(top) == 22
    assert set(anywhere) - set(top) == {"HumanEval/115"}


def test_load_tasks_order_and_selection():
    tasks = load_tasks(5, True)
    ids = [t.task_id for t in tasks]
    assert ids[:15] == list(CARD_TASK_IDS)
    assert ids[15:] == [f"HumanEval/{i}" for i in range(5)]
    assert len(set(ids)) == len(ids) == 20
    assert [t.task_id for t in load_tasks(3, False)] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    assert load_tasks(0, False) == []
    assert len(load_tasks(0, True)) == 15


@pytest.mark.parametrize("count", [-1, 165, 1000])
def test_load_tasks_rejects_bad_count(count):
    with pytest.raises(TaskSelectionError, match="0..164"):
        load_tasks(count, True)


def test_card_tasks_shape():
    tasks = card_tasks()
    assert len(tasks) == 15
    assert [t.task_id for t in tasks][:3] == ["card/binary_search", "card/is_balanced", "card/dedupe"]
    for t in tasks:
        assert t.source == "card"
        assert t.task_id == f"card/{t.entry_point}"
        assert f"def {t.entry_point}(" in t.prompt
        assert t.test.startswith("def check(candidate):")
        assert t.canonical_solution.startswith("    ")
        compile(t.prompt + t.canonical_solution + "\n" + t.test, t.task_id, "exec")


def test_card_reference_solutions_pass_and_tests_can_fail():
    """Each reference solution passes its checks (in the sandbox), and a wrong body fails
    every one of them, so no check is vacuous."""
    tasks = card_tasks()
    params = SandboxParams(timeout_s=10)
    good = check_many([(t, t.canonical_solution) for t in tasks], params)
    assert [r.outcome for r in good] == [Outcome.PASS] * 15, [
        (r.task_id, r.outcome, r.message) for r in good if not r.passed]
    bad = check_many([(t, "    return None\n") for t in tasks], params)
    assert all(r.outcome == Outcome.ASSERTION_FAILURE for r in bad), [
        (r.task_id, r.outcome) for r in bad]


def test_chat_messages():
    t = card_tasks()[0]
    on, off = chat_messages(t, thinking=True), chat_messages(t, thinking=False)
    assert on == off  # thinking is switched by the template kwargs only
    assert len(on) == 1 and on[0]["role"] == "user"
    text = on[0]["content"]
    assert "```python\n" in text and t.prompt.rstrip() in text and "code block" in text
    assert chat_template_kwargs(True) == {"enable_thinking": True}
    assert chat_template_kwargs(False) == {"enable_thinking": False}

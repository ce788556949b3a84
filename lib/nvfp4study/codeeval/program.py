"""What is sent into the sandbox: the program (prompt + code) and the runner that executes it.

:func:`build_program` assembles the program from the task's prompt and the generated code. The
harness sends it, with the task's test and the limits, as one JSON job on stdin to
:data:`RUNNER`, a small script run by the sandbox's ``python -I``. The runner sets the rlimits,
compiles and runs the program, looks up the entry point, defines ``check`` and calls it, and
classifies what was raised (the values of :class:`nvfp4study.codeeval.sandbox.Outcome`). It
writes one JSON line with a per-run nonce to a private pipe (:func:`result_line` reads it
back), taking its own references to ``os.write``/``os._exit``/``json.dumps`` first: the line is
protected against accidents (a program that exits, prints, closes stdout, or monkeypatches
``os``), not against code written to forge the protocol.
"""

from __future__ import annotations

import ast
import json
from typing import Any

from .tasks import Task

# Executed inside the sandbox by the sandbox's python -I.
RUNNER = r'''
import json, os, resource, sys, traceback
_write, _exit, _dumps = os.write, os._exit, json.dumps
job = json.loads(sys.stdin.buffer.read().decode("utf-8"))
RFD, NONCE = job["result_fd"], job["nonce"]
for _key, (_soft, _hard) in job["limits"].items():
    try:
        resource.setrlimit(getattr(resource, _key), (_soft, _hard))
    except (ValueError, OSError, AttributeError):
        pass
_null = os.open(os.devnull, os.O_RDONLY)
os.dup2(_null, 0)
os.close(_null)

def _lineno(exc):
    line = getattr(exc, "lineno", None) if isinstance(exc, SyntaxError) else None
    for frame, lno in traceback.walk_tb(exc.__traceback__):
        if frame.f_code.co_filename == "<candidate>":
            line = lno
    return line

def _report(outcome, phase, exc=None):
    rec = {"nonce": NONCE, "outcome": outcome, "phase": phase, "exception": None,
           "name": None, "message": "", "lineno": None}
    if exc is not None:
        rec["exception"] = type(exc).__name__
        try:
            rec["message"] = str(exc)[:300]
        except BaseException:
            rec["message"] = "<unprintable>"
        rec["lineno"] = _lineno(exc)
        if isinstance(exc, NameError):
            rec["name"] = getattr(exc, "name", None)
            if rec["name"] is None:  # UnboundLocalError carries no .name (3.11)
                import re
                m = re.search(r"'([A-Za-z_][A-Za-z0-9_]*)'", rec["message"])
                rec["name"] = m.group(1) if m else None
        try:
            traceback.print_exception(type(exc), exc, exc.__traceback__, limit=8)
        except BaseException:
            pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    try:
        _write(RFD, (_dumps(rec) + "\n").encode())
    finally:
        _exit(0)

def _classify(exc):
    if isinstance(exc, SystemExit):
        return "exited"
    if isinstance(exc, AssertionError):
        return "assertion_failure"
    if isinstance(exc, NameError):
        return "name_error"
    if isinstance(exc, MemoryError):
        return "memory"
    return "exception"

ns = {"__name__": "candidate", "__builtins__": __builtins__}
try:
    code = compile(job["program"], "<candidate>", "exec")
except BaseException as exc:
    _report("syntax_error" if isinstance(exc, SyntaxError) else _classify(exc), "define", exc)
try:
    exec(code, ns)
except BaseException as exc:
    _report(_classify(exc), "define", exc)
fn = ns.get(job["entry_point"])
if not callable(fn):
    _report("entry_point_missing", "entry")
try:
    exec(compile(job["test"], "<test>", "exec"), ns)
except BaseException as exc:
    _report(_classify(exc), "test", exc)
try:
    ns["check"](fn)
except BaseException as exc:
    _report(_classify(exc), "check", exc)
_report("pass", "check")
'''


def prompt_preamble(task: Task) -> str:
    """The task's prompt without the entry point's own ``def`` (imports, constants and helper
    functions stay). Falls back to the whole prompt when it does not parse."""
    try:
        tree = ast.parse(task.prompt)
    except SyntaxError:
        return task.prompt
    lines = task.prompt.splitlines(keepends=True)
    drop: set[int] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == task.entry_point:
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            drop.update(range(first - 1, node.end_lineno or node.lineno))
    return "".join(line for i, line in enumerate(lines) if i not in drop)


def build_program(task: Task, code: str, prepend_prompt: bool = True) -> str:
    """The program that is executed.

    * ``code`` whose first non-blank line is indented is a body completing the prompt's function (HumanEval's
      canonical solutions): ``prompt + code``.
    * any other ``code`` is a full program: :func:`prompt_preamble` (the prompt's imports and
      helpers, e.g. 23 HumanEval prompts import from ``typing`` and HumanEval/10 defines
      ``is_palindrome``, but NOT the entry point's docstring-only ``def``), then ``code``. So
      junk on the function's name (``def binary_searchulp``) leaves the entry point undefined
      and is reported as ``entry_point_missing``, not hidden by the prompt's stub.
    * ``prepend_prompt=False``: ``code`` alone.
    """
    return assemble(task, code, prepend_prompt)[0]


def assemble(task: Task, code: str, prepend_prompt: bool) -> tuple[str, int]:
    """(program, number of program lines before ``code``'s first line)."""
    if not prepend_prompt:
        return code, 0
    first = next((line for line in code.splitlines() if line.strip()), "")
    if first[:1] in (" ", "\t"):
        prompt = task.prompt if task.prompt.endswith("\n") else task.prompt + "\n"
        return prompt + code, prompt.count("\n")
    preamble = prompt_preamble(task).rstrip()
    if not preamble:
        return code, 0
    return f"{preamble}\n\n{code}", preamble.count("\n") + 2


def result_line(data: bytes, nonce: str) -> dict[str, Any] | None:
    """The runner's JSON record carrying ``nonce`` among the bytes read from the pipe, or None."""
    for line in data.decode("utf-8", errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and rec.get("nonce") == nonce:
            return rec
    return None

"""Classify generated code for junk tokens: the detector's entry points and ``nvfp4study detect``.

The model card detects corruption with "an AST check for identifiers that are loaded but never
bound" and warns that a non-ASCII scan misses the junk (ulp, oly, culp, Advisory are ASCII).
This detector implements that check with pyflakes and adds what an AST check cannot see on
code that does not parse. One completion goes through:

1. extraction of the code from Markdown / a chat message (:mod:`nvfp4study.codeeval.extract`;
   a junk token on a closing fence becomes a ``junk_fence`` finding);
2. character and token scans (:mod:`nvfp4study.codeeval.token_scan`: invalid UTF-8, control
   characters, glued names, non-ASCII);
3. parsing with syntax recovery (:mod:`nvfp4study.codeeval.recovery`: one ``syntax_error``
   finding per error, the rest of the program still checked);
4. pyflakes' undefined names on the (repaired) tree (:mod:`nvfp4study.codeeval.undefined`).

The finding classes and the rule that turns them into *clean* / *corrupted* / *no_code* are in
:mod:`nvfp4study.codeeval.findings`.

**Scope.** With ``prompt`` given, names the prompt binds at module level (its imports,
functions, classes, assignments) are in scope, because the harness runs the completion with the
prompt's context; a body-only completion (first code line indented) is checked appended to the
prompt. Not detectable statically (execution catches some): junk on an attribute
(``seen.addculp``), a function or parameter name, a keyword argument, inside a string, or a junk
word that happens to be bound.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from ..core.errors import CompletionFormatError, DetectInputError
from .bounds import MAX_BYTES, check_nesting, check_size
from .extract import Extraction, extract_code, extract_message
from .findings import Detection, DetectorFinding, FindingKind, status_of
from .recovery import recover
from .token_scan import char_findings, decode, glued_names, non_ascii
from .undefined import prompt_bindings, undefined_names


def detect_code(code: str, prompt: str | None = None, *, source: str = "bare",
                pre: list[DetectorFinding] | None = None) -> Detection:
    """Classify one piece of (already extracted) Python code.

    Args:
        code: the program text.
        prompt: the task prompt; its module-level names are in scope. If ``code`` is body-only
            (its first code line is indented) it is checked appended to the prompt, and line
            numbers stay those of ``code``.
        source: recorded as :attr:`Detection.source`.
        pre: findings already made upstream (decoding, extraction), kept first.

    Returns:
        A :class:`Detection`; never raises on bad code. Code (or a prompt) over the size bounds
        of :mod:`nvfp4study.codeeval.bounds` is ``too_large`` before any pass runs; code nested
        over its bound, or on which the parser or pyflakes runs out of recursion, ``too_deep``.
    """
    findings = list(pre or [])
    why = check_size(code, "code") or (check_size(prompt, "prompt") if prompt else None)
    if why:
        return _unjudged(FindingKind.TOO_LARGE, why, findings, code, source)
    code, chars = char_findings(code)
    findings += chars
    if not code.strip():
        findings.append(DetectorFinding(FindingKind.NO_CODE, None, None, ""))
        return Detection(status_of(findings), findings, code, source, False, None)
    offset = 0
    checked = code
    if prompt:
        first = next((ln for ln in code.split("\n") if ln.strip() and not ln.lstrip().startswith("#")), "")
        if first[:1] in (" ", "\t"):
            head = prompt if prompt.endswith("\n") else prompt + "\n"
            offset = head.count("\n")
            checked = head + code
    why = check_nesting(checked)  # prompt and code are each within the size bounds
    if why:
        return _unjudged(FindingKind.TOO_DEEP, why, findings, code, source)
    try:
        return _checks(code, checked, prompt if not offset else None, offset, findings, source)
    except (RecursionError, MemoryError) as exc:
        # deeper than the bound caught (an expression continued over lines, an f-string):
        # CPython's parser and pyflakes recurse; both fail fast on such input
        return _unjudged(FindingKind.TOO_DEEP, f"{type(exc).__name__} in the parser or pyflakes: "
                         "nested too deep", findings, code, source)


def _checks(code: str, checked: str, scope_prompt: str | None, offset: int,
            findings: list[DetectorFinding], source: str) -> Detection:
    """Steps 2-4 of the module docstring on ``checked`` (``code``, or the prompt + ``code``)."""
    scope = prompt_bindings(scope_prompt) if scope_prompt else set()

    def shift(fs: list[DetectorFinding]) -> list[DetectorFinding]:
        return [DetectorFinding(f.kind, f.line - offset, f.col, f.text, f.detail) for f in fs
                if f.line is None or f.line > offset]

    findings += shift(glued_names(checked))
    na, in_text = non_ascii(checked)
    findings += shift(na)
    tree, syn, repaired = recover(checked)
    findings += shift(syn)
    if syn:
        # tokens past a tokenizer error were not seen: look again on the repaired program
        seen = {(f.line, f.col, f.text) for f in findings}
        findings += [f for f in shift(glued_names(repaired)) if (f.line, f.col, f.text) not in seen]
    if tree is not None:
        findings += shift(undefined_names(tree, scope))
    in_prompt_text = non_ascii(checked[: len(checked) - len(code)])[1] if offset else 0
    return Detection(status_of(findings), findings, code, source, parsed=not syn,
                     recovered=None if not syn else tree is not None,
                     non_ascii_in_text=in_text - in_prompt_text)


def _unjudged(kind: FindingKind, why: str, findings: list[DetectorFinding], code: str,
              source: str) -> Detection:
    """A ``too_large`` / ``too_deep`` verdict: the bound's finding after those already made."""
    findings = [*findings, DetectorFinding(kind, None, None, "", why)]
    return Detection(status_of(findings), findings, code, source, parsed=False, recovered=None)


def detect_completion(content: str | None, reasoning_content: str | None = None, *,
                      prompt: str | None = None, entry_point: str | None = None) -> Detection:
    """Extract the code of a chat completion (:func:`nvfp4study.codeeval.extract.extract_code`) and
    classify it. A junk closing fence becomes a ``junk_fence`` finding; no code, ``no_code``;
    a content or reasoning text over :data:`~nvfp4study.codeeval.bounds.MAX_BYTES` /
    ``MAX_LINES``, ``too_large`` (before extraction)."""
    for what, text in (("content", content), ("reasoning_content", reasoning_content)):
        why = check_size(text, what) if text else None
        if why:
            return _unjudged(FindingKind.TOO_LARGE, why, [], "", "none")
    ex = extract_code(content, reasoning_content, entry_point)
    return _detect_extraction(ex, prompt)


def _detect_extraction(ex: Extraction, prompt: str | None, pre: list[DetectorFinding] | None = None) -> Detection:
    pre = list(pre or [])
    pre += [DetectorFinding(FindingKind.JUNK_FENCE, None, None, j, "text after a closing fence")
            for j in ex.fence_junk]
    det = detect_code(ex.code, prompt, source=str(ex.source), pre=pre)
    det.extraction = {k: v for k, v in ex.to_dict().items() if k != "code"}
    return det


def detect_bytes(data: bytes, *, kind: str = "auto", prompt: str | None = None,
                 entry_point: str | None = None) -> Detection:
    """Classify raw file contents: code or a raw completion.

    Args:
        data: the bytes (invalid UTF-8 is its own finding; the rest is still checked).
        kind: ``code``, ``completion`` (Markdown text), ``message`` (JSON chat message or
            response), or ``auto``: JSON object with ``content``/``choices`` -> message; text
            with a fence or think tag -> completion; else code.
        prompt, entry_point: as in :func:`detect_code` / :func:`detect_completion`.

    Raises:
        CompletionFormatError: ``kind="message"`` and the data is not a JSON chat message.
    """
    if len(data) > MAX_BYTES:  # before decoding or parsing anything
        return _unjudged(FindingKind.TOO_LARGE, f"input is over {MAX_BYTES:,} bytes", [], "", "file")
    text, pre = decode(data)
    if kind in ("auto", "message"):
        msg = None
        if text.lstrip().startswith("{"):
            try:
                msg = json.loads(text)
            except (ValueError, RecursionError):  # RecursionError: JSON nested too deep
                msg = None
        if isinstance(msg, dict) and ({"content", "reasoning_content", "choices"} & set(msg)):
            return _detect_extraction(extract_message(msg, entry_point), prompt, pre)
        if kind == "message":
            raise CompletionFormatError("not a JSON chat message (object with 'content' or 'choices')")
        kind = "completion" if re.search(r"```|~~~|</?think>", text, re.I) else "code"
    if kind == "completion":
        return _detect_extraction(extract_code(text, None, entry_point), prompt, pre)
    return detect_code(text, prompt, source="file", pre=pre)


def non_ascii_scan(text: str) -> bool:
    """The naive check the card warns against: any character above U+007F anywhere."""
    return not text.isascii()


# --- CLI -------------------------------------------------------------------------------------
def _fmt(path: str, det: Detection) -> str:
    head = f"{path}: {det.status} ({det.reason or det.label}; code from {det.source})"
    rows = [head]
    for f in det.findings:
        where = f"line {f.line}" if f.line is not None else "-"
        rows.append(f"  {f.kind:<16} {where:<9} {f.text!r}" + (f"  [{f.detail}]" if f.detail else ""))
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    """``nvfp4study detect``: classify files of code or raw completion text.

    Exit status: 2 when any file could not be judged (``too_large`` / ``too_deep``: over the
    detector's bounds, :mod:`nvfp4study.codeeval.bounds`; its line says why, and one line on
    stderr names it), else 1 when any is corrupted, else 0 (every file clean or without code).
    An unjudged file is bad input, neither a finding (1) nor a crash (3).

    Raises:
        DetectInputError: a file or the prompt file cannot be read.
    """
    args = _parser().parse_args(argv)
    prompt = None
    if args.prompt:
        prompt = _read(args.prompt).decode("utf-8", errors="replace")
    any_corrupt = any_unjudged = False
    for name in args.files:
        try:
            det = detect_bytes(_read(name), kind=args.kind, prompt=prompt, entry_point=args.entry_point)
        except CompletionFormatError as exc:
            raise CompletionFormatError(f"{name}: {exc}") from None
        any_corrupt |= det.corrupted
        any_unjudged |= det.unjudged
        print(json.dumps({"file": name, **det.to_dict()}) if args.json else _fmt(name, det))
        if det.unjudged:
            print(f"nvfp4study detect: {name}: {det.status}: {det.reason}", file=sys.stderr)
    return 2 if any_unjudged else 1 if any_corrupt else 0


def _parser() -> argparse.ArgumentParser:
    """``nvfp4study detect``'s options and help text."""
    ap = argparse.ArgumentParser(
        prog="nvfp4study detect",
        description="Classify generated code for junk tokens (undefined names, glued names, "
                    "syntax errors, junk fences, invalid UTF-8, non-ASCII).",
        epilog="exit status: 0 clean (or no code), 1 when any file is corrupted, 2 bad input "
               "(including a file too large or too deeply nested to judge: too_large / too_deep). "
               "example: nvfp4study detect --json --prompt prompt.py answer.md code.py",
    )
    ap.add_argument("files", nargs="+", metavar="FILE", help="code, Markdown completion, or JSON chat message")
    ap.add_argument("--json", action="store_true", help="print one JSON object per file (JSON Lines)")
    ap.add_argument("--prompt", metavar="FILE", help="task prompt whose imports/definitions are in scope")
    ap.add_argument("--entry-point", help="function the task asks for (chooses among code blocks)")
    ap.add_argument("--as", dest="kind", choices=["auto", "code", "completion", "message"],
                    default="auto", help="how to read the files (default: auto)")
    return ap


def _read(name: str) -> bytes:
    p = Path(name)
    try:
        return sys.stdin.buffer.read() if name == "-" else p.read_bytes()
    except OSError as exc:
        raise DetectInputError(f"cannot read {name}: {exc.strerror or exc}") from exc


__all__ = ["detect_bytes", "detect_code", "detect_completion", "main", "non_ascii_scan"]

"""Syntax recovery: parse code that junk made unparsable, one repaired line per error.

On a syntax error the offending line is repaired and parsing repeated (at most
:data:`MAX_REPAIRS` times), so the rest of the program is still checked: first the glued NAME
tokens on that line are removed (:func:`nvfp4study.codeeval.token_scan.glued_names`), then the
NAME at the error column, then the line becomes ``pass`` (or ``if True:`` when it opens a
block), then it is blanked. A repair is accepted when the program parses or the next error is
on a later line. Lines are never added or removed, so the repaired program's line numbers are
the original ones.
"""

from __future__ import annotations

import ast
import keyword
import re

from .findings import DetectorFinding, FindingKind
from .token_scan import glued_names

MAX_REPAIRS = 25


def _error_line(exc: SyntaxError | ValueError, nlines: int) -> int | None:
    ln = getattr(exc, "lineno", None)
    if not isinstance(ln, int) or ln < 1:
        return None
    return min(ln, nlines)


def _repairs(line: str, col: int | None) -> list[tuple[str, str]]:
    """Candidate replacements of one broken line, in order, as (new_line, removed_text)."""
    out: list[tuple[str, str]] = []
    body = line.rstrip("\n")
    glued = sorted(glued_names(body.strip() + "\n"), key=lambda f: -(f.col or 0))
    if glued:
        indent = len(body) - len(body.lstrip())
        fixed = body
        for f in glued:
            at = indent + (f.col or 0)
            fixed = fixed[:at] + fixed[at + len(f.text):]
        out.append((fixed, " ".join(f.text for f in glued)))
    if col is not None and 0 <= col < len(body):
        start = col
        while start > 0 and (body[start - 1].isalnum() or body[start - 1] == "_"):
            start -= 1
        m = re.match(r"[A-Za-z_]\w*", body[start:])
        if m and not keyword.iskeyword(m.group()):
            out.append((body[:start] + body[start + len(m.group()):], m.group()))
    indent = body[: len(body) - len(body.lstrip())]
    out.append((indent + ("if True:" if body.rstrip().endswith(":") else "pass"), body.strip()))
    out.append(("", body.strip()))
    return out


def recover(code: str) -> tuple[ast.Module | None, list[DetectorFinding], str]:
    """Parse ``code``, repairing one line per syntax error (see the module docstring).

    Returns:
        ``(tree, findings, repaired)``: the tree of the repaired program (None if it never
        parsed), one ``syntax_error`` finding per error met (``detail`` says what the repair
        removed), and the repaired source (same line numbers as ``code``).
    """
    lines = code.split("\n")
    findings: list[DetectorFinding] = []
    for _ in range(MAX_REPAIRS):
        src = "\n".join(lines)
        try:
            return ast.parse(src), findings, src
        except (SyntaxError, ValueError) as exc:
            ln = _error_line(exc, len(lines))
            msg = getattr(exc, "msg", None) or str(exc)
            if ln is None:
                # e.g. a NUL byte (ValueError on 3.11): nothing to point at.
                findings.append(DetectorFinding(FindingKind.SYNTAX_ERROR, None, None, msg, "unrepairable"))
                return None, findings, src
            offset = getattr(exc, "offset", None)
            col = offset - 1 if isinstance(offset, int) and offset > 0 else None
            accepted = None
            for new, removed in _repairs(lines[ln - 1], col):
                trial = lines[: ln - 1] + [new] + lines[ln:]
                try:
                    ast.parse("\n".join(trial))
                    accepted = (trial, removed)
                    break
                except (SyntaxError, ValueError) as exc2:
                    ln2 = _error_line(exc2, len(trial))
                    if ln2 is not None and ln2 > ln:
                        accepted = (trial, removed)
                        break
            findings.append(DetectorFinding(FindingKind.SYNTAX_ERROR, ln, col, msg,
                                    f"repair removed {accepted[1]!r}" if accepted else "unrepairable"))
            if accepted is None:
                return None, findings, src
            lines = accepted[0]
    return None, findings, "\n".join(lines)


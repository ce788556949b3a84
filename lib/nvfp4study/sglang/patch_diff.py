"""The exact unified-diff applier of the study's SGLang patch sets (:mod:`nvfp4study.sglang.patch`):
no fuzz, no offset, so a patch lands only on the bytes it was made from."""

from __future__ import annotations

import re

from ..core.errors import PatchConflict

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def apply_unified_diff(text: str, diff: str, reverse: bool = False) -> str:
    """Apply a unified diff to ``text`` exactly (no fuzz, no offset); ``reverse`` undoes it.

    Raises:
        PatchConflict: a context or removed line does not match.
    """
    lines = text.splitlines(True)
    out: list[str] = []
    pos = 0
    dl = diff.splitlines(True)
    i = 0
    while i < len(dl):
        m = _HUNK.match(dl[i])
        if not m:
            i += 1
            continue
        start = int(m.group(3 if reverse else 1))
        count = int(m.group(4 if reverse else 2) or 1)
        start = start - 1 if count else start
        out.extend(lines[pos:start])
        pos = start
        i += 1
        while i < len(dl) and not dl[i].startswith("@@"):
            tag, body = dl[i][:1], dl[i][1:]
            if tag == "\\":
                i += 1
                continue
            old_tag, new_tag = ("+", "-") if reverse else ("-", "+")
            if tag == " " or tag == old_tag:
                if pos >= len(lines) or lines[pos] != body:
                    raise PatchConflict(f"line {pos + 1} does not match the patch context")
                pos += 1
                if tag == " ":
                    out.append(body)
            elif tag == new_tag:
                out.append(body)
            i += 1
    out.extend(lines[pos:])
    return "".join(out)

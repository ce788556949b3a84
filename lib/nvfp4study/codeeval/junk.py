"""Inject the model card's kinds of junk token into clean code, deterministically from a seed.

The card shows what a missing SwiGLU clamp does to generated code: a short ASCII fragment
wins one decoding step and the text carries on::

    stack.append(c)ulp              # glued after a bracket
    high = len(arr) -  Advisory     # a fragment where a number (or name) belonged
    elif arr[mid] < x Advisory:     # a fragment inserted as a separate word
    seen.add(culp)                  # a fragment replacing an identifier

and fault F-06 (junk spliced into generated code, which the detector must flag while passing
each line's clean twin) adds ``count += 1eville`` (glued after a number). The fragments are
:data:`FRAGMENTS` (the card's ulp, oly, culp, Advisory; F-06's eville). Each
:class:`JunkKind` is one of these shapes, applied at one token of the *solution* part of a
program (never the prompt), chosen with ``random.Random(f"{seed}|{task_id}|{kind}")`` so a seed
gives the same variants on every machine and Python (string seeds are hashed with SHA-512,
independent of ``PYTHONHASHSEED``).

Every variant is junk by construction (the positive class of the detector validation),
including the ones no static check can see (a fragment glued onto an attribute or a parameter
name): :attr:`JunkVariant.site` records the role of the token that was hit, so misses can be
attributed.
"""

from __future__ import annotations

import ast
import io
import keyword
import random
import tokenize
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

# The card's junk tokens ("ulp, oly, culp, Advisory") and F-06's "eville".
FRAGMENTS: tuple[str, ...] = ("ulp", "oly", "culp", "Advisory", "eville")


class JunkKind(StrEnum):
    """Shapes of junk (module docstring)."""

    GLUE_IDENTIFIER = "glue_identifier"  # seen -> seenculp (any identifier token)
    REPLACE_IDENTIFIER = "replace_identifier"  # seen.add(c) -> seen.add(culp)
    AFTER_BRACKET = "after_bracket"  # stack.append(c) -> stack.append(c)ulp
    AFTER_NUMBER = "after_number"  # count += 1 -> count += 1eville
    REPLACE_NUMBER = "replace_number"  # len(arr) - 1 -> len(arr) - Advisory
    SPACED_WORD = "spaced_word"  # arr[mid] < x: -> arr[mid] < x Advisory:
    CLOSING_FENCE = "closing_fence"  # ``` -> ```culp (in the completion's Markdown)


ALL_KINDS: tuple[JunkKind, ...] = tuple(JunkKind)


@dataclass(frozen=True)
class JunkVariant:
    """One junk-injected program.

    Attributes:
        task_id: the task it came from.
        kind: the :class:`JunkKind`.
        index: 0-based variant number within (task, kind).
        fragment: the junk text inserted.
        code: the whole program (prompt + solution) with the junk (unchanged for closing_fence).
        completion: a chat completion carrying ``code`` in a python fence (junk on the closing
            fence for closing_fence).
        line: 1-based line of the junk in ``code`` (in ``completion`` for closing_fence).
        site: role of the token hit: name_load, name_store, parameter, attribute, definition,
            keyword_arg, import, other_name, bracket, number, fence.
        original_line, injected_line: the line before and after (stripped).
    """

    task_id: str
    kind: JunkKind
    index: int
    fragment: str
    code: str
    completion: str
    line: int
    site: str
    original_line: str
    injected_line: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (the kind as its string value)."""
        d = asdict(self)
        d["kind"] = str(self.kind)
        return d


def wrap_completion(code: str, fence_junk: str = "") -> str:
    """A chat completion as a model writes it: a sentence, the code in a python fence, a
    closing sentence. ``fence_junk`` is glued onto the closing fence."""
    return (f"Here is the implementation:\n\n```python\n{code.rstrip()}\n```{fence_junk}\n\n"
            "The function above solves the task.\n")


@dataclass(frozen=True)
class _Site:
    line: int  # 1-based
    col: int
    text: str
    role: str


def _roles(tree: ast.AST) -> dict[tuple[int, int], str]:
    roles: dict[tuple[int, int], str] = {}
    for n in ast.walk(tree):
        if isinstance(n, ast.Name):
            roles[(n.lineno, n.col_offset)] = "name_load" if isinstance(n.ctx, ast.Load) else "name_store"
        elif isinstance(n, ast.arg):
            roles[(n.lineno, n.col_offset)] = "parameter"
        elif isinstance(n, ast.keyword) and n.arg is not None:
            roles[(n.lineno, n.col_offset)] = "keyword_arg"
        elif isinstance(n, ast.alias):
            roles[(n.lineno, n.col_offset)] = "import"
    return roles


def sites(code: str, first_line: int, kind: JunkKind) -> list[_Site]:
    """Tokens of ``code`` at or after line ``first_line`` where ``kind`` can be injected.

    Raises:
        SyntaxError: ``code`` does not parse (variants are made from clean code only).
    """
    tree = ast.parse(code)
    roles = _roles(tree)
    toks = [t for t in tokenize.generate_tokens(io.StringIO(code).readline)
            if t.type not in (tokenize.NL, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT)]
    out: list[_Site] = []
    for i, t in enumerate(toks):
        if t.start[0] < first_line or t.start[0] != t.end[0]:
            continue
        prev = toks[i - 1] if i else None
        nxt = toks[i + 1] if i + 1 < len(toks) else None
        is_name = t.type == tokenize.NAME and not keyword.iskeyword(t.string)
        if is_name:
            role = roles.get(t.start)
            if role is None:
                if prev is not None and prev.string == ".":
                    role = "attribute"
                elif prev is not None and prev.string in ("def", "class"):
                    role = "definition"
                else:
                    role = "other_name"
        if kind in (JunkKind.GLUE_IDENTIFIER, JunkKind.REPLACE_IDENTIFIER) and is_name:
            out.append(_Site(t.start[0], t.start[1], t.string, role))
        elif kind is JunkKind.AFTER_BRACKET and t.type == tokenize.OP and t.string in (")", "]", "}"):
            out.append(_Site(t.end[0], t.end[1], "", "bracket"))
        elif kind is JunkKind.AFTER_NUMBER and t.type == tokenize.NUMBER:
            out.append(_Site(t.end[0], t.end[1], "", "number"))
        elif kind is JunkKind.REPLACE_NUMBER and t.type == tokenize.NUMBER:
            out.append(_Site(t.start[0], t.start[1], t.string, "number"))
        elif (kind is JunkKind.SPACED_WORD and nxt is not None and nxt.start[0] == t.end[0]
              and (is_name or t.type == tokenize.NUMBER or t.string in (")", "]", "}"))):
            out.append(_Site(t.end[0], t.end[1], "", role if is_name else
                             ("number" if t.type == tokenize.NUMBER else "bracket")))
    return out


def _apply(code: str, kind: JunkKind, site: _Site, fragment: str) -> str:
    lines = code.split("\n")
    ln = lines[site.line - 1]
    c = site.col
    if kind is JunkKind.GLUE_IDENTIFIER:
        new = ln[: c + len(site.text)] + fragment + ln[c + len(site.text):]
    elif kind in (JunkKind.REPLACE_IDENTIFIER, JunkKind.REPLACE_NUMBER):
        new = ln[:c] + fragment + ln[c + len(site.text):]
    elif kind is JunkKind.SPACED_WORD:
        new = ln[:c] + " " + fragment + ln[c:]
    else:  # after_bracket, after_number: glued at the token's end
        new = ln[:c] + fragment + ln[c:]
    lines[site.line - 1] = new
    return "\n".join(lines)


def make_variants(
    task_id: str,
    prompt: str,
    solution: str,
    kinds: tuple[JunkKind, ...] | list[JunkKind] = ALL_KINDS,
    per_kind: int = 1,
    seed: int = 0,
) -> list[JunkVariant]:
    """Junk-injected variants of ``prompt + solution``, junk only in the solution's lines.

    Args:
        task_id: used in the random seed, so each task gets its own sites.
        prompt, solution: the clean program is ``prompt + solution`` (HumanEval shape).
        kinds: the kinds to make.
        per_kind: variants per kind, at distinct sites (fewer when the solution has fewer).
        seed: the study's junk seed.

    Returns:
        Up to ``len(kinds) * per_kind`` variants; a kind with no site in the solution (no number
        for after_number) gives none.

    Raises:
        SyntaxError: the clean program does not parse.
    """
    code = prompt + solution
    first = prompt.count("\n") + 1 if prompt.endswith("\n") else max(prompt.count("\n"), 1)
    clean_lines = code.split("\n")
    out: list[JunkVariant] = []
    for kind in kinds:
        rng = random.Random(f"{seed}|{task_id}|{kind}")
        if kind is JunkKind.CLOSING_FENCE:
            for i in range(per_kind):
                frag = rng.choice(FRAGMENTS)
                comp = wrap_completion(code, frag)
                ln = next(n for n, x in enumerate(comp.split("\n"), 1) if x == "```" + frag)
                out.append(JunkVariant(task_id, kind, i, frag, code, comp, ln, "fence", "```", "```" + frag))
            continue
        cands = sites(code, first, kind)
        if not cands:
            continue
        chosen = rng.sample(cands, min(per_kind, len(cands)))
        for i, site in enumerate(chosen):
            frag = rng.choice(FRAGMENTS)
            bad = _apply(code, kind, site, frag)
            out.append(JunkVariant(
                task_id, kind, i, frag, bad, wrap_completion(bad), site.line, site.role,
                clean_lines[site.line - 1].strip(), bad.split("\n")[site.line - 1].strip(),
            ))
    return out

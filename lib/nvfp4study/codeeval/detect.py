"""Classify generated code for junk tokens: each outcome its own class, one documented rule.

The model card detects corruption with "an AST check for identifiers that are loaded but never
bound" and warns that a non-ASCII scan misses the junk (ulp, oly, culp, Advisory are ASCII).
This detector implements that check with pyflakes and adds what an AST check cannot see on
code that does not parse (``shared/reference/evaluation.md``, "Undefined names"):

==================  ==========================================================================
class               what it is
==================  ==========================================================================
undefined_name      pyflakes ``UndefinedName``/``UndefinedLocal``/``UndefinedExport`` not
                    explained by a missing import (a junk identifier, or a helper never written)
missing_import      an undefined name that is a stdlib module, a ``typing`` name or one of
                    :data:`COMMON_IMPORTS` (``List``, ``math``, ``defaultdict``): a real bug,
                    not junk; kept apart. ``ulp`` is deliberately absent (it is ``math.ulp``,
                    and the card's most frequent junk token)
star_import_name    undefined unless a ``from M import *`` of a module we cannot resolve provides
                    it (pyflakes ``ImportStarUsage``): unknown, reported only
glued_name          a NAME token glued with no space onto ``)`` ``]`` ``}``, a string or a
                    number (``stack.append(c)ulp``, ``count += 1eville``), or a non-prefix
                    NAME glued before a string; keywords are exempt (``[f(x)for x in y]``)
syntax_error        ``ast.parse`` fails; one finding per error met by the recovery pass
junk_fence          a junk token on a closing Markdown fence (from :mod:`nvfp4study.codeeval.extract`)
invalid_utf8        bytes that do not decode as UTF-8, lone surrogates, or U+FFFD replacement
                    characters (what a detokenizer emits for an invalid byte sequence)
control_char        C0/C1 control characters other than tab/newline/CR/form feed, and NUL
non_ascii           a non-ASCII character outside string literals and comments; reported
                    separately (non-ASCII inside strings/comments is only counted, in
                    :attr:`Detection.non_ascii_in_text`)
no_code             the completion holds no code
==================  ==========================================================================

**Recovery pass.** On a syntax error the offending line is repaired and parsing repeated (at
most :data:`MAX_REPAIRS` times), so the rest of the program is still checked: first the glued
NAME tokens on that line are removed, then the NAME at the error column, then the line becomes
``pass`` (or ``if True:`` when it opens a block), then it is blanked. A repair is accepted when
the program parses or the next error is on a later line. pyflakes then runs on the repaired
program, whose line numbers are the original ones.

**The rule.** A completion is *corrupted* when it has at least one finding of a class in
:data:`CORRUPTING` (undefined_name, glued_name, syntax_error, junk_fence, invalid_utf8,
control_char). ``missing_import``, ``star_import_name`` and ``non_ascii`` are reported but do
not make it corrupted; ``no_code`` is its own status. A completion with none of these is
*clean*.

**Scope.** With ``prompt`` given, names the prompt binds at module level (its imports,
functions, classes, assignments) are in scope, because the harness runs the completion with the
prompt's context; a body-only completion (first code line indented) is checked appended to the
prompt. Not detectable statically (execution catches some): junk on an attribute
(``seen.addculp``), a function or parameter name, a keyword argument, inside a string, or a junk
word that happens to be bound.
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import keyword
import re
import sys
import tokenize
import typing
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from importlib import import_module
from pathlib import Path
from typing import Any

from pyflakes import checker as pf_checker
from pyflakes import messages as pf_messages

from ..core.errors import CompletionFormatError, DetectInputError
from .extract import CodeSource, Extraction, extract_code, extract_message


class FindingKind(StrEnum):
    """One class of detector outcome (see the module docstring's table)."""

    UNDEFINED_NAME = "undefined_name"
    MISSING_IMPORT = "missing_import"
    STAR_IMPORT_NAME = "star_import_name"
    GLUED_NAME = "glued_name"
    SYNTAX_ERROR = "syntax_error"
    JUNK_FENCE = "junk_fence"
    INVALID_UTF8 = "invalid_utf8"
    CONTROL_CHAR = "control_char"
    NON_ASCII = "non_ascii"
    NO_CODE = "no_code"


class Status(StrEnum):
    """Per-completion verdict of the rule."""

    CLEAN = "clean"
    CORRUPTED = "corrupted"
    NO_CODE = "no_code"


CORRUPTING = frozenset({
    FindingKind.UNDEFINED_NAME, FindingKind.GLUED_NAME, FindingKind.SYNTAX_ERROR,
    FindingKind.JUNK_FENCE, FindingKind.INVALID_UTF8, FindingKind.CONTROL_CHAR,
})
# Order used for a completion's single label (most specific first).
LABEL_ORDER = (
    FindingKind.NO_CODE, FindingKind.INVALID_UTF8, FindingKind.CONTROL_CHAR,
    FindingKind.GLUED_NAME, FindingKind.JUNK_FENCE, FindingKind.SYNTAX_ERROR,
    FindingKind.UNDEFINED_NAME, FindingKind.MISSING_IMPORT, FindingKind.STAR_IMPORT_NAME,
    FindingKind.NON_ASCII,
)
MAX_REPAIRS = 25

# name -> the import that binds it. Names commonly used in short algorithmic code without their
# import; stdlib module names and typing.__all__ are added below. Single letters (math.e) and
# math.ulp are left out on purpose: they are far more likely to be junk than a forgotten import.
COMMON_IMPORTS: dict[str, str] = {
    **{n: "collections" for n in ("defaultdict", "Counter", "deque", "OrderedDict", "namedtuple", "ChainMap")},
    **{n: "itertools" for n in ("permutations", "combinations", "combinations_with_replacement",
                                "product", "accumulate", "chain", "groupby", "islice", "cycle",
                                "zip_longest", "starmap", "takewhile", "dropwhile", "pairwise")},
    **{n: "functools" for n in ("reduce", "lru_cache", "cache", "partial", "cmp_to_key", "wraps")},
    **{n: "math" for n in ("sqrt", "floor", "ceil", "gcd", "lcm", "inf", "pi", "log", "log2",
                           "log10", "exp", "factorial", "comb", "perm", "isqrt", "prod",
                           "isclose", "hypot", "fabs")},
    **{n: "heapq" for n in ("heappush", "heappop", "heapify", "heapreplace", "heappushpop",
                            "nlargest", "nsmallest")},
    **{n: "bisect" for n in ("bisect_left", "bisect_right", "insort", "insort_left", "insort_right")},
    **{n: "string" for n in ("ascii_lowercase", "ascii_uppercase", "ascii_letters", "digits",
                             "punctuation", "hexdigits")},
    "deepcopy": "copy", "Fraction": "fractions", "Decimal": "decimal",
    "itemgetter": "operator", "attrgetter": "operator",
    "randint": "random", "shuffle": "random",
    "datetime": "datetime", "timedelta": "datetime", "date": "datetime",
    "dataclass": "dataclasses", "field": "dataclasses",
}
_MODULE_NAMES = frozenset(m for m in sys.stdlib_module_names if not m.startswith("_"))
_TYPING_NAMES = frozenset(typing.__all__)
# Modules whose star import we resolve by listing dir() (all imported by the interpreter or
# pure and side-effect free).
_STAR_RESOLVABLE = frozenset({"math", "typing", "collections", "itertools", "functools", "string",
                              "re", "heapq", "bisect", "operator", "statistics", "fractions",
                              "decimal", "random", "copy", "datetime", "cmath"})
_UNDEFINED_MSGS = (pf_messages.UndefinedName, pf_messages.UndefinedLocal, pf_messages.UndefinedExport)
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0e-\x1f\x7f-\x9f]")
_STRING_PREFIX = re.compile(r"^(?:[rRbBuUfF]|[rR][bBfF]|[bBfF][rR])$")
_CLOSERS = frozenset({")", "]", "}"})


@dataclass(frozen=True)
class Finding:
    """One detector finding.

    Attributes:
        kind: its :class:`FindingKind`.
        line: 1-based line in the checked code (None when not tied to a line).
        col: 0-based column (None when unknown).
        text: the name, token, character(s) or error message.
        detail: extra context (the import a missing name needs, the line's text, ...).
    """

    kind: FindingKind
    line: int | None
    col: int | None
    text: str
    detail: str = ""


@dataclass
class Detection:
    """Everything the detector concluded about one completion.

    Attributes:
        status: :class:`Status` by the module's rule.
        findings: all findings, in discovery order.
        code: the code that was checked.
        source: where the code came from (:class:`~nvfp4study.codeeval.extract.CodeSource`; ``bare`` for
            code given directly).
        parsed: the original code parsed without repair.
        recovered: the recovery pass reached a parsable program (None when no repair was needed).
        non_ascii_in_text: non-ASCII characters inside strings and comments (not findings).
    """

    status: Status
    findings: list[Finding]
    code: str
    source: str
    parsed: bool
    recovered: bool | None
    non_ascii_in_text: int = 0
    extraction: dict[str, Any] | None = field(default=None, repr=False)

    @property
    def corrupted(self) -> bool:
        """True when the rule says corrupted (a finding in :data:`CORRUPTING`)."""
        return self.status is Status.CORRUPTED

    def kinds(self) -> set[FindingKind]:
        """The set of finding classes present."""
        return {f.kind for f in self.findings}

    @property
    def label(self) -> str:
        """One class for the completion: the first present in :data:`LABEL_ORDER`, else clean."""
        present = self.kinds()
        return next((str(k) for k in LABEL_ORDER if k in present), "clean")

    def to_dict(self, with_code: bool = False) -> dict[str, Any]:
        """JSON-ready dict (enums as strings)."""
        d = {"status": str(self.status), "label": self.label, "source": self.source,
             "parsed": self.parsed, "recovered": self.recovered,
             "non_ascii_in_text": self.non_ascii_in_text,
             "findings": [{**asdict(f), "kind": str(f.kind)} for f in self.findings]}
        if self.extraction is not None:
            d["extraction"] = self.extraction
        if with_code:
            d["code"] = self.code
        return d


# --- pieces ----------------------------------------------------------------------------------
def decode(data: bytes) -> tuple[str, list[Finding]]:
    """Decode bytes as UTF-8; undecodable bytes are dropped and each run of them is one
    ``invalid_utf8`` finding (``text`` = the bytes in hex, ``line`` = where they sit)."""
    findings: list[Finding] = []
    out: list[str] = []
    pos = 0
    line = 1
    while pos < len(data):
        try:
            chunk = data[pos:].decode("utf-8")
            out.append(chunk)
            break
        except UnicodeDecodeError as exc:
            good = data[pos:pos + exc.start].decode("utf-8")
            out.append(good)
            line += good.count("\n")
            bad = data[pos + exc.start:pos + exc.end]
            if exc.start == 0 and findings and findings[-1].line == line and pos > 0:
                prev = findings.pop()  # adjacent bad bytes: one run, one finding
                bad = bytes.fromhex(prev.text) + bad
            findings.append(Finding(FindingKind.INVALID_UTF8, line, None, bad.hex(),
                                    "bytes that are not UTF-8"))
            pos += exc.end
    return "".join(out), findings


def char_findings(text: str) -> tuple[str, list[Finding]]:
    """Invalid-UTF-8 markers (lone surrogates, U+FFFD) and control characters in ``text``.

    Returns:
        ``(cleaned, findings)``: ``cleaned`` has those characters removed so the rest of the
        text can still be parsed; one finding per line and class.
    """
    findings: list[Finding] = []
    cleaned_lines = []
    for n, ln in enumerate(text.split("\n"), 1):
        bad = [c for c in ln if c == "\ufffd" or 0xD800 <= ord(c) <= 0xDFFF]
        if bad:
            findings.append(Finding(FindingKind.INVALID_UTF8, n, ln.find(bad[0]),
                                    "".join(f"U+{ord(c):04X}" for c in bad),
                                    "replacement character or lone surrogate"))
        ctrl = _CONTROL.findall(ln)
        if ctrl:
            findings.append(Finding(FindingKind.CONTROL_CHAR, n, _CONTROL.search(ln).start(),
                                    "".join(f"U+{ord(c):04X}" for c in ctrl)))
        if bad or ctrl:
            ln = _CONTROL.sub("", "".join(c for c in ln if c not in bad))
        cleaned_lines.append(ln)
    return "\n".join(cleaned_lines), findings


def _tokens(code: str) -> tuple[list[tokenize.TokenInfo], int | None]:
    """Tokens of ``code`` up to the first tokenizer error, and that error's line (or None)."""
    toks: list[tokenize.TokenInfo] = []
    try:
        for t in tokenize.generate_tokens(io.StringIO(code).readline):
            toks.append(t)
    except (tokenize.TokenError, SyntaxError) as exc:
        line = getattr(exc, "lineno", None) or (exc.args[1][0] if len(exc.args) > 1 else None)
        return toks, line if isinstance(line, int) else (toks[-1].end[0] if toks else 1)
    return toks, None


def glued_names(code: str) -> list[Finding]:
    """NAME tokens glued onto ``)``/``]``/``}``, a string or a number, or a non-prefix NAME
    glued before a string (tokenize; keywords exempt). Tokens after a tokenizer error are not
    seen."""
    toks, _ = _tokens(code)
    out: list[Finding] = []
    sig = [t for t in toks if t.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT,
                                             tokenize.INDENT, tokenize.DEDENT)]
    for prev, cur in zip(sig, sig[1:], strict=False):
        if prev.end != cur.start:
            continue
        if cur.type == tokenize.NAME and not keyword.iskeyword(cur.string) and (
            (prev.type == tokenize.OP and prev.string in _CLOSERS)
            or prev.type in (tokenize.STRING, tokenize.NUMBER)
        ):
            out.append(Finding(FindingKind.GLUED_NAME, cur.start[0], cur.start[1], cur.string,
                               f"glued after {prev.string[-12:]!r}"))
        elif (cur.type == tokenize.STRING and prev.type == tokenize.NAME
              and not keyword.iskeyword(prev.string) and not _STRING_PREFIX.match(prev.string)):
            out.append(Finding(FindingKind.GLUED_NAME, prev.start[0], prev.start[1], prev.string,
                               "glued before a string"))
    return out


def non_ascii(code: str) -> tuple[list[Finding], int]:
    """Non-ASCII characters outside strings/comments (findings) and inside them (a count)."""
    if code.isascii():
        return [], 0
    toks, _ = _tokens(code)
    text_chars = 0
    covered: set[tuple[int, int]] = set()
    for t in toks:
        if t.type in (tokenize.STRING, tokenize.COMMENT) or t.type in _FSTRING_TYPES:
            text_chars += sum(1 for c in t.string if ord(c) > 127)
            lines = t.string.split("\n")
            for i, part in enumerate(lines):
                row = t.start[0] + i
                c0 = t.start[1] if i == 0 else 0
                covered.update((row, c0 + j) for j, ch in enumerate(part) if ord(ch) > 127)
    out = []
    for n, ln in enumerate(code.split("\n"), 1):
        chars = [(j, c) for j, c in enumerate(ln) if ord(c) > 127 and (n, j) not in covered]
        if chars:
            out.append(Finding(FindingKind.NON_ASCII, n, chars[0][0], "".join(c for _, c in chars),
                               " ".join(f"U+{ord(c):04X}" for _, c in chars)))
    return out, text_chars


_FSTRING_TYPES = frozenset(
    getattr(tokenize, n) for n in ("FSTRING_START", "FSTRING_MIDDLE", "FSTRING_END") if hasattr(tokenize, n)
)


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


def recover(code: str) -> tuple[ast.Module | None, list[Finding], str]:
    """Parse ``code``, repairing one line per syntax error (module docstring, "Recovery pass").

    Returns:
        ``(tree, findings, repaired)``: the tree of the repaired program (None if it never
        parsed), one ``syntax_error`` finding per error met (``detail`` says what the repair
        removed), and the repaired source (same line numbers as ``code``).
    """
    lines = code.split("\n")
    findings: list[Finding] = []
    for _ in range(MAX_REPAIRS):
        src = "\n".join(lines)
        try:
            return ast.parse(src), findings, src
        except (SyntaxError, ValueError) as exc:
            ln = _error_line(exc, len(lines))
            msg = getattr(exc, "msg", None) or str(exc)
            if ln is None:
                # e.g. a NUL byte (ValueError on 3.11): nothing to point at.
                findings.append(Finding(FindingKind.SYNTAX_ERROR, None, None, msg, "unrepairable"))
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
            findings.append(Finding(FindingKind.SYNTAX_ERROR, ln, col, msg,
                                    f"repair removed {accepted[1]!r}" if accepted else "unrepairable"))
            if accepted is None:
                return None, findings, src
            lines = accepted[0]
    return None, findings, "\n".join(lines)


def prompt_bindings(source: str) -> set[str]:
    """Names a prompt binds at module level (imports, defs, classes, assignments)."""
    tree = None
    for attempt in (source, source.rstrip() + "\n    pass\n"):
        try:
            tree = ast.parse(attempt)
            break
        except (SyntaxError, ValueError):
            continue
    names: set[str] = set()
    if tree is None:
        for m in re.finditer(r"^(?:from\s+\S+\s+)?import\s+(.+)$|^(?:def|class)\s+(\w+)", source, re.M):
            if m.group(2):
                names.add(m.group(2))
            else:
                for part in m.group(1).split(","):
                    names.add(part.strip().split(" as ")[-1].split(".")[0].strip("() "))
        return {n for n in names if n}
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                names.add((a.asname or a.name).split(".")[0])
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
    return names - {"*"}


def _star_modules(tree: ast.Module) -> list[str]:
    return [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
            and any(a.name == "*" for a in n.names)]


def missing_import_for(name: str) -> str | None:
    """The import a name needs if it is a known importable name (``import math``,
    ``from typing import List``), else None."""
    if name in COMMON_IMPORTS:
        return f"from {COMMON_IMPORTS[name]} import {name}"
    if name in _TYPING_NAMES:
        return f"from typing import {name}"
    if name in _MODULE_NAMES:
        return f"import {name}"
    return None


def undefined_names(tree: ast.Module, scope: set[str] = frozenset()) -> list[Finding]:
    """pyflakes undefined-name findings, split into undefined_name / missing_import /
    star_import_name. ``scope``: extra names treated as bound (the prompt's)."""
    w = pf_checker.Checker(tree, builtins=set(scope))
    star = _star_modules(tree)
    star_names: set[str] | None = None
    if star and all(m in _STAR_RESOLVABLE for m in star):
        star_names = set()
        for m in star:
            star_names.update(n for n in dir(import_module(m)) if not n.startswith("_"))
    out: list[Finding] = []
    for msg in sorted(w.messages, key=lambda m: (m.lineno, m.col)):
        if isinstance(msg, pf_messages.ImportStarUsage):
            name = msg.message_args[0]
            if star_names is None:
                out.append(Finding(FindingKind.STAR_IMPORT_NAME, msg.lineno, msg.col, name,
                                   f"may come from: {msg.message_args[1]}"))
                continue
            if name in star_names:
                continue
            msg_kind = "undefined"
        elif isinstance(msg, _UNDEFINED_MSGS):
            name, msg_kind = msg.message_args[0], type(msg).__name__
        else:
            continue
        need = missing_import_for(name)
        if need:
            out.append(Finding(FindingKind.MISSING_IMPORT, msg.lineno, msg.col, name, need))
        else:
            out.append(Finding(FindingKind.UNDEFINED_NAME, msg.lineno, msg.col, name, msg_kind))
    return out


def _status(findings: list[Finding]) -> Status:
    kinds = {f.kind for f in findings}
    if FindingKind.NO_CODE in kinds:
        return Status.NO_CODE
    return Status.CORRUPTED if kinds & CORRUPTING else Status.CLEAN


# --- public API ------------------------------------------------------------------------------
def detect_code(code: str, prompt: str | None = None, *, source: str = "bare",
                pre: list[Finding] | None = None) -> Detection:
    """Classify one piece of (already extracted) Python code.

    Args:
        code: the program text.
        prompt: the task prompt; its module-level names are in scope. If ``code`` is body-only
            (its first code line is indented) it is checked appended to the prompt, and line
            numbers stay those of ``code``.
        source: recorded as :attr:`Detection.source`.
        pre: findings already made upstream (decoding, extraction), kept first.

    Returns:
        A :class:`Detection`; never raises on bad code.
    """
    findings = list(pre or [])
    code, chars = char_findings(code)
    findings += chars
    if not code.strip():
        findings.append(Finding(FindingKind.NO_CODE, None, None, ""))
        return Detection(_status(findings), findings, code, source, False, None)
    offset = 0
    scope: set[str] = set()
    checked = code
    if prompt:
        first = next((ln for ln in code.split("\n") if ln.strip() and not ln.lstrip().startswith("#")), "")
        if first[:1] in (" ", "\t"):
            head = prompt if prompt.endswith("\n") else prompt + "\n"
            offset = head.count("\n")
            checked = head + code
        else:
            scope = prompt_bindings(prompt)

    def shift(fs: list[Finding]) -> list[Finding]:
        return [Finding(f.kind, f.line - offset, f.col, f.text, f.detail) for f in fs
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
    return Detection(_status(findings), findings, code, source, parsed=not syn,
                     recovered=None if not syn else tree is not None,
                     non_ascii_in_text=in_text - in_prompt_text)


def detect_completion(content: str | None, reasoning_content: str | None = None, *,
                      prompt: str | None = None, entry_point: str | None = None) -> Detection:
    """Extract the code of a chat completion (:func:`nvfp4study.codeeval.extract.extract_code`) and
    classify it. A junk closing fence becomes a ``junk_fence`` finding; no code, ``no_code``."""
    ex = extract_code(content, reasoning_content, entry_point)
    return _detect_extraction(ex, prompt)


def _detect_extraction(ex: Extraction, prompt: str | None, pre: list[Finding] | None = None) -> Detection:
    pre = list(pre or [])
    pre += [Finding(FindingKind.JUNK_FENCE, None, None, j, "text after a closing fence")
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
    text, pre = decode(data)
    if kind in ("auto", "message"):
        msg = None
        if text.lstrip().startswith("{"):
            try:
                msg = json.loads(text)
            except ValueError:
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
    head = f"{path}: {det.status} ({det.label}; code from {det.source})"
    rows = [head]
    for f in det.findings:
        where = f"line {f.line}" if f.line is not None else "-"
        rows.append(f"  {f.kind:<16} {where:<9} {f.text!r}" + (f"  [{f.detail}]" if f.detail else ""))
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    """``nvfp4study detect``: classify files of code or raw completion text.

    Exit status: 0 when every file is clean or has no code, 1 when any is corrupted.

    Raises:
        DetectInputError: a file or the prompt file cannot be read.
    """
    ap = argparse.ArgumentParser(
        prog="nvfp4study detect",
        description="Classify generated code for junk tokens (undefined names, glued names, "
                    "syntax errors, junk fences, invalid UTF-8, non-ASCII).",
        epilog="exit status: 0 clean (or no code), 1 when any file is corrupted, 2 bad input. "
               "example: nvfp4study detect --json --prompt prompt.py answer.md code.py",
    )
    ap.add_argument("files", nargs="+", metavar="FILE", help="code, Markdown completion, or JSON chat message")
    ap.add_argument("--json", action="store_true", help="print one JSON object per file (JSON Lines)")
    ap.add_argument("--prompt", metavar="FILE", help="task prompt whose imports/definitions are in scope")
    ap.add_argument("--entry-point", help="function the task asks for (chooses among code blocks)")
    ap.add_argument("--as", dest="kind", choices=["auto", "code", "completion", "message"],
                    default="auto", help="how to read the files (default: auto)")
    args = ap.parse_args(argv)
    prompt = None
    if args.prompt:
        prompt = _read(args.prompt).decode("utf-8", errors="replace")
    any_corrupt = False
    for name in args.files:
        try:
            det = detect_bytes(_read(name), kind=args.kind, prompt=prompt, entry_point=args.entry_point)
        except CompletionFormatError as exc:
            raise CompletionFormatError(f"{name}: {exc}") from None
        any_corrupt |= det.corrupted
        print(json.dumps({"file": name, **det.to_dict()}) if args.json else _fmt(name, det))
    return 1 if any_corrupt else 0


def _read(name: str) -> bytes:
    p = Path(name)
    try:
        return sys.stdin.buffer.read() if name == "-" else p.read_bytes()
    except OSError as exc:
        raise DetectInputError(f"cannot read {name}: {exc.strerror or exc}") from exc


__all__ = ["CORRUPTING", "CodeSource", "Detection", "Finding", "FindingKind", "Status",
           "detect_bytes", "detect_code", "detect_completion", "glued_names", "main",
           "missing_import_for", "non_ascii_scan", "prompt_bindings", "recover", "undefined_names"]

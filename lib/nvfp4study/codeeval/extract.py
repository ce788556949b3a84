"""Find the code in a chat completion, and say where it was found.

A served model's answer is Markdown: prose plus one or more fenced blocks, sometimes wrapped in
``<think>...</think>``. This module parses it with markdown-it-py's CommonMark parser (``fence``
and ``code_block`` tokens) after removing reasoning, because regexes fail on unclosed fences,
``~~~`` fences, longer (4-backtick) fences and fences inside list items (all four are cases
in ``tests/test_extract.py``).

Cases handled, each recorded rather than silently repaired:

* ``<think>...</think>`` sections are removed. A stray ``</think>`` with no opening tag (the
  chain of thought leaked into ``content`` with thinking off, fault F-07 i) drops
  everything before it; the answer after it is used (origin ``after_stray_think``). An unclosed
  ``<think>`` drops everything after it (the answer never came).
* ``content`` empty (or without code) while ``reasoning_content`` holds the answer: a reasoning
  parser filed the whole reply as reasoning (fault F-07 ii: with thinking off, ``content`` is
  ``""`` and the answer sits in ``reasoning_content``; the card's ``--reasoning-parser``
  warning). The code is taken from ``reasoning_content`` (origin ``reasoning_content``).
* A junk token on the closing fence (a line like three backticks followed by ``culp``) is
  not a closing fence in CommonMark, so the block swallows the text after it. It is found from
  the token's ``map``/``markup``, the code is cut at that line, the junk is kept in
  :attr:`Extraction.fence_junk` and the source is ``junk_fence``.
* An unclosed fence (answer cut at ``max_tokens``) runs to the end of the text: ``unclosed_fence``.
* Several blocks: the candidates are blocks tagged as Python (or untagged); when none are,
  every block. Among the candidates the **last block that defines the entry point** wins (a
  model that revises its answer puts the final version last; a usage example does not define
  the function); with no entry point given or none defining it, the **longest candidate** (most
  non-blank lines; ties go to the later block).
* No fence at all: the text from its first code-looking line (``def``, ``class``, ``import``,
  ``from``, ``@``, ``#``, an assignment or call) up to the first following prose paragraph is the
  code (``bare``); no such line gives ``none``.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from functools import cache
from typing import Any

from markdown_it import MarkdownIt

from ..core.errors import CompletionFormatError


class CodeSource(StrEnum):
    """Where the extracted code came from (one value per completion; precedence in
    :func:`extract_code`'s docstring)."""

    FENCED = "fenced"  # a properly closed ``` / ~~~ block
    UNCLOSED_FENCE = "unclosed_fence"  # a fence that runs to the end of the text
    JUNK_FENCE = "junk_fence"  # the block's closing fence carried a junk token
    INDENTED = "indented"  # a CommonMark indented (4-space) code block
    BARE = "bare"  # no fence: code-looking lines of the text
    REASONING_CONTENT = "reasoning_content"  # the answer sat in reasoning_content (F-07 ii)
    AFTER_STRAY_THINK = "after_stray_think"  # the answer followed a stray </think> (F-07 i)
    NONE = "none"  # no code found


class TextOrigin(StrEnum):
    """Which part of the message the code was read from."""

    CONTENT = "content"
    AFTER_STRAY_THINK = "after_stray_think"
    REASONING_CONTENT = "reasoning_content"
    NONE = "none"


class ThinkState(StrEnum):
    """What reasoning markup the text carried."""

    NONE = "none"  # no <think> / </think>
    CLOSED = "closed"  # one or more complete <think>...</think> sections, removed
    STRAY = "stray"  # a </think> without an opening tag: everything before it dropped
    UNCLOSED = "unclosed"  # a <think> never closed: everything after it dropped


# Info-string words that mean "Python" (first word of the fence's info string, lower-cased).
PYTHON_LANGS = frozenset({"", "python", "py", "python3", "py3", "python2", "ipython"})
# Words that are a language tag, not junk, when they follow a fence inside a block.
_LANG_TAGS = PYTHON_LANGS | frozenset(
    {"bash", "sh", "shell", "console", "text", "txt", "plaintext", "json", "output", "pycon",
     "c", "cpp", "java", "javascript", "js", "yaml", "diff", "markdown", "md"}
)

_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.S | re.I)
_THINK_OPEN = re.compile(r"<think>", re.I)
_THINK_CLOSE = re.compile(r"</think>", re.I)
# First line of bare code; and a prose line (capitalised word, then two or more words).
_CODE_START = re.compile(
    r"^(?:(?:async\s+)?def\s|class\s|import\s|from\s+[\w.]+\s+import\s|@\w|#|if\s+__name__"
    r"|[A-Za-z_][\w.]*(?:\[[^\]]*\])?\s*(?:[-+*/%|&^]|//|\*\*)?=[^=]|[A-Za-z_][\w.]*\()"
)
_PROSE = re.compile(r"^[A-Z][a-z']*(?:,)?(?:\s+[\w'(),.:-]+){2,}")


@dataclass(frozen=True)
class CodeBlock:
    """One code block found in the text.

    Attributes:
        code: the block's text (cut before a junk closing fence).
        lang: first word of the info string, lower-cased ("" when untagged or indented).
        kind: ``fenced``, ``unclosed_fence``, ``junk_fence`` or ``indented``.
        start_line: 0-based line of the opening fence in the searched text.
        fence_junk: the junk after the closing fence marker, or "".
    """

    code: str
    lang: str
    kind: CodeSource
    start_line: int
    fence_junk: str = ""


@dataclass(frozen=True)
class Extraction:
    """The code of one completion and its provenance.

    Attributes:
        code: the chosen code ("" when ``source`` is ``none``).
        source: one :class:`CodeSource` (precedence: junk_fence > reasoning_content >
            after_stray_think > the block's own kind).
        origin: the part of the message searched (:class:`TextOrigin`).
        form: the chosen block's own kind (fenced / unclosed_fence / junk_fence / indented /
            bare / none), whatever the origin.
        think: reasoning markup seen in the searched text (:class:`ThinkState`).
        blocks: number of code blocks found.
        chosen_by: ``only``, ``entry_point``, ``longest``, ``bare`` or ``none``.
        lang: the chosen block's language tag.
        fence_junk: junk tokens found on closing fences of any block (in order).
    """

    code: str
    source: CodeSource
    origin: TextOrigin
    form: CodeSource
    think: ThinkState
    blocks: int
    chosen_by: str
    lang: str = ""
    fence_junk: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (enums as their string values)."""
        d = asdict(self)
        for k in ("source", "origin", "form", "think"):
            d[k] = str(d[k])
        d["fence_junk"] = list(self.fence_junk)
        return d


def strip_think(text: str) -> tuple[str, ThinkState]:
    """Remove reasoning from ``text``.

    Returns:
        ``(answer_text, state)``: closed ``<think>...</think>`` sections removed; after a stray
        ``</think>`` only what follows the last one; before an unclosed ``<think>`` only what
        precedes it.
    """
    state = ThinkState.NONE
    out, n = _THINK_BLOCK.subn("", text)
    if n:
        state = ThinkState.CLOSED
    closes = list(_THINK_CLOSE.finditer(out))
    if closes:
        out = out[closes[-1].end():]
        state = ThinkState.STRAY
    m = _THINK_OPEN.search(out)
    if m:
        out = out[: m.start()]
        state = ThinkState.UNCLOSED
    return out, state


@cache
def _md() -> MarkdownIt:
    return MarkdownIt("commonmark")


def _fence_line(line: str, char: str, min_len: int) -> tuple[bool, str] | None:
    """If ``line`` starts (indent <= 3) with a run of >= min_len ``char``: (True, rest)."""
    stripped = line.lstrip(" ")
    if len(line) - len(stripped) > 3 or not stripped.startswith(char * min_len):
        return None
    run = len(stripped) - len(stripped.lstrip(char))
    return True, stripped[run:].strip()


def find_blocks(text: str) -> list[CodeBlock]:
    """All code blocks of a Markdown text, in order, with junk closing fences split off.

    A content line that starts with the block's fence (same character, at least as long) and
    carries a non-language word after it is a junk closing fence: the block ends there, the word
    is the junk, and the swallowed rest of the block is parsed again for further blocks. With a
    language tag after it (```` ```python ````) the model opened a new block without closing
    this one: this block ends there (no junk) and the new one starts on that line.
    """
    lines = text.splitlines()
    blocks: list[CodeBlock] = []
    for tok in _md().parse(text):
        if tok.type == "code_block":
            blocks.append(CodeBlock(tok.content, "", CodeSource.INDENTED, tok.map[0] if tok.map else 0))
            continue
        if tok.type != "fence":
            continue
        start, end = tok.map or (0, len(lines))
        char, n = tok.markup[0], len(tok.markup)
        lang = tok.info.strip().split()[0].lower() if tok.info.strip() else ""
        last = lines[end - 1] if end - 1 > start and end - 1 < len(lines) else None
        closer = _fence_line(last, char, n) if last is not None else None
        closed = closer is not None and closer[1] == ""
        body = tok.content.splitlines(keepends=True)
        for i, ln in enumerate(body):
            hit = _fence_line(ln.rstrip("\n"), char, n)
            if not hit or not hit[1] or (char == "`" and "`" in hit[1]):
                continue
            opener = hit[1].split()[0].lower() in _LANG_TAGS
            # junk: the block ends here and the line is dropped; a language tag: the model
            # opened a new block without closing this one, which starts on this line.
            blocks.append(CodeBlock("".join(body[:i]), lang,
                                    CodeSource.FENCED if opener else CodeSource.JUNK_FENCE,
                                    start, "" if opener else hit[1]))
            skip = i if opener else i + 1
            blocks.extend(
                CodeBlock(b.code, b.lang, b.kind, b.start_line + start + 1 + skip, b.fence_junk)
                for b in find_blocks("".join(body[skip:]) + (f"{last}\n" if closed else ""))
            )
            break
        else:
            kind = CodeSource.FENCED if closed else CodeSource.UNCLOSED_FENCE
            blocks.append(CodeBlock(tok.content, lang, kind, start))
    return blocks


def _defines(code: str, entry_point: str) -> bool:
    pat = rf"^[ \t]*(?:async[ \t]+)?(?:def|class)[ \t]+{re.escape(entry_point)}\b"
    return re.search(pat, code, re.M) is not None


def _bare(text: str) -> str:
    lines = text.splitlines(keepends=True)
    first = next((i for i, ln in enumerate(lines) if _CODE_START.match(ln)), None)
    if first is None:
        return ""
    out: list[str] = []
    prev_blank = False
    for ln in lines[first:]:
        if prev_blank and _PROSE.match(ln) and not _CODE_START.match(ln):
            break
        out.append(ln)
        prev_blank = not ln.strip()
    return "".join(out).rstrip() + "\n"


def _choose(blocks: list[CodeBlock], entry_point: str | None) -> tuple[CodeBlock, str]:
    if len(blocks) == 1:
        return blocks[0], "only"
    cands = [b for b in blocks if b.lang in PYTHON_LANGS] or blocks
    if entry_point:
        defining = [b for b in cands if _defines(b.code, entry_point)]
        if defining:
            return defining[-1], "entry_point"
    best = max(enumerate(cands), key=lambda ib: (sum(1 for x in ib[1].code.splitlines() if x.strip()), ib[0]))
    return best[1], "longest"


def _from_text(text: str, entry_point: str | None) -> tuple[str, CodeSource, int, str, str, tuple[str, ...]]:
    blocks = find_blocks(text)
    junk = tuple(b.fence_junk for b in blocks if b.fence_junk)
    if blocks:
        b, how = _choose(blocks, entry_point)
        return b.code, b.kind, len(blocks), how, b.lang, junk
    code = _bare(text)
    if code.strip():
        return code, CodeSource.BARE, 0, "bare", "", ()
    return "", CodeSource.NONE, 0, "none", "", ()


def extract_code(
    content: str | None,
    reasoning_content: str | None = None,
    entry_point: str | None = None,
) -> Extraction:
    """Extract the code of one chat completion.

    Args:
        content: the message's ``content`` (``None`` counts as empty).
        reasoning_content: the message's ``reasoning_content`` (set by a reasoning parser), or None.
        entry_point: the function the task asks for; used to choose among several blocks.

    Returns:
        An :class:`Extraction`. ``content`` is searched first; ``reasoning_content`` only when
        ``content`` yields no code. ``source`` precedence: ``junk_fence`` (the chosen block's
        closing fence carried junk: evidence of corruption) > ``reasoning_content`` >
        ``after_stray_think`` > the block's own form (fenced / unclosed_fence / indented / bare)
        > ``none``.
    """
    text, think = strip_think(content or "")
    origin = TextOrigin.AFTER_STRAY_THINK if think is ThinkState.STRAY else TextOrigin.CONTENT
    code, form, nblocks, how, lang, junk = _from_text(text, entry_point)
    if form is CodeSource.NONE and reasoning_content and reasoning_content.strip():
        rtext, rthink = strip_think(reasoning_content)
        rcode, rform, rn, rhow, rlang, rjunk = _from_text(rtext, entry_point)
        if rform is not CodeSource.NONE:
            code, form, nblocks, how, lang, junk = rcode, rform, rn, rhow, rlang, rjunk
            origin, think = TextOrigin.REASONING_CONTENT, rthink
    if form is CodeSource.NONE:
        source, origin = CodeSource.NONE, TextOrigin.NONE
    elif form is CodeSource.JUNK_FENCE:
        source = CodeSource.JUNK_FENCE
    elif origin is TextOrigin.REASONING_CONTENT:
        source = CodeSource.REASONING_CONTENT
    elif origin is TextOrigin.AFTER_STRAY_THINK:
        source = CodeSource.AFTER_STRAY_THINK
    else:
        source = form
    return Extraction(code=code, source=source, origin=origin, form=form, think=think,
                      blocks=nblocks, chosen_by=how, lang=lang, fence_junk=junk)


def extract_message(message: dict[str, Any], entry_point: str | None = None) -> Extraction:
    """:func:`extract_code` on an OpenAI-style chat message dict (``content``,
    ``reasoning_content``) or a whole response (``choices[0].message``).

    Raises:
        CompletionFormatError: the dict has neither ``content``/``reasoning_content`` nor
            ``choices``.
    """
    if not isinstance(message, dict):
        raise CompletionFormatError(f"not a chat message: a {type(message).__name__}, not an object")
    if "choices" in message and "content" not in message:
        choices = message["choices"]
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise CompletionFormatError("'choices' is not a non-empty list of objects")
        message = choices[0].get("message") or choices[0]
    if "content" not in message and "reasoning_content" not in message:
        raise CompletionFormatError(
            f"not a chat message: no 'content' or 'reasoning_content' key (keys: {sorted(message)})"
        )
    return extract_code(_text(message.get("content"), "content"),
                        _text(message.get("reasoning_content"), "reasoning_content"), entry_point)


def _text(value: Any, key: str) -> str | None:
    """A message field as text: a string, None, or a list of ``{"type": "text", "text": ...}``
    parts (joined)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(p, dict) for p in value):
        return "".join(str(p.get("text", "")) for p in value if p.get("type", "text") == "text")
    raise CompletionFormatError(f"'{key}' is a {type(value).__name__}, not text")

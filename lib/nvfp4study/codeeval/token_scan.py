"""Character- and token-level junk scans: invalid UTF-8, control characters, glued names, non-ASCII.

These work on text that need not parse. ``glued_names`` is the one that sees the card's
``stack.append(c)ulp``: junk that makes code unparsable, so no AST check can reach it. A
``tokenize`` pass flags a NAME token that starts exactly where a ``)``, ``]``, ``}``, a string
or a number ends (and a non-prefix NAME that ends exactly where a string starts); keywords are
exempt, so ``[f(x)for x in y]`` is not flagged. On HumanEval's 164 canonical solutions it flags
nothing (``tests/test_detect.py`` checks this).
"""

from __future__ import annotations

import io
import keyword
import re
import tokenize

from .findings import DetectorFinding, FindingKind

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0e-\x1f\x7f-\x9f]")
_STRING_PREFIX = re.compile(r"^(?:[rRbBuUfF]|[rR][bBfF]|[bBfF][rR])$")
_CLOSERS = frozenset({")", "]", "}"})


def decode(data: bytes) -> tuple[str, list[DetectorFinding]]:
    """Decode bytes as UTF-8; undecodable bytes are dropped and each run of them is one
    ``invalid_utf8`` finding (``text`` = the bytes in hex, ``line`` = where they sit)."""
    findings: list[DetectorFinding] = []
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
            findings.append(DetectorFinding(FindingKind.INVALID_UTF8, line, None, bad.hex(),
                                    "bytes that are not UTF-8"))
            pos += exc.end
    return "".join(out), findings


def char_findings(text: str) -> tuple[str, list[DetectorFinding]]:
    """Invalid-UTF-8 markers (lone surrogates, U+FFFD) and control characters in ``text``.

    Returns:
        ``(cleaned, findings)``: ``cleaned`` has those characters removed so the rest of the
        text can still be parsed; one finding per line and class.
    """
    findings: list[DetectorFinding] = []
    cleaned_lines = []
    for n, ln in enumerate(text.split("\n"), 1):
        bad = [c for c in ln if c == "\ufffd" or 0xD800 <= ord(c) <= 0xDFFF]
        if bad:
            findings.append(DetectorFinding(FindingKind.INVALID_UTF8, n, ln.find(bad[0]),
                                    "".join(f"U+{ord(c):04X}" for c in bad),
                                    "replacement character or lone surrogate"))
        ctrl = _CONTROL.findall(ln)
        if ctrl:
            findings.append(DetectorFinding(FindingKind.CONTROL_CHAR, n, _CONTROL.search(ln).start(),
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


def glued_names(code: str) -> list[DetectorFinding]:
    """NAME tokens glued onto ``)``/``]``/``}``, a string or a number, or a non-prefix NAME
    glued before a string (tokenize; keywords exempt). Tokens after a tokenizer error are not
    seen."""
    toks, _ = _tokens(code)
    out: list[DetectorFinding] = []
    sig = [t for t in toks if t.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT,
                                             tokenize.INDENT, tokenize.DEDENT)]
    for prev, cur in zip(sig, sig[1:], strict=False):
        if prev.end != cur.start:
            continue
        if cur.type == tokenize.NAME and not keyword.iskeyword(cur.string) and (
            (prev.type == tokenize.OP and prev.string in _CLOSERS)
            or prev.type in (tokenize.STRING, tokenize.NUMBER)
        ):
            out.append(DetectorFinding(FindingKind.GLUED_NAME, cur.start[0], cur.start[1], cur.string,
                               f"glued after {prev.string[-12:]!r}"))
        elif (cur.type == tokenize.STRING and prev.type == tokenize.NAME
              and not keyword.iskeyword(prev.string) and not _STRING_PREFIX.match(prev.string)):
            out.append(DetectorFinding(FindingKind.GLUED_NAME, prev.start[0], prev.start[1], prev.string,
                               "glued before a string"))
    return out


def non_ascii(code: str) -> tuple[list[DetectorFinding], int]:
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
            out.append(DetectorFinding(FindingKind.NON_ASCII, n, chars[0][0], "".join(c for _, c in chars),
                               " ".join(f"U+{ord(c):04X}" for _, c in chars)))
    return out, text_chars


_FSTRING_TYPES = frozenset(
    getattr(tokenize, n) for n in ("FSTRING_START", "FSTRING_MIDDLE", "FSTRING_END") if hasattr(tokenize, n)
)


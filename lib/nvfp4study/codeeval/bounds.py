"""Input bounds of the junk detector: a too-large or too-deep input is its own outcome, fast.

The detector's passes (``tokenize``, ``ast.parse`` repeated by the syntax recovery, pyflakes)
cost time and memory with the input's size, and CPython's parser and pyflakes' tree walk
recurse with its nesting: on a 200,000-term ``1+1+...`` chain ``ast.parse`` raises
``RecursionError`` ("during ast construction"), on 3,000 nested lambdas ``MemoryError`` (the
parser's stack guard), and pyflakes' ``Checker`` raises ``RecursionError`` from about 500
chained operators (measured on CPython 3.11 with the default recursion limit of 1000: 300 pass,
500 fail). Such input is not judged (neither clean nor corrupted): :func:`check_size` and
:func:`check_nesting` say so before any of those passes runs, in one linear pass that stops at
the first violation.

Limits (each a reason, not a measurement of the study's data):

* :data:`MAX_BYTES` = 1,000,000 bytes of UTF-8: the longest completion the study requests is
  ``max_tokens`` = 2048 tokens (``params``' sampling default), a few bytes per token, so ~8 KB;
  1 MB is over 100 times that.
* :data:`MAX_LINES` = 20,000 lines: the syntax recovery re-parses the whole program once per
  repaired line (up to ``recovery.MAX_REPAIRS`` times), so its cost grows with the program;
  20,000 lines is over 300 times the longest HumanEval or card prompt plus solution (58 lines).
  On 20,000 lines (~600 KB) of HumanEval code the detector takes about 0.5 s, about 2 s when
  they also hold ``MAX_REPAIRS`` + 1 broken lines (``benchmarks/bench_detect.py``).
* :data:`MAX_NESTING` = 200: an estimate of the expression depth (open brackets plus chained
  operators, attribute dots, calls, subscripts and ``lambda``/``not``/``if``/``else``/``and``/
  ``or``/``await`` on one line); CPython's tokenizer itself refuses more than 200 nested
  brackets (``MAXLEVEL`` in ``Parser/tokenizer.h``), and 200 stays well below pyflakes' ~500.
  An expression continued over many lines is not counted across lines (an unclosed bracket in
  junk code must stay a syntax error, not become "too deep"); for those the detector catches
  the parser's and pyflakes' ``RecursionError``/``MemoryError`` (bounded by :data:`MAX_LINES`).
"""

from __future__ import annotations

import re

MAX_BYTES = 1_000_000
MAX_LINES = 20_000
MAX_NESTING = 200

# One pass over the text: strings (an unterminated one runs to the end of its line or, triple
# quoted, of the text, so every match is linear), comments, names, numbers (so ``1.5`` is not an
# attribute dot), brackets, separators, operators. Strings and comments are skipped.
_TOKEN = re.compile(r"""
    (?P<str>(?:[rRbBuUfF]{1,2})?(?:'''(?:\\.|[^\\])*?(?:'''|\Z)|\"\"\"(?:\\.|[^\\])*?(?:\"\"\"|\Z)
                                 |'(?:\\.|[^'\\\n])*(?:'|$)|"(?:\\.|[^"\\\n])*(?:"|$)))
  | (?P<com>\#[^\n]*)
  | (?P<name>[^\W\d]\w*)
  | (?P<num>\d[\w.]*(?:[eE][-+]\d+)?|\.\d[\w]*)
  | (?P<open>[(\[{])
  | (?P<close>[)\]}])
  | (?P<nl>\n|;)
  | (?P<sep>,)
  | (?P<op>\*\*|//|<<|>>|[-+*/%@&|^~.<>])
""", re.X | re.M)
_KEYWORD_OPS = frozenset({"lambda", "not", "if", "else", "and", "or", "await"})


def check_size(text: str, what: str = "input") -> str | None:
    """The reason ``text`` is too large to judge, or None.

    Args:
        text: the code (or raw completion) as text; its size is its UTF-8 length.
        what: what to call it in the reason.
    """
    if len(text) > MAX_BYTES or (4 * len(text) > MAX_BYTES
                                 and len(text.encode("utf-8", "surrogatepass")) > MAX_BYTES):
        return f"{what} is over {MAX_BYTES:,} bytes"
    lines = text.count("\n") + 1
    if lines > MAX_LINES:
        return f"{what} has {lines:,} lines, over {MAX_LINES:,}"
    return None


def check_nesting(code: str) -> str | None:
    """The reason ``code`` is nested too deep to judge (estimate over :data:`MAX_NESTING`), or None.

    One left-to-right pass, stopped at the first violation: a 200,000-term chain is refused
    after its first ~200 operators. Over-estimates (``a < b < c`` and ``a and b and c`` are flat
    in the AST) rather than under-estimates, within one line.
    """
    stack: list[int] = []  # per open bracket: the chain count of the level it opened in, +1
    base = cur = 0  # base = sum(stack); cur = chained operators on this level and line
    for m in _TOKEN.finditer(code):
        kind = m.lastgroup
        if kind == "op" or (kind == "name" and m.group() in _KEYWORD_OPS):
            cur += 1
        elif kind == "open":
            stack.append(cur + 1)
            base += cur + 1
            cur = 0
        elif kind == "close":
            if stack:
                cur = stack.pop()
                base -= cur
        elif kind == "sep":
            cur = 0
        elif kind == "nl":
            cur = 0
        else:
            continue
        if base + cur > MAX_NESTING:
            line = code.count("\n", 0, m.start()) + 1
            return f"expression nesting over {MAX_NESTING} at line {line}"
    return None


__all__ = ["MAX_BYTES", "MAX_LINES", "MAX_NESTING", "check_nesting", "check_size"]

"""What the junk detector reports: finding classes, one finding, one completion's verdict.

Each detector outcome is its own class (:class:`FindingKind`):

==================  ==========================================================================
class               what it is
==================  ==========================================================================
undefined_name      pyflakes ``UndefinedName``/``UndefinedLocal``/``UndefinedExport`` not
                    explained by a missing import (a junk identifier, or a helper never written)
missing_import      an undefined name that is a stdlib module, a ``typing`` name or one of
                    ``undefined.COMMON_IMPORTS`` (``List``, ``math``, ``defaultdict``): a
                    real bug, not junk; kept apart. ``ulp`` is deliberately absent (it is
                    ``math.ulp``, and the card's most frequent junk token)
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
too_large           the input is over the detector's size bounds (bytes or lines, see
                    :mod:`nvfp4study.codeeval.bounds`): not judged
too_deep            the code's expressions nest deeper than the detector's bound, or the
                    parser / pyflakes ran out of recursion on it: not judged
==================  ==========================================================================

**The rule.** A completion is *corrupted* when it has at least one finding of a class in
:data:`CORRUPTING` (undefined_name, glued_name, syntax_error, junk_fence, invalid_utf8,
control_char). ``missing_import``, ``star_import_name`` and ``non_ascii`` are reported but do
not make it corrupted; ``no_code`` is its own status. A completion with none of these is
*clean* (:func:`status_of`). ``too_large`` and ``too_deep`` are statuses of their own that win
over every other (:data:`UNJUDGED`): the detector did not run its checks, so the completion is
neither clean nor corrupted; :attr:`Detection.reason` says why.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any


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
    TOO_LARGE = "too_large"
    TOO_DEEP = "too_deep"


class Status(StrEnum):
    """Per-completion verdict of the rule."""

    CLEAN = "clean"
    CORRUPTED = "corrupted"
    NO_CODE = "no_code"
    TOO_LARGE = "too_large"
    TOO_DEEP = "too_deep"


#: statuses of input the detector refused to judge (its bounds), neither clean nor corrupted
UNJUDGED = frozenset({Status.TOO_LARGE, Status.TOO_DEEP})
CORRUPTING = frozenset({
    FindingKind.UNDEFINED_NAME, FindingKind.GLUED_NAME, FindingKind.SYNTAX_ERROR,
    FindingKind.JUNK_FENCE, FindingKind.INVALID_UTF8, FindingKind.CONTROL_CHAR,
})
# Order used for a completion's single label (most specific first).
LABEL_ORDER = (
    FindingKind.TOO_LARGE, FindingKind.TOO_DEEP, FindingKind.NO_CODE, FindingKind.INVALID_UTF8,
    FindingKind.CONTROL_CHAR,
    FindingKind.GLUED_NAME, FindingKind.JUNK_FENCE, FindingKind.SYNTAX_ERROR,
    FindingKind.UNDEFINED_NAME, FindingKind.MISSING_IMPORT, FindingKind.STAR_IMPORT_NAME,
    FindingKind.NON_ASCII,
)


@dataclass(frozen=True)
class DetectorFinding:
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
    findings: list[DetectorFinding]
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

    @property
    def unjudged(self) -> bool:
        """True when the input was over the detector's bounds (``too_large`` / ``too_deep``)."""
        return self.status in UNJUDGED

    @property
    def reason(self) -> str | None:
        """Why the input was not judged (the bound it broke), None when it was judged."""
        if not self.unjudged:
            return None
        return next(f.detail for f in self.findings if str(f.kind) == str(self.status))

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
        d = {"status": str(self.status), "reason": self.reason, "label": self.label,
             "source": self.source,
             "parsed": self.parsed, "recovered": self.recovered,
             "non_ascii_in_text": self.non_ascii_in_text,
             "findings": [{**asdict(f), "kind": str(f.kind)} for f in self.findings]}
        if self.extraction is not None:
            d["extraction"] = self.extraction
        if with_code:
            d["code"] = self.code
        return d


def status_of(findings: list[DetectorFinding]) -> Status:
    """The rule's verdict on a list of findings (``too_large``, ``too_deep``, then ``no_code`` win,
    then any :data:`CORRUPTING`)."""
    kinds = {f.kind for f in findings}
    for unjudged in (Status.TOO_LARGE, Status.TOO_DEEP):
        if FindingKind(unjudged.value) in kinds:
            return unjudged
    if FindingKind.NO_CODE in kinds:
        return Status.NO_CODE
    return Status.CORRUPTED if kinds & CORRUPTING else Status.CLEAN

"""MoE methods whose weights only a model loader that refuses Ling can prepare (``ast`` and text only).

``moe_params.yaml`` ``shared.loader_requires`` names, per entry, the method classes, the weight
attribute their ``apply`` reads (``bnb_quant_state``), the loader class that attaches it
(``BitsAndBytesModelLoader``) and the model attribute that loader requires
(``bitsandbytes_stacked_params_mapping``). :func:`loader_refusal` checks each fact again in the
tree: the loader's ``if not hasattr(model, "<model_attr>"): raise`` (model_loader/loader.py
3009-3013 in 0.5.20), no file but the loader's attaching the weight attribute (loader.py 3113),
and Ling's model class (``models/bailing_moe_v3.py`` ``BailingMoeV3ForCausalLM``, 1303 in 0.5.20)
not defining the model attribute. Where all hold, each path of those methods is UNUSABLE at the
loader's raise: with that loader the model is refused, with any other the weights lack the
attribute ``apply`` reads, whatever the limit.
"""

from __future__ import annotations

import ast
import re
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import TypeVar

from . import moe_params, path_keys
from .audit_sinks import ClampVerdict
from .code_index import SRT, CodeIndex, class_methods, source_files, tree_stamp, walk
from .model_side import MODEL_FILE
from .startup_checks import LING_ARCH

Row = TypeVar("Row")  # audit.PathResult (not imported: audit imports this module)
LOADER_FILE = SRT + "model_loader/loader.py"


def _loader_raise(code: CodeIndex, loader: str, attr: str) -> int | None:
    """The line of ``raise`` under ``if not hasattr(model, "<attr>"):`` in ``loader``'s methods."""
    cls = code.top(LOADER_FILE, loader)
    for fn in class_methods(cls).values() if isinstance(cls, ast.ClassDef) else ():
        for n in walk(fn):
            if isinstance(n, ast.If) and re.fullmatch(rf"not hasattr\(\w+, '{attr}'\)", ast.unparse(n.test)) \
                    and n.body and isinstance(n.body[0], ast.Raise):
                return n.body[0].lineno
    return None


def _attached_elsewhere(root: Path, attr: str) -> bool:
    """Whether a file other than the loader's sets ``attr`` (``x.attr = ...`` or ``setattr(x, "attr"``)."""
    pat = re.compile(rf"\.{attr}\s*=[^=]|setattr\([^,]+,\s*[\"']{attr}[\"']")
    return any(pat.search(text) for path, text in source_files(root)
               if path.relative_to(root).as_posix() != LOADER_FILE and attr in text)


def _model_defines(code: CodeIndex, attr: str) -> bool | None:
    cls = code.top(SRT + MODEL_FILE, LING_ARCH)
    if not isinstance(cls, ast.ClassDef):
        return None
    names = set(class_methods(cls)) | {t.id for st in cls.body if isinstance(st, ast.Assign | ast.AnnAssign)
                                      for t in (st.targets if isinstance(st, ast.Assign) else [st.target])
                                      if isinstance(t, ast.Name)}
    return attr in names or attr in ast.unparse(cls)


@lru_cache(maxsize=8)
def loader_refusals(root: Path, _stamp: int) -> dict[str, tuple[int, str]]:
    """``{method class: (raise line in loader.py, rule)}`` for each entry whose facts hold in the tree."""
    code, out = CodeIndex(root), {}
    for e in moe_params.shared().get("loader_requires") or []:
        line = _loader_raise(code, e["loader"], e["model_attr"])
        if line is None or _model_defines(code, e["model_attr"]) is not False \
                or _attached_elsewhere(root, e["weight_attr"]):
            continue
        rule = (f"raises for Ling whatever the limit: {e['loader']} refuses a model without "
                f"{e['model_attr']} ({LOADER_FILE[len(SRT):]}:{line}), which {LING_ARCH} ({MODEL_FILE}) does "
                f"not define, and only that loader attaches the {e['weight_attr']} the method's weights need")
        out.update({m: (line, rule) for m in e["methods"]})
    return out


def loader_refused(root: Path, key: str, row: Row) -> Row:
    """``row`` (an ``audit.PathResult`` of path ``key``) made UNUSABLE at the loader's raise when
    :func:`loader_refusals` names the path's method; ABSENT stays ABSENT, the path's own verdict
    is kept in the rule."""
    cls = path_keys.method(key)
    hit = loader_refusals(Path(root), hash(tree_stamp(Path(root)))).get(cls) if cls else None
    if hit is None or row.verdict == ClampVerdict.ABSENT:
        return row
    line, rule = hit
    return replace(row, verdict=ClampVerdict.UNUSABLE, rule=f"{rule} (the path alone: {row.verdict.value}: "
                   f"{row.rule[:120]})", file=LOADER_FILE[len(SRT):], function=None, line=line)


__all__ = ["loader_refusals", "loader_refused"]

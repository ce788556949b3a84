"""Which CLI flags an SGLang release defines, read statically from its source (no install).

``sglang serve``'s parser is built from dataclass fields annotated ``A[T, "help"]`` or
``A[T, Arg(...)]`` in ``sglang/srt/arg_groups/fields/*.py`` (``arg_groups/arg_utils.py``
``add_cli_args_from_dataclass``, 298-420: the flag is ``--field-name`` or ``cli_name``, plus
``aliases``; ``no_cli=True`` fields get none) and a few ``parser.add_argument("--...")`` calls in
``sglang/srt/server_args.py`` (``ServerArgs.add_cli_args``, 351-441). :func:`sglang_cli_flags`
reads both with :mod:`ast` from a wheel or a tree, so the study's command can be checked
against the release it will run on.
"""

from __future__ import annotations

import ast
import os
import zipfile
from pathlib import Path

from ..core.errors import StageInputMissing

WHEEL_CACHE = Path(os.environ.get("NVFP4STUDY_CACHE", Path.home() / ".cache" / "nvfp4study")) / "wheels"

# Where each flag is defined in SGLang 0.5.23 (paths relative to sglang/srt/). Flags declared as
# fields become ``--field-name`` via ``arg_groups/arg_utils.py`` 288-290 and 327-328; booleans are
# ``store_true`` (arg_utils.py 393-399); the two parser flags are registered by hand.
FLAG_SOURCES: dict[str, str] = {
    "--model-path": "arg_groups/fields/model.py:51",
    "--trust-remote-code": "arg_groups/fields/model.py:106",
    "--context-length": "arg_groups/fields/model.py:110",
    "--host": "arg_groups/fields/serving.py:65",
    "--port": "arg_groups/fields/serving.py:66",
    "--tp-size": "arg_groups/fields/parallel.py:45",
    "--ep-size": "arg_groups/fields/parallel.py:281",
    "--mem-fraction-static": "arg_groups/fields/schedule.py:27",
    "--max-running-requests": "arg_groups/fields/schedule.py:31",
    "--chunked-prefill-size": "arg_groups/fields/schedule.py:52",
    "--disable-shared-experts-fusion": "arg_groups/fields/exec_.py:984",
    "--enable-deterministic-inference": "arg_groups/fields/exec_.py:1153",
    "--enable-metrics": "arg_groups/fields/observability.py:70",
    "--speculative-algorithm": "arg_groups/fields/spec.py:31",
    "--speculative-num-steps": "arg_groups/fields/spec.py:58",
    "--speculative-eagle-topk": "arg_groups/fields/spec.py:62",
    "--speculative-num-draft-tokens": "arg_groups/fields/spec.py:66",
    "--reasoning-parser": "server_args.py:369",
    "--tool-call-parser": "server_args.py:379",
}


def sglang_cli_flags(source: str | Path) -> dict[str, str]:
    """Every CLI flag SGLang's server parser defines, read statically from its source.

    Reads ``sglang/srt/arg_groups/fields/*.py`` (fields annotated ``A[T, "help"]`` or
    ``A[T, Arg(...)]``, skipping ``no_cli=True``; name ``--field-name`` or ``cli_name``, plus
    ``aliases``) and the hand-registered ``parser.add_argument("--...")`` calls of
    ``sglang/srt/server_args.py``, the way ``arg_utils.add_cli_args_from_dataclass`` does.

    Args:
        source: an SGLang wheel (``.whl``) or a folder holding ``sglang/srt``.

    Returns:
        ``{flag: "path:line"}`` with paths relative to ``sglang/srt/``.
    """
    files = _read_sources(Path(source))
    flags: dict[str, str] = {}
    for rel, text in files.items():
        tree = ast.parse(text)
        if rel.startswith("arg_groups/fields/"):
            for node in ast.walk(tree):
                if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                    for name in _field_flags(node):
                        flags.setdefault(name, f"{rel}:{node.lineno}")
        else:
            for node in ast.walk(tree):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr == "add_argument"):
                    for a in node.args:
                        if isinstance(a, ast.Constant) and str(a.value).startswith("--"):
                            flags.setdefault(a.value, f"{rel}:{a.lineno}")
    return flags


def _read_sources(source: Path) -> dict[str, str]:
    prefix = "sglang/srt/"
    want = lambda n: (n.startswith(prefix + "arg_groups/fields/") and n.endswith(".py")) or n == prefix + "server_args.py"  # noqa: E731
    out: dict[str, str] = {}
    if source.is_file() and source.suffix == ".whl":
        with zipfile.ZipFile(source) as z:
            for n in z.namelist():
                if want(n):
                    out[n[len(prefix):]] = z.read(n).decode()
    else:
        root = source / "sglang" / "srt" if (source / "sglang" / "srt").is_dir() else source
        for f in [*sorted((root / "arg_groups" / "fields").glob("*.py")), root / "server_args.py"]:
            if f.is_file():
                out[str(f.relative_to(root))] = f.read_text()
    if "server_args.py" not in out:
        raise StageInputMissing(f"{source}: no sglang/srt/server_args.py (not an SGLang wheel or tree)")
    return out


def _field_flags(node: ast.AnnAssign) -> list[str]:
    ann = node.annotation
    if not (isinstance(ann, ast.Subscript) and isinstance(ann.value, ast.Name) and ann.value.id == "A"):
        return []
    elts = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
    if len(elts) < 2:
        return []
    meta = elts[1]
    name = "--" + node.target.id.replace("_", "-")
    if isinstance(meta, ast.Constant) and isinstance(meta.value, str):
        return [name]
    if isinstance(meta, ast.Call) and getattr(meta.func, "id", None) == "Arg":
        kw = {k.arg: k.value for k in meta.keywords}
        if isinstance(kw.get("no_cli"), ast.Constant) and kw["no_cli"].value is True:
            return []
        if isinstance(kw.get("cli_name"), ast.Constant):
            name = kw["cli_name"].value
        aliases = [e.value for e in getattr(kw.get("aliases"), "elts", []) if isinstance(e, ast.Constant)]
        return [name, *aliases]
    return []


def cached_wheel(version: str) -> Path | None:
    """The cached SGLang wheel of ``version`` under ``~/.cache/nvfp4study/wheels``, if present."""
    found = sorted(WHEEL_CACHE.glob(f"sglang-{version}-*.whl"))
    return found[0] if found else None

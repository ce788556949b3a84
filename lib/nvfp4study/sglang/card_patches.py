"""The card's own patch files, replayed as published on copies of the released SGLang trees.

The card ships ``sglang_patch/01-flashinfer_cutlass.patch`` and
``sglang_patch/02-compressed_tensors_w4a4_nvfp4_moe.patch`` in its Hub repo and says to apply them
with ``cd <sglang>/python/sglang/srt`` then ``patch -p1 < sglang_patch/NN-*.patch`` in order. In a
wheel's tree (:class:`~.source.SGLangTree`) that folder is ``root/sglang/srt``. This module runs
GNU ``patch`` exactly so (``-p1`` in ``srt``, the files in name order, each one ``--dry-run``
first), on a copy of each release (:func:`~.source.copy_tree`), never on the cache or an install.

A patch that does not apply is a finding, not an error: which file, which hunk, at which line, on
which release (parsed from GNU patch's ``Hunk #N FAILED at L`` lines). Offsets and fuzz that GNU
patch accepts by default are accepted and reported, as a user running the card's command gets them.
After every file applied, the copy is audited (:func:`~.audit.audit_tree`, the NVFP4 CUTLASS and
TRT-LLM paths) and the changed files byte-compiled. A file that is not a unified diff is refused
with :class:`~nvfp4study.core.errors.CardPatchNotUnifiedDiff` before anything runs.
"""

from __future__ import annotations

import py_compile
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from ..core import hub
from ..core.errors import CardPatchError, CardPatchNotUnifiedDiff
from ..core.params import HubSource
from .source import SGLangTree, copy_tree

#: where the card's repo keeps its patches, and what its instructions apply them with
PATCH_GLOB = "sglang_patch/*.patch"
PATCH_ARGS = ("-p1", "--batch", "--forward")
AUDITED_PATHS = ["nvfp4-w4a4-cutlass", "nvfp4-w4a4-trtllm"]
_HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+\d+(?:,\d+)? @@", re.M)
_FILE = re.compile(r"^(?:checking|patching) file (.+)$")
_FAILED = re.compile(r"^Hunk #(\d+) FAILED at (\d+)")
_MOVED = re.compile(r"^Hunk #(\d+) succeeded at (\d+)(?: with fuzz (\d+))?(?: \(offset (-?\d+) lines?\))?")


def check_unified_diff(name: str, text: str) -> list[str]:
    """The target files of a unified diff (``+++`` paths), checking it is one.

    Raises:
        CardPatchNotUnifiedDiff: no ``--- `` / ``+++ `` header pair followed by an ``@@`` hunk.
    """
    lines = text.splitlines()
    targets = [lines[i + 1][4:].split("\t")[0].strip() for i in range(len(lines) - 1)
               if lines[i].startswith("--- ") and lines[i + 1].startswith("+++ ")]
    if not targets or not _HUNK.search(text):
        raise CardPatchNotUnifiedDiff(f"{name} is not a unified diff (no '---'/'+++' header with an '@@' hunk); "
                                      "the card's instructions feed it to `patch -p1`, which needs one")
    return targets


def fetch(source: HubSource | None, folder: str | None) -> tuple[list[Path], dict[str, Any]]:
    """The card's patch files, in the order its instructions apply them (by name).

    From ``folder`` (its ``*.patch`` files, or those of its ``sglang_patch/``), else from the Hub
    repo ``source`` (``snapshot_download`` of ``sglang_patch/*.patch`` only, into the Hub cache).
    Returns ``(files, origin)``; ``origin`` says where they came from (repo and commit for the Hub).

    Raises:
        CardPatchError: the folder is missing or holds no ``*.patch``;
        HubError subclasses (repo/revision unknown, 401/403, no network, offline and not cached).
    """
    if folder:
        root = Path(folder)
        if not root.is_dir():
            raise CardPatchError(f"card_patch_dir {root} is not a folder")
        files = sorted(root.glob("*.patch")) or sorted((root / "sglang_patch").glob("*.patch"))
        origin: dict[str, Any] = {"kind": "folder", "path": str(root)}
    elif source is not None:
        ref = hub.HubRef(source.repo_id, source.revision)
        snap, commit = hub.download(ref, allow_patterns=[PATCH_GLOB])
        files = sorted((snap / "sglang_patch").glob("*.patch"))
        origin = {"kind": "hub", "repo_id": source.repo_id, "revision": source.revision, "commit": commit,
                  "label": f"hf:{source.repo_id}@{commit}"}
    else:
        raise CardPatchError("no card patches named (sglang.card_patches or sglang.card_patch_dir)")
    if not files:
        raise CardPatchError(f"no *.patch files in {origin.get('path') or origin['label']} (looked for {PATCH_GLOB})")
    origin["files"] = [f.name for f in files]
    return files, origin


def _parse(out: str) -> dict[str, Any]:
    """GNU patch's report: per target file the failed hunks (number, line) and the moved ones."""
    files: dict[str, dict[str, list]] = {}
    cur = None
    for ln in out.splitlines():
        if m := _FILE.match(ln):
            cur = files.setdefault(m.group(1).strip(), {"failed": [], "moved": []})
        elif cur is not None and (m := _FAILED.match(ln)):
            cur["failed"].append({"hunk": int(m.group(1)), "line": int(m.group(2))})
        elif cur is not None and (m := _MOVED.match(ln)):
            cur["moved"].append({"hunk": int(m.group(1)), "at": int(m.group(2)), "fuzz": int(m.group(3) or 0),
                                 "offset": int(m.group(4) or 0)})
    return files


def _patch(srt: Path, f: Path, dry: bool) -> tuple[int, str]:
    cmd = ["patch", *PATCH_ARGS, *(["--dry-run"] if dry else []), "-i", str(f.resolve())]
    try:
        p = subprocess.run(cmd, cwd=srt, capture_output=True, text=True, timeout=120)
    except FileNotFoundError as exc:
        raise CardPatchError("GNU patch is not installed (apt-get install patch)") from exc
    return p.returncode, (p.stdout + p.stderr).strip()


def replay(files: list[Path], tree: SGLangTree, work: str | Path) -> dict[str, Any]:
    """Apply ``files`` in order as the card says (``patch -p1`` in ``sglang/srt``) to a copy of
    ``tree`` under ``work`` (removed afterwards), each after a ``--dry-run``; stop at the first one
    that does not apply (a user's shell would leave a half-patched tree: we report it instead).

    Returns ``{"sglang", "applies", "patches": [{"file", "applies", "targets", "failed_hunks",
    "moved_hunks", "output"}], "audit": {path: {"verdict", "rule", "where"}} | None,
    "py_compile_ok": [...]}``.

    Raises:
        CardPatchNotUnifiedDiff: a file is not a unified diff (checked for all before any runs).
    """
    texts = {f: f.read_text(errors="replace") for f in files}
    targets = {f: check_unified_diff(f.name, t) for f, t in texts.items()}
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"card-patch-{tree.version}-", dir=work))
    out: dict[str, Any] = {"sglang": tree.version, "applies": False, "patches": [], "audit": None, "py_compile_ok": []}
    try:
        copy = copy_tree(tree, tmp / "tree")
        for f in files:
            rc, text = _patch(copy.srt, f, dry=True)
            if rc == 0:
                rc, text = _patch(copy.srt, f, dry=False)
            parsed = _parse(text)
            out["patches"].append({
                "file": f.name, "applies": rc == 0, "targets": targets[f], "output": text[-2000:],
                "failed_hunks": {k: v["failed"] for k, v in parsed.items() if v["failed"]},
                "moved_hunks": {k: v["moved"] for k, v in parsed.items() if v["moved"]}})
            if rc != 0:
                return out
        out["applies"] = True
        changed = sorted({p for r in out["patches"] for p in _parse(r["output"])})
        for rel in changed:
            py_compile.compile(str(copy.srt / rel), cfile=str(tmp / "check.pyc"), doraise=True)
            out["py_compile_ok"].append(rel)
        from .audit import audit_tree

        out["audit"] = {r.path: {"verdict": r.verdict.value, "rule": r.rule,
                                 "where": f"{r.file}:{r.line}" if r.file else None}
                        for r in audit_tree(copy, AUDITED_PATHS)}
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def replay_releases(files: list[Path], trees: list[SGLangTree], work: str | Path) -> list[dict[str, Any]]:
    """:func:`replay` on each release (the card's files fit the release they were made for; the
    others say which hunk fails where)."""
    return [replay(files, t, work) for t in trees]


def summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    """``{"applies_to": [versions], "fails_on": {version: "file hunk #N at L, ..."}, "cutlass":
    {version: verdict}}`` for the ledger."""
    fails = {}
    for r in results:
        if not r["applies"]:
            bad = next(p for p in r["patches"] if not p["applies"])
            where = "; ".join(f"{t} hunk #{h['hunk']} at {h['line']}" for t, hs in bad["failed_hunks"].items() for h in hs)
            fails[r["sglang"]] = f"{bad['file']}: {where or bad['output'].splitlines()[-1]}"
    return {"applies_to": [r["sglang"] for r in results if r["applies"]], "fails_on": fails,
            "cutlass": {r["sglang"]: r["audit"]["nvfp4-w4a4-cutlass"]["verdict"] for r in results if r["audit"]}}


#: why the card's files were not replayed when the params name none, and what settles it
NOT_NAMED = ("no Hub access: the params name neither sglang.card_patches nor sglang.card_patch_dir, so the card's "
             "own patch files were not read (our reconstruction, patches/0.5.20/card, stands in); "
             "`nvfp4study run --params params/card-files.yaml` replays them")


def run(source: HubSource | None, folder: str | None, versions: list[str], work: str | Path) -> dict[str, Any]:
    """Fetch the card's patches and replay them on each release in ``versions`` (released wheels,
    from the study's cache or pip). Never raises for the card's files or the Hub: the result says
    ``{"run": False, "reason"}`` (not named; a HubError; CardPatchError, e.g. not a unified diff),
    else ``{"run": True, "origin", "results": [replay...], "summary": summary(...)}``."""
    from ..core.errors import HubError
    from .source import unpack_wheel

    if not (source or folder):
        return {"run": False, "reason": NOT_NAMED}
    try:
        files, origin = fetch(source, folder)
        results = replay_releases(files, [unpack_wheel(v) for v in versions], work)
    except (HubError, CardPatchError) as exc:
        return {"run": False, "reason": f"{type(exc).__name__}: {exc}"}
    return {"run": True, "origin": origin, "results": results, "summary": summary(results)}


def table(data: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per release x patch file: applies, failed hunks, offsets/fuzz, and the CUTLASS /
    TRT-LLM clamp verdicts after every file applied."""
    if not data.get("run"):
        return [{"sglang": None, "patch": None, "applies": None, "note": f"not run: {data.get('reason')}"}]
    rows = []
    for r in data["results"]:
        for p in r["patches"]:
            rows.append({"sglang": r["sglang"], "patch": p["file"], "applies": p["applies"],
                         "failed hunks": "; ".join(f"{t} #{h['hunk']} at {h['line']}" for t, hs in p["failed_hunks"].items()
                                                   for h in hs) or "-",
                         "moved hunks": sum(len(v) for v in p["moved_hunks"].values()),
                         "CUTLASS after": (r["audit"] or {}).get("nvfp4-w4a4-cutlass", {}).get("verdict", "-"),
                         "TRT-LLM after": (r["audit"] or {}).get("nvfp4-w4a4-trtllm", {}).get("verdict", "-")})
    return rows

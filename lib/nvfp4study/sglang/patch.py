"""Patch an SGLang tree into one of the study's clamp modes, check it, and restore it byte for byte.

Patch sets live in ``patches/<version>/`` (package data): ``manifest.json`` lists, per mode, the
files it changes with the SHA-256 of the released original and of the patched file, and one
unified diff per file (``patch -p1`` applies them from the tree root too). Modes:

- ``stock``: no change (apply = check every file is the released original);
- ``none``: the clamp removed from the NVFP4 CUTLASS call (the card's "before" state);
- ``exact``: the NVFP4 CUTLASS call selects FlashInfer's post-SiLU ``SwigluStep`` when a limit is
  set without alpha, the TRT-LLM branch passes the clamp, and each MoE layer logs
  ``[swiglu-clamp-patch] cutlass nvfp4 limit=<L> mode=exact form=<...> layer=<i>``; on the CUTLASS
  branch it also applies ``routed_scaling_factor`` once, which the released scheme drops
  (``apply_routed_scaling_factor`` set unless top-k folded it or the all-to-all backend is on, and
  the runner's post-call product extended to fp4; the manifest's description has the lines);
- ``card`` (0.5.19 and 0.5.20; later releases already carry its edits): the card's own patch as it describes it;
- ``det``: the deterministic-inference edit (``MIN_DEEPGEMM_DIM`` 16 -> 64), combinable with any
  clamp mode;
- the CPU engine's native MoE path (:data:`NATIVE_AXES`; 0.5.23), each axis combinable with the
  others, with any clamp mode and with ``det``: ``native-clamp-exact`` / ``native-clamp-approx``
  (``moe_clamp``: Ling's post-SiLU clamp, or the pre-SiLU form, on the routed experts of
  ``moe_forward_native``, which drops the limit as released); ``native-routed-scaling``
  (``routed_scaling``: ``routed_scaling_factor`` applied once to the routed output, which the
  released native path never scales; :mod:`.patch_native` says where 0.5.23 does and does not).

Guarantees: apply is idempotent; it refuses (named error, nothing written) an unknown version or
mode, a file whose hash matches neither the original nor this mode's result, another clamp mode
already applied, or a read-only file/folder; all files are prepared and compiled in memory first,
then written through a journal (:mod:`nvfp4study.sglang.patch_journal`): a failed write rolls
the earlier ones back, and after a kill at any instant the next ``patch`` command (apply,
revert, status, switch, verify) finishes the interrupted one before it does anything else, so
the tree is never left half-patched and no temporary file stays in the package. Revert
restores the original bytes, checked against the recorded hash. :func:`status` names each
file's state; a tree whose files are each in a known state but not in one mode is ``mixed``,
and ``revert`` (no mode) brings it back to the released files.

For the serving stage: :func:`switch_mode` moves an install to one mode (reverting any other
first; ``native=`` sets the native axes) and records it in a state file; :func:`serving_mode` is
a context manager that applies a mode and restores the previous state on exit, whatever happens.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import hashlib
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from ..core.errors import (
    PatchConflict,
    PatchStateError,
    PatchTargetReadOnly,
    UnknownPatchMode,
    UnknownPatchVersion,
)
from ..core.files import write_json
from . import patch_journal
from .patch_diff import apply_unified_diff
from .patch_native import NATIVE_AXES as NATIVE_AXES  # re-exported: patch.NATIVE_AXES
from .patch_native import NATIVE_MODES, RELEASED, native_state, native_steps, side_files
from .source import SGLangTree, open_tree

CLAMP_MODES = ("stock", "none", "exact", "card")
DET = "det"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@cache
def _manifest(version: str) -> dict[str, Any]:
    base = resources.files(__package__).joinpath("patches")
    f = base.joinpath(version, "manifest.json")
    if not f.is_file():
        have = sorted(p.name for p in base.iterdir() if p.joinpath("manifest.json").is_file())
        raise UnknownPatchVersion(f"no patch set for SGLang {version}; patch sets exist for {', '.join(have)}")
    return json.loads(f.read_text())


def patch_versions() -> list[str]:
    """SGLang versions that have a patch set."""
    base = resources.files(__package__).joinpath("patches")
    return sorted(p.name for p in base.iterdir() if p.joinpath("manifest.json").is_file())


def modes_for(version: str) -> list[str]:
    """Modes available for a version: ``stock`` always, the patch set's clamp modes, ``det``, then
    the native modes (:data:`NATIVE_MODES`) it has."""
    m = _manifest(version)["modes"]
    return (["stock"] + [k for k in m if k != DET and k not in NATIVE_MODES] + ([DET] if DET in m else [])
            + [k for k in NATIVE_MODES if k in m])


def _clamp_modes(version: str) -> list[str]:
    """The version's clamp modes that carry a patch (neither ``stock``, ``det`` nor a native mode)."""
    return [m for m in modes_for(version) if m not in ("stock", DET) and m not in NATIVE_MODES]


def _files(version: str, mode: str) -> list[dict[str, Any]]:
    if mode == "stock":
        return []
    modes = _manifest(version)["modes"]
    if mode not in modes:
        raise UnknownPatchMode(f"mode {mode!r} has no patch for SGLang {version}; modes: {', '.join(modes_for(version))}")
    return modes[mode]["files"]


def _diff_text(version: str, entry: dict[str, Any]) -> str:
    return resources.files(__package__).joinpath("patches", version, entry["patch"]).read_text()


@dataclass
class FileState:
    path: str
    state: str  # "original" | "patched:<mode>" | "modified" | "missing"
    sha256: str | None


def file_states(tree: SGLangTree) -> dict[str, FileState]:
    """The state of every file any mode of the tree's version touches."""
    man = _manifest(tree.version)
    known: dict[str, dict[str, str]] = {}
    for mode, spec in man["modes"].items():
        for e in spec["files"]:
            d = known.setdefault(e["path"], {"original": e["original_sha256"]})
            d[f"patched:{mode}"] = e["patched_sha256"]
    out = {}
    for rel, hashes in known.items():
        p = tree.file(rel)
        if not p.is_file():
            out[rel] = FileState(rel, "missing", None)
            continue
        h = _sha(p.read_bytes())
        state = next((k for k, v in hashes.items() if v == h and k == "original"), None) or \
            next((k for k, v in hashes.items() if v == h), "modified")
        out[rel] = FileState(rel, state, h)
    return out


def status(tree: SGLangTree) -> dict[str, Any]:
    """``{"sglang_version", "clamp_mode", "det", "native", "files": {path: state}}``.

    ``clamp_mode`` is ``stock`` when every clamp file is original, a mode name when all of that
    mode's files carry its patch, ``"mixed"`` when every clamp file is original or carries some
    mode's patch but they form no single mode (``files`` says which file is in which state), and
    ``"modified"`` when a file is missing or matches no known state. ``native`` maps each native
    axis the version has (:data:`NATIVE_AXES`) to its value, :data:`RELEASED` or ``"modified"``.
    An interrupted earlier
    command is finished first (:func:`recover`); then ``"recovered"`` lists what was done.

    Raises:
        PatchStateError: a pending journal cannot be finished (see :func:`recover`).
    """
    recovered = recover(tree)
    states = file_states(tree)
    det_files = {e["path"] for e in _manifest(tree.version)["modes"].get(DET, {"files": []})["files"]}
    side = side_files(_manifest(tree.version)["modes"])
    clamp_states = {p: s.state for p, s in states.items() if p not in side}
    mode = "modified"
    if all(s == "original" for s in clamp_states.values()):
        mode = "stock"
    else:
        for m in _clamp_modes(tree.version):
            mine = {e["path"] for e in _files(tree.version, m)}
            if all(clamp_states[p] == f"patched:{m}" for p in mine) and \
                    all(clamp_states[p] == "original" for p in clamp_states if p not in mine):
                mode = m
        if mode == "modified" and all(s == "original" or s.startswith("patched:")
                                      for s in clamp_states.values()):
            mode = "mixed"
    det = bool(det_files) and all(states[p].state == f"patched:{DET}" for p in det_files)
    out = {"sglang_version": tree.version, "clamp_mode": mode, "det": det,
           "native": native_state(_manifest(tree.version)["modes"], states), "files": {p: s.state for p, s in states.items()}}
    if recovered:
        out["recovered"] = recovered
    return out


def recover(tree: SGLangTree) -> list[str]:
    """Finish a patch command that was killed midway (:func:`nvfp4study.sglang.patch_journal.recover`);
    returns what was done ([] when nothing was pending).

    Raises:
        PatchStateError, PatchTargetReadOnly: as :func:`~nvfp4study.sglang.patch_journal.recover`.
    """
    return patch_journal.recover(tree.root)


def _describe(states: dict[str, str]) -> str:
    return "; ".join(f"{p}: {s}" for p, s in states.items())


def _writable(p: Path) -> bool:
    # os.access says yes to root whatever the mode bits; a file or folder without any write bit
    # is treated as read-only too (a read-only site-packages stays untouched even for root).
    return os.access(p, os.W_OK) and bool(p.stat().st_mode & 0o222)


def _check_writable(paths: list[Path], root: Path | None = None) -> None:
    if root is not None and paths and not _writable(root):
        raise PatchTargetReadOnly(f"{root} (the tree root, where the patch journal goes) is not "
                                  "writable; no file was changed")
    for p in paths:
        if not _writable(p) or not _writable(p.parent):
            raise PatchTargetReadOnly(f"{p} (or its folder) is not writable; no file was changed")


def _transform(tree: SGLangTree, mode: str, to_patched: bool,
               entries: list[dict[str, Any]] | None = None) -> dict[Path, tuple[bytes, bytes]]:
    """Plan: {path: (current bytes, new bytes)} for files that must change; checks hashes.
    ``entries`` (default: the mode's manifest entries) restricts the plan to those files."""
    plan: dict[Path, tuple[bytes, bytes]] = {}
    for e in _files(tree.version, mode) if entries is None else entries:
        p = tree.file(e["path"])
        if not p.is_file():
            raise PatchConflict(f"{e['path']} is missing from {tree.root}")
        cur = p.read_bytes()
        h = _sha(cur)
        want, have = (e["patched_sha256"], e["original_sha256"]) if to_patched else \
            (e["original_sha256"], e["patched_sha256"])
        if h == want:
            continue  # already there: idempotent
        if h != have:
            raise PatchConflict(
                f"{e['path']} matches neither the released original nor the {mode!r} patch "
                f"(sha256 {h[:12]}); it changed since the patch was made or another mode is applied")
        text = apply_unified_diff(cur.decode("utf-8"), _diff_text(tree.version, e), reverse=not to_patched)
        data = text.encode("utf-8")
        if _sha(data) != want:
            raise PatchConflict(f"{e['path']}: patched result does not match the recorded hash")
        compile(data, str(p), "exec")  # a patched file must still compile
        plan[p] = (cur, data)
    return plan


def _execute(tree: SGLangTree, plan: dict[Path, tuple[bytes, bytes]]) -> list[str]:
    if not plan:
        return []
    _check_writable(list(plan), tree.root)
    patch_journal.write_all(tree.root, {p: new for p, (_, new) in plan.items()},
                            {p: cur for p, (cur, _) in plan.items()})
    return [str(p) for p in plan]


def apply(tree: SGLangTree, mode: str) -> list[str]:
    """Apply ``mode`` (a clamp mode or ``det``) to ``tree``; returns the files written.

    Raises:
        UnknownPatchVersion, UnknownPatchMode, PatchConflict, PatchTargetReadOnly.
    """
    files = _files(tree.version, mode)  # validates version and mode
    if mode in CLAMP_MODES:
        st = status(tree)
        cur = st["clamp_mode"]
        if cur == "modified":
            bad = [p for p, s in st["files"].items() if s in ("modified", "missing")]
            raise PatchConflict(f"{', '.join(bad) or 'clamp files'} in {tree.root} matches neither the released "
                                "original nor a known patch (changed since the patch was made?); nothing written")
        if cur == "mixed":
            raise PatchConflict(f"{tree.root} is a mixed tree ({_describe(st['files'])}); run "
                                "`nvfp4study patch revert` first; nothing written")
        if cur not in ("stock", mode):
            raise PatchConflict(f"clamp mode {cur!r} is applied to {tree.root}; revert it first "
                                "(or use `nvfp4study patch switch`)")
        if mode == "stock":
            return []
    else:
        recover(tree)
    del files
    return _execute(tree, _transform(tree, mode, to_patched=True))


def revert(tree: SGLangTree, mode: str | None = None) -> list[str]:
    """Restore the released files of ``mode`` (default: whatever clamp mode is applied; ``det``
    must be named). Returns the files written.

    Raises:
        UnknownPatchVersion, UnknownPatchMode, PatchConflict, PatchTargetReadOnly.

    A ``mixed`` tree (each clamp file original or carrying some mode's patch) is reverted file by
    file to the released bytes when no mode is named.
    """
    st = status(tree)  # finishes an interrupted command first
    if mode is None:
        mode = st["clamp_mode"]
        if mode == "modified":
            raise PatchConflict(f"{tree.root}: clamp files match no known state "
                                f"({_describe(st['files'])}); cannot revert safely")
        if mode == "mixed":
            entries = [(m, e) for m in _clamp_modes(tree.version)
                       for e in _files(tree.version, m) if st["files"][e["path"]] == f"patched:{m}"]
            plan: dict[Path, tuple[bytes, bytes]] = {}
            for m, e in entries:
                plan |= _transform(tree, m, to_patched=False, entries=[e])
            return _execute(tree, plan)
    if mode == "stock":
        return []
    return _execute(tree, _transform(tree, mode, to_patched=False))


def verify(tree: SGLangTree, mode: str) -> dict[str, Any]:
    """Whether ``tree`` is exactly in ``mode``: ``{"ok": bool, ...status}``; for ``det``, whether
    the deterministic edit is applied; for a native mode, whether its axis has its value."""
    _files(tree.version, mode)
    st = status(tree)
    if mode in NATIVE_MODES:
        axis, value = NATIVE_MODES[mode]
        st["ok"] = st["native"].get(axis) == value
    else:
        st["ok"] = st["det"] if mode == DET else st["clamp_mode"] == mode
    st["mode"] = mode
    return st


def check_can_apply(tree: SGLangTree, mode: str) -> None:
    """Dry run: could :func:`switch_mode` put ``tree`` into ``mode``? Checks the version, the
    mode, every file's hash (original, or a known patch that can be reverted) and write
    permission; writes nothing.

    Raises:
        UnknownPatchVersion, UnknownPatchMode, PatchConflict, PatchTargetReadOnly.
    """
    files = _files(tree.version, mode)
    states = file_states(tree)
    for e in files:
        st = states[e["path"]]
        if st.state in ("modified", "missing"):
            raise PatchConflict(f"{e['path']} is {st.state} in {tree.root}; mode {mode!r} cannot be applied")
    _check_writable([tree.file(e["path"]) for e in files])


def load_state(state_file: str | Path) -> dict[str, Any]:
    """Read a state file written by :func:`write_state` / stage 03.

    Raises:
        PatchStateError: missing or unreadable.
    """
    try:
        return json.loads(Path(state_file).read_text())
    except (OSError, ValueError) as exc:
        raise PatchStateError(f"cannot read patch state {state_file}: {exc}") from exc


def install_from_state(state_file: str | Path) -> SGLangTree:
    """The serving install recorded by stage 03 in ``data/sglang_patch_state.json``.

    Raises:
        PatchStateError: no state file, or stage 03 patched no install (CPU profile).
    """
    st = load_state(state_file)
    if not st.get("install"):
        raise PatchStateError(f"{state_file}: no serving install was prepared ({st.get('note', '')})")
    return open_tree(st["install"])


def write_state(state_file: str | Path, tree: SGLangTree, note: str = "") -> dict[str, Any]:
    """Record the tree's current patch state as JSON (atomically) and return it."""
    path = Path(state_file)
    prev = {}
    if path.is_file():
        with contextlib.suppress(OSError, ValueError):
            prev = json.loads(path.read_text())
    st = {**prev, **status(tree)}  # keeps keys stage 03 added (install, needed_modes)
    st.update(tree=str(tree.root), note=note,
              time=_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"))
    write_json(path, st)
    return st


def switch_mode(tree: SGLangTree | str | Path, mode: str, det: bool | None = None,
                state_file: str | Path | None = None,
                native: dict[str, str] | None = None) -> dict[str, Any]:
    """Put a tree (e.g. the serving install) into clamp ``mode`` and, if ``det`` is not None,
    the deterministic edit on/off, and each native axis ``native`` names (e.g.
    ``{"moe_clamp": "exact"}``; :data:`NATIVE_AXES`, :data:`RELEASED`) to its value; record the
    result in ``state_file``. Returns the status.

    Every file is checked before anything is written; if a later step fails the earlier ones are
    undone, so the tree is left in its previous state or the requested one.

    Raises:
        UnknownPatchVersion, UnknownPatchMode, PatchConflict, PatchTargetReadOnly.
    """
    tree = tree if isinstance(tree, SGLangTree) else open_tree(tree)
    if mode not in CLAMP_MODES:
        raise UnknownPatchMode(f"{mode!r} is not a clamp mode ({', '.join(CLAMP_MODES)})")
    _files(tree.version, mode)
    before = status(tree)
    if before["clamp_mode"] in ("modified", "mixed"):
        raise PatchConflict(f"{tree.root}: clamp files are in no single known mode "
                            f"({_describe(before['files'])}); refusing to switch")
    steps = native_steps(before["native"], native, tree.version)
    for m, _ in steps:
        _files(tree.version, m)
    undo: list[tuple[str, bool]] = []
    try:
        if before["clamp_mode"] != mode:
            if before["clamp_mode"] != "stock":
                revert(tree, before["clamp_mode"])
                undo.append((before["clamp_mode"], True))
            if mode != "stock":
                apply(tree, mode)
                undo.append((mode, False))
        if det is not None and det != before["det"]:
            (apply if det else revert)(tree, DET)
            undo.append((DET, not det))
        for m, on in steps:
            (apply if on else revert)(tree, m)
            undo.append((m, not on))
    except Exception:
        for m, reapply in reversed(undo):
            (apply if reapply else revert)(tree, m)
        raise
    st = status(tree)
    if state_file is not None:
        st = write_state(state_file, tree, note=f"switch_mode({mode!r}, det={det}, native={native})")
    return st


@contextlib.contextmanager
def serving_mode(tree: SGLangTree | str | Path, mode: str, det: bool | None = None,
                 state_file: str | Path | None = None,
                 native: dict[str, str] | None = None) -> Iterator[dict[str, Any]]:
    """``with serving_mode(install, "exact", native={"moe_clamp": "exact"}):`` start the server
    inside; on exit (normal or not) the install returns to the state it had before (the native
    axes named included), and ``state_file`` says so."""
    tree = tree if isinstance(tree, SGLangTree) else open_tree(tree)
    before = status(tree)
    if before["clamp_mode"] in ("modified", "mixed"):
        raise PatchStateError(f"{tree.root}: clamp files match no known state")
    st = switch_mode(tree, mode, det, state_file, native)
    back = {a: before["native"].get(a, RELEASED) for a in native or {}}
    try:
        yield st
    finally:
        switch_mode(tree, before["clamp_mode"], before["det"], state_file, back or None)


def main(argv: list[str] | None = None) -> int:
    """``nvfp4study patch apply|verify|revert|status --mode MODE --sglang PATH``."""
    ap = argparse.ArgumentParser(
        prog="nvfp4study patch",
        description="Apply, verify or revert the study's SGLang clamp patches (and the det edit).",
        epilog="example: nvfp4study patch apply --mode exact --sglang ~/sglang-0.5.23-copy",
    )
    ap.add_argument("action", choices=["apply", "verify", "revert", "status", "switch"])
    ap.add_argument("--mode", help="stock, none, exact, card (0.5.19, 0.5.20), det, or a native "
                    "mode (native-clamp-exact, native-clamp-approx; 0.5.23)")
    ap.add_argument("--sglang", required=True, help="the SGLang tree (folder holding sglang/)")
    ap.add_argument("--state-file", help="with switch: where to record the resulting state (JSON)")
    a = ap.parse_args(argv)
    tree = open_tree(a.sglang)
    if a.action in ("apply", "verify", "switch") and not a.mode:
        ap.error(f"{a.action} needs --mode")
    for line in recover(tree):  # every command first finishes one that was killed midway
        print(f"note: {line}", file=sys.stderr)
    if a.action == "apply":
        written = apply(tree, a.mode)
        print(f"{a.mode}: {len(written)} file(s) written" + "".join(f"\n  {w}" for w in written))
    elif a.action == "revert":
        written = revert(tree, a.mode)
        print(f"reverted: {len(written)} file(s) restored" + "".join(f"\n  {w}" for w in written))
    elif a.action == "switch":
        print(json.dumps(switch_mode(tree, a.mode, state_file=a.state_file), indent=1))
    elif a.action == "verify":
        st = verify(tree, a.mode)
        print(json.dumps(st, indent=1))
        return 0 if st["ok"] else 1
    else:
        print(json.dumps(status(tree), indent=1))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

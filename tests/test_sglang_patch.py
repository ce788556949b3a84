"""Patch apply / verify / revert on copies of the released trees, and every refusal."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import py_compile
from pathlib import Path

import pytest

from nvfp4study.core.errors import (
    NotAnSGLangTree,
    PatchConflict,
    PatchStateError,
    PatchTargetReadOnly,
    UnknownPatchMode,
    UnknownPatchVersion,
)
from nvfp4study.sglang import patch as sp
from nvfp4study.sglang.audit import audit_tree
from nvfp4study.sglang.source import COPY_SKIP_DIRS, copy_tree, open_tree
from sglang_fixtures import copy23_shared_fixture, mini_tree, released  # noqa: F401  (the copy23_shared fixture)

NVFP4 = "sglang/srt/layers/quantization/compressed_tensors/schemes/compressed_tensors_w4a4_nvfp4_moe.py"
CUTLASS = "sglang/srt/layers/moe/moe_runner/flashinfer_cutlass.py"
BIO = "sglang/srt/batch_invariant_ops/batch_invariant_ops.py"
NATIVE = "sglang/srt/layers/moe/fused_moe_native.py"
UNQUANT = "sglang/srt/layers/quantization/unquant.py"
TOUCHED = (CUTLASS, NVFP4, BIO, NATIVE, UNQUANT)


def _hashes(tree) -> dict[str, str]:
    return {str(p.relative_to(tree.root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(tree.package.rglob("*.py"))}


@pytest.fixture(scope="module")
def copy20(tmp_path_factory):
    return copy_tree(released("0.5.20"), tmp_path_factory.mktemp("c") / "sglang-0.5.20")


@pytest.fixture
def mini23(tmp_path):
    return mini_tree(tmp_path / "t", "0.5.23", copy_from=released("0.5.23"), copy_files=TOUCHED)


def _clamp_verdicts(tree):
    return {r.path: r.verdict.value for r in audit_tree(tree, ["nvfp4-w4a4-cutlass", "nvfp4-w4a4-trtllm"])}


@pytest.mark.parametrize("mode,cutlass,trtllm", [("exact", "EXACT", "UNUSABLE"), ("none", "DROPPED", "UNUSABLE")])
def test_roundtrip_023(copy23_shared, tmp_path, mode, cutlass, trtllm):
    before = _hashes(copy23_shared)
    written = sp.apply(copy23_shared, mode)
    assert written and sp.apply(copy23_shared, mode) == []  # idempotent
    assert sp.verify(copy23_shared, mode)["ok"] and sp.status(copy23_shared)["clamp_mode"] == mode
    for w in written:
        py_compile.compile(w, cfile=str(tmp_path / "check.pyc"), doraise=True)
    assert _clamp_verdicts(copy23_shared) == {"nvfp4-w4a4-cutlass": cutlass, "nvfp4-w4a4-trtllm": trtllm}
    assert sp.revert(copy23_shared, mode)
    assert _hashes(copy23_shared) == before
    assert _clamp_verdicts(copy23_shared) == {"nvfp4-w4a4-cutlass": "APPROX", "nvfp4-w4a4-trtllm": "UNUSABLE"}


# Per release with BailingMoeV3: the audit's verdicts (NVFP4 CUTLASS, NVFP4 TRT-LLM) on the released
# tree and after each clamp mode. Stock: <= 0.5.20 sends no clamp to either call
# (compressed_tensors_w4a4_nvfp4_moe.py builds FlashInferCutlassMoeQuantInfo without swiglu_limit and
# passes gemm1_clamp_limit=None to TRT-LLM); 0.5.21+ carry the card's edits (the CUTLASS call gets
# materialize_swiglu_params_for_cutlass's tensors with ActivationType.Swiglu, which FlashInfer runs
# as the pre-SiLU SwigluBias: APPROX). "card" exists only where the release lacks the card's edits.
RELEASE_VERDICTS = {
    "0.5.19": {"stock": ("DROPPED", "UNUSABLE"), "exact": ("EXACT", "UNUSABLE"),
               "none": ("DROPPED", "UNUSABLE"), "card": ("APPROX", "UNUSABLE")},
    "0.5.20": {"stock": ("DROPPED", "UNUSABLE"), "exact": ("EXACT", "UNUSABLE"),
               "none": ("DROPPED", "UNUSABLE"), "card": ("APPROX", "UNUSABLE")},
    "0.5.21": {"stock": ("APPROX", "UNUSABLE"), "exact": ("EXACT", "UNUSABLE"),
               "none": ("DROPPED", "UNUSABLE")},
    "0.5.22": {"stock": ("APPROX", "UNUSABLE"), "exact": ("EXACT", "UNUSABLE"),
               "none": ("DROPPED", "UNUSABLE")},
    "0.5.23": {"stock": ("APPROX", "UNUSABLE"), "exact": ("EXACT", "UNUSABLE"),
               "none": ("DROPPED", "UNUSABLE")},
}


def _all_bytes(tree) -> dict[str, str]:
    """sha256 of every file of the package (not only .py), keyed by path relative to the root."""
    return {str(p.relative_to(tree.root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(tree.package.rglob("*")) if p.is_file()}


@functools.cache
def _release_bytes(version: str) -> dict[str, str]:
    """:func:`_all_bytes` of the released tree, less what ``copy_tree`` leaves out: read once per
    release (each of its modes' round trips compares against it; the released trees are never written)."""
    return {k: h for k, h in _all_bytes(released(version)).items() if k.split("/")[1] not in COPY_SKIP_DIRS}


def _as_paths(pair: tuple[str, str]) -> dict[str, str]:
    cutlass, trtllm = pair
    return {"nvfp4-w4a4-cutlass": cutlass, "nvfp4-w4a4-trtllm": trtllm}


@pytest.fixture(scope="module")
def release_copy(tmp_path_factory):
    """One copy per release, shared by that release's modes (each test reverts what it applied)."""
    made = {}

    def get(version):
        if version not in made:
            made[version] = copy_tree(released(version), tmp_path_factory.mktemp("r") / f"sglang-{version}")
        return made[version]
    return get


@pytest.mark.parametrize("version", sorted(RELEASE_VERDICTS))
def test_release_modes_available(version):
    want = [m for m in RELEASE_VERDICTS[version] if m != "stock"]
    native = ["native-clamp-exact", "native-clamp-approx", "native-routed-scaling"] if version == "0.5.23" else []
    assert sp.modes_for(version) == ["stock"] + want + ["det"] + native
    assert _clamp_verdicts(released(version)) == _as_paths(RELEASE_VERDICTS[version]["stock"])


@pytest.mark.parametrize("version,mode", [(v, m) for v in sorted(RELEASE_VERDICTS)
                                          for m in (*RELEASE_VERDICTS[v], "det") if m != "stock"])
def test_release_roundtrip(release_copy, tmp_path, version, mode):
    tree = release_copy(version)
    release = _release_bytes(version)  # what copy_tree copies
    assert _all_bytes(tree) == release
    written = sp.apply(tree, mode)
    assert written and sp.apply(tree, mode) == []  # idempotent
    assert sp.verify(tree, mode)["ok"]
    for w in written:
        py_compile.compile(w, cfile=str(tmp_path / "check.pyc"), doraise=True)
    nvfp4 = tree.file(NVFP4).read_text()
    if mode == "det":
        bio = tree.file(BIO).read_text()
        assert "MIN_DEEPGEMM_DIM = 64" in bio and "MIN_DEEPGEMM_DIM = 16" not in bio
        want = RELEASE_VERDICTS[version]["stock"]  # det leaves the clamp alone
    else:
        assert sp.status(tree)["clamp_mode"] == mode
        want = RELEASE_VERDICTS[version][mode]
        assert f"[swiglu-clamp-patch] cutlass nvfp4 limit=%s mode={mode}" in nvfp4 or \
            f"[swiglu-clamp-patch] cutlass nvfp4 limit=None mode={mode}" in nvfp4
        if mode in ("exact", "card"):
            assert "gemm1_clamp_limit=None" not in nvfp4
            assert f"[swiglu-clamp-patch] trtllm nvfp4 limit=%s mode={mode} form=pre-silu" in nvfp4
        if mode == "exact":
            assert "ActivationType.SwigluStep" in tree.file(CUTLASS).read_text()
    assert _clamp_verdicts(tree) == _as_paths(want)
    assert sp.revert(tree, mode)
    assert _all_bytes(tree) == release  # every byte of the release is back


def test_exact_patch_logs_once_per_layer(copy23_shared):
    sp.apply(copy23_shared, "exact")
    text = copy23_shared.file(NVFP4).read_text()
    sp.revert(copy23_shared)
    assert '"[swiglu-clamp-patch] cutlass nvfp4 limit=%s mode=exact form=%s layer=%s"' in text
    assert "gemm1_clamp_limit=None" not in text


@pytest.mark.parametrize("mode,cutlass", [("card", "APPROX"), ("exact", "EXACT"), ("none", "DROPPED")])
def test_card_version_modes(copy20, mode, cutlass):
    before = _hashes(copy20)
    sp.apply(copy20, mode)
    assert _clamp_verdicts(copy20)["nvfp4-w4a4-cutlass"] == cutlass
    sp.revert(copy20)
    assert _hashes(copy20) == before


def test_det_edit(mini23):
    before = _hashes(mini23)
    sp.apply(mini23, "det")
    assert "MIN_DEEPGEMM_DIM = 64" in mini23.file(BIO).read_text()
    assert sp.status(mini23) | {"files": None} == {"sglang_version": "0.5.23", "clamp_mode": "stock",
                                                    "det": True,
                                                    "native": {"moe_clamp": "released", "routed_scaling": "released"},
                                                    "files": None}
    sp.apply(mini23, "exact")  # combinable with a clamp mode
    assert sp.status(mini23)["clamp_mode"] == "exact" and sp.status(mini23)["det"]
    sp.revert(mini23, "det")
    sp.revert(mini23)
    assert _hashes(mini23) == before


def test_not_an_sglang_tree(tmp_path):
    (tmp_path / "x.py").write_text("")
    with pytest.raises(NotAnSGLangTree):
        sp.main(["apply", "--mode", "exact", "--sglang", str(tmp_path)])


def test_unknown_version(tmp_path):
    t = mini_tree(tmp_path / "t", "0.5.99", copy_from=released("0.5.23"), copy_files=TOUCHED)
    before = _hashes(t)
    with pytest.raises(UnknownPatchVersion, match="0.5.19, 0.5.20, 0.5.21, 0.5.22, 0.5.23"):
        sp.apply(t, "exact")
    assert _hashes(t) == before


def test_unknown_mode(mini23):
    with pytest.raises(UnknownPatchMode):
        sp.apply(mini23, "fast")
    with pytest.raises(UnknownPatchMode):
        sp.apply(mini23, "card")  # 0.5.21+ contain the card's edits: no card mode


def test_modified_file_refused_and_nothing_written(mini23):
    f = mini23.file(NVFP4)
    f.write_text(f.read_text() + "# local edit\n")
    before = _hashes(mini23)
    with pytest.raises(PatchConflict, match="matches neither"):
        sp.apply(mini23, "exact")  # flashinfer_cutlass.py comes first and must stay untouched
    assert _hashes(mini23) == before


def test_other_mode_applied_refused(mini23):
    sp.apply(mini23, "none")
    before = _hashes(mini23)
    with pytest.raises(PatchConflict, match="revert it first"):
        sp.apply(mini23, "exact")
    assert _hashes(mini23) == before


@pytest.mark.parametrize("target", ["file", "folder"])
def test_read_only_target(mini23, target):
    f = mini23.file(NVFP4)
    ro = f if target == "file" else f.parent
    mode = ro.stat().st_mode
    ro.chmod(0o444 if target == "file" else 0o555)
    before = _hashes(mini23)
    try:
        with pytest.raises(PatchTargetReadOnly):
            sp.apply(mini23, "exact")
        assert _hashes(mini23) == before
    finally:
        ro.chmod(mode)


def test_failed_write_rolls_back(mini23, monkeypatch):
    before = _hashes(mini23)
    real = os.replace
    calls = []

    def flaky(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real(src, dst)

    monkeypatch.setattr(os, "replace", flaky)
    with pytest.raises(PatchTargetReadOnly, match="earlier files restored"):
        sp.apply(mini23, "exact")
    monkeypatch.setattr(os, "replace", real)
    assert _hashes(mini23) == before
    assert not list(Path(mini23.root).rglob("*.tmp"))


def test_unified_diff_reverse_is_exact():
    text = "a\nb\nc\n"
    diff = "--- a/x\n+++ b/x\n@@ -1,3 +1,3 @@\n a\n-b\n+B\n c\n"
    assert sp.apply_unified_diff(text, diff) == "a\nB\nc\n"
    assert sp.apply_unified_diff("a\nB\nc\n", diff, reverse=True) == text
    with pytest.raises(PatchConflict):
        sp.apply_unified_diff("a\nx\nc\n", diff)


def test_switch_mode_and_state_file(mini23, tmp_path):
    state = tmp_path / "state.json"
    st = sp.switch_mode(mini23.root, "exact", det=True, state_file=state)
    assert (st["clamp_mode"], st["det"]) == ("exact", True)
    assert json.loads(state.read_text())["clamp_mode"] == "exact"
    st = sp.switch_mode(mini23, "none", state_file=state)  # reverts exact first, det untouched
    assert (st["clamp_mode"], st["det"]) == ("none", True)
    sp.switch_mode(mini23, "stock", det=False, state_file=state)
    assert sp.load_state(state)["clamp_mode"] == "stock"
    assert sp.status(mini23)["files"] == {CUTLASS: "original", NVFP4: "original", BIO: "original", NATIVE: "original", UNQUANT: "original"}


def test_serving_mode_restores_on_error(mini23, tmp_path):
    before = _hashes(mini23)
    with pytest.raises(RuntimeError, match="server died"):
        with sp.serving_mode(mini23, "exact", det=True, state_file=tmp_path / "s.json") as st:
            assert st["clamp_mode"] == "exact"
            raise RuntimeError("server died")
    assert _hashes(mini23) == before
    assert sp.load_state(tmp_path / "s.json")["clamp_mode"] == "stock"


def test_install_from_state(mini23, tmp_path):
    state = tmp_path / "s.json"
    state.write_text(json.dumps({"install": str(mini23.root), "needed_modes": ["none", "exact"]}))
    with sp.serving_mode(sp.install_from_state(state), "none", state_file=state):
        assert sp.load_state(state)["clamp_mode"] == "none"
    st = sp.load_state(state)
    assert (st["clamp_mode"], st["needed_modes"]) == ("stock", ["none", "exact"])
    state.write_text(json.dumps({"install": None}))
    with pytest.raises(PatchStateError):
        sp.install_from_state(state)


def test_check_can_apply_is_a_dry_run(mini23):
    before = _hashes(mini23)
    sp.check_can_apply(mini23, "exact")
    assert _hashes(mini23) == before


def test_cli(mini23, capsys):
    root = str(mini23.root)
    assert sp.main(["verify", "--mode", "exact", "--sglang", root]) == 1
    assert sp.main(["apply", "--mode", "exact", "--sglang", root]) == 0
    assert sp.main(["verify", "--mode", "exact", "--sglang", root]) == 0
    assert sp.main(["revert", "--sglang", root]) == 0
    assert sp.main(["status", "--sglang", root]) == 0
    assert '"clamp_mode": "stock"' in capsys.readouterr().out
    assert open_tree(root).version == "0.5.23"


# --- a kill at any instant (issue 14, item 5) -------------------------------------------
KILL_CMD = "import sys; from nvfp4study.sglang.patch import main; sys.exit(main(sys.argv[1:]))"
REPO_LIB = str(Path(__file__).resolve().parents[1] / "lib")


def _run_patch(args: list[str], kill_at: int | None = None):
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": REPO_LIB}
    env.pop(sp.patch_journal.KILL_ENV, None)
    if kill_at is not None:
        env[sp.patch_journal.KILL_ENV] = str(kill_at)
    return subprocess.run([sys.executable, "-c", KILL_CMD, *args], env=env, capture_output=True,
                          text=True, timeout=120)


def _package_files(tree) -> set[str]:
    return {str(p.relative_to(tree.root)) for p in Path(tree.root).rglob("*") if p.is_file()}


@pytest.mark.parametrize("start,args,ends", [
    ("stock", ["apply", "--mode", "exact"], {"stock", "exact"}),
    ("exact", ["revert"], {"exact", "stock"}),
    ("none", ["switch", "--mode", "exact"], {"none", "stock", "exact"}),
    ("stock", ["apply", "--mode", "det"], {"stock"}),
    ("stock", ["apply", "--mode", "native-clamp-exact"], {"stock"}),
])
def test_kill_at_every_write_and_rename(mini23, start, args, ends):
    """SIGKILL the patcher just before each of its writes, renames and removals in turn: the next
    ``status`` finishes the command, the tree is wholly in a known mode (byte-exact), no temporary
    file is left in the package or the tree, and ``revert`` restores the released bytes."""
    root = str(mini23.root)
    pristine = {rel: mini23.file(rel).read_bytes() for rel in TOUCHED}
    files0 = _package_files(mini23)
    n = 0
    while True:
        n += 1
        assert n < 100, "the patcher never finished"
        for rel, data in pristine.items():
            mini23.file(rel).write_bytes(data)
        if start != "stock":
            sp.apply(mini23, start)
        start_bytes = {rel: mini23.file(rel).read_bytes() for rel in TOUCHED}
        r = _run_patch([*args, "--sglang", root], kill_at=n)
        if r.returncode == 0:  # n is past the last step: the command ran to the end
            assert n > 3
            break
        assert r.returncode == -9, (n, r.stderr)
        assert not [f for f in _package_files(mini23) - files0 if not f.startswith(".nvfp4study-patch/")]
        st = _run_patch(["status", "--sglang", root])
        assert st.returncode == 0, st.stderr
        state = json.loads(st.stdout)
        assert state["clamp_mode"] in ends, (n, state)
        assert all(not s.startswith("modified") for s in state["files"].values()), (n, state)
        if args[-1] == "det":
            changed = {rel for rel in TOUCHED if mini23.file(rel).read_bytes() != start_bytes[rel]}
            assert changed <= {BIO} and state["det"] == bool(changed)
        if args[-1].startswith("native-"):
            changed = {rel for rel in TOUCHED if mini23.file(rel).read_bytes() != start_bytes[rel]}
            assert changed <= {NATIVE} and state["native"]["moe_clamp"] == ("exact" if changed else "released")
        assert _package_files(mini23) == files0, n  # journal folder and temp files gone
        assert not sp.patch_journal.pending(mini23.root)
        sp.revert(mini23, args[-1]) if args[-1] == "det" or args[-1].startswith("native-") else sp.revert(mini23)
        assert {rel: mini23.file(rel).read_bytes() for rel in TOUCHED} == pristine, n


def test_every_command_finishes_a_pending_journal(mini23):
    """Killed right after the journal is written (before any rename): apply, revert, verify and
    switch each finish it first, then do their own job."""
    root = str(mini23.root)
    for follow in (["apply", "--mode", "exact"], ["revert"], ["verify", "--mode", "exact"],
                   ["switch", "--mode", "none"]):
        sp.revert(mini23)
        # steps of `apply exact` (2 files): mkdir, 2 x (new, old), journal tmp, journal rename,
        # then step 8 is the first target's rename
        r = _run_patch(["apply", "--mode", "exact", "--sglang", root], kill_at=8)
        assert r.returncode == -9 and sp.patch_journal.pending(mini23.root)
        assert sp.file_states(mini23)[CUTLASS].state == "original"  # nothing renamed yet
        r = _run_patch([*follow, "--sglang", root])
        assert "finished an interrupted patch command" in r.stderr, r.stderr
        assert not sp.patch_journal.pending(mini23.root)
        want = {"apply": "exact", "revert": "stock", "verify": "exact", "switch": "none"}[follow[0]]
        assert sp.status(mini23)["clamp_mode"] == want, follow
    sp.revert(mini23)


def test_pending_journal_with_tampered_target_refused(mini23):
    root = str(mini23.root)
    r = _run_patch(["apply", "--mode", "exact", "--sglang", root], kill_at=9)  # after 1st rename
    assert r.returncode == -9
    f = mini23.file(NVFP4)
    f.write_text(f.read_text() + "# edited meanwhile\n")
    with pytest.raises(PatchStateError, match="neither in the state before nor after"):
        sp.status(mini23)
    assert sp.patch_journal.pending(mini23.root)  # kept for inspection


def test_mixed_tree_status_tells_each_file(mini23):
    """One clamp file patched, the other original (e.g. edited by hand): status says ``mixed``
    with each file's state, apply refuses naming them, revert restores the released bytes."""
    before = _hashes(mini23)
    sp.apply(mini23, "exact")
    patched = mini23.file(CUTLASS).read_bytes()
    sp.revert(mini23)
    mini23.file(CUTLASS).write_bytes(patched)
    st = sp.status(mini23)
    assert st["clamp_mode"] == "mixed"
    assert st["files"] == {CUTLASS: "patched:exact", NVFP4: "original", BIO: "original", NATIVE: "original", UNQUANT: "original"}
    with pytest.raises(PatchConflict, match=r"mixed tree .*flashinfer_cutlass.py: patched:exact"):
        sp.apply(mini23, "exact")
    with pytest.raises(PatchConflict, match="no single known mode"):
        sp.switch_mode(mini23, "none")
    assert sp.revert(mini23) == [str(mini23.file(CUTLASS))]
    assert _hashes(mini23) == before


def test_det_refuses_a_locally_edited_file(mini23):
    """The released code refuses to patch over a locally edited ``batch_invariant_ops.py``; so
    must ``det`` (the sha256 check of the original, not only of the result)."""
    f = mini23.file(BIO)
    f.write_text(f.read_text() + "\n# local tuning\nMY_SETTING = 1\n")
    edited = f.read_bytes()
    with pytest.raises(PatchConflict, match="matches neither the released original"):
        sp.apply(mini23, "det")
    assert f.read_bytes() == edited
    with pytest.raises(PatchConflict):
        sp.switch_mode(mini23, "stock", det=True)
    assert f.read_bytes() == edited


def test_copy_tree_leaves_out_what_no_copy_reads(tmp_path):
    """The copy keeps srt/ and kernels/ (a nested ``test`` folder too) and the dist-info; it
    leaves out the top-level multimodal_gen/, test/ and benchmark/, caches and compiled files."""
    from nvfp4study.sglang.source import SGLangTree

    src = tmp_path / "src"
    files = ["sglang/__init__.py", "sglang/srt/a.py", "sglang/srt/test/t.py", "sglang/kernels/k.py",
             "sglang/multimodal_gen/m.py", "sglang/test/u.py", "sglang/benchmark/b.py",
             "sglang/srt/__pycache__/a.cpython-311.pyc", "sglang/srt/ext.so",
             "sglang-0.5.23.dist-info/METADATA"]
    for f in files:
        (src / f).parent.mkdir(parents=True, exist_ok=True)
        (src / f).write_text("x = 1\n")
    out = copy_tree(SGLangTree(root=src, version="0.5.23", origin="path"), tmp_path / "dst")
    got = sorted(str(p.relative_to(out.root)) for p in out.root.rglob("*") if p.is_file())
    assert got == ["sglang-0.5.23.dist-info/METADATA", "sglang/__init__.py", "sglang/kernels/k.py",
                   "sglang/srt/a.py", "sglang/srt/test/t.py"]
    assert sorted(str(p.relative_to(src)) for p in src.rglob("*") if p.is_file()) == sorted(files)

"""The card's own patch files replayed as published (``patch -p1`` in ``sglang/srt``) on released
SGLang trees, fetched from a fixture Hub repo or a folder.

Fixtures are made from our reconstruction (``patches/0.5.20/card``), rewritten to the card's
layout (paths relative to ``sglang/srt``, as its ``cd .../sglang/srt; patch -p1`` needs): the good
pair (applies to 0.5.20, not to 0.5.23, whose flashinfer_cutlass.py moved on), a pair whose first
hunk's context was edited (applies nowhere), and a file that is not a unified diff.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

import pytest

from hub_server import HubServer, Repo
from nvfp4study.core.errors import CardPatchNotUnifiedDiff
from nvfp4study.core.params import HubSource
from nvfp4study.sglang import card_patches as cpt
from nvfp4study.sglang.source import unpack_wheel

CARD = "study-fixture/card-repo"
SHA = "e" * 40
RECON = resources.files("nvfp4study.sglang").joinpath("patches", "0.5.20", "card")


def card_layout(text: str) -> str:
    """Our reconstruction's headers (``a/sglang/srt/...``) as the card's (``a/...`` from srt)."""
    return re.sub(r"^(---|\+\+\+) ([ab])/sglang/srt/", r"\1 \2/", text, flags=re.M)


def write_patches(folder: Path, *, break_context: bool = False, junk: bool = False) -> Path:
    d = folder / "sglang_patch"
    d.mkdir(parents=True)
    for f in sorted(RECON.iterdir(), key=lambda p: p.name):
        text = card_layout(f.read_text())
        if break_context and f.name.startswith("01"):
            text = text.replace("     moe_ep_rank: int = 0\n", "     moe_ep_rank: int = 9\n", 1)  # inner context: no fuzz helps
        (d / f.name).write_text(text)
    if junk:
        (d / "03-notes.patch").write_text("Bind-mount the two patched files over the image.\n")
    (folder / "README.md").write_text("# fixture card repo\n")
    (folder / "big.safetensors").write_bytes(b"\0" * 4096)  # must never be downloaded
    return folder


def test_the_card_files_from_the_hub_apply_to_0520_and_not_0523(tmp_path, monkeypatch):
    repo = write_patches(tmp_path / "repo")
    rel = "sglang/srt/layers/moe/moe_runner/flashinfer_cutlass.py"
    cached = (unpack_wheel("0.5.20").root / rel).read_bytes()
    with HubServer([Repo(CARD, repo, SHA)]) as srv:
        monkeypatch.setenv("HF_ENDPOINT", srv.url)
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        data = cpt.run(HubSource(repo_id=CARD), None, ["0.5.20", "0.5.23"], tmp_path / "work")
        assert not any("big.safetensors" in p or "README" in p for _, p, _ in srv.log if "/resolve/" in p)
    assert data["run"], data
    assert data["origin"]["commit"] == SHA and data["origin"]["files"] == sorted(p.name for p in RECON.iterdir())
    sm = data["summary"]
    assert sm["applies_to"] == ["0.5.20"] and set(sm["fails_on"]) == {"0.5.23"}
    assert "01-flashinfer_cutlass.patch" in sm["fails_on"]["0.5.23"] and "hunk #1 at 58" in sm["fails_on"]["0.5.23"]
    # independently: hunk 1's old lines are not a contiguous block of 0.5.23's file (and are of 0.5.20's)
    hunk = card_layout((RECON / "01-flashinfer_cutlass.patch").read_text()).split("@@")[2]
    old = [ln[1:] for ln in hunk.splitlines()[1:] if ln[:1] in (" ", "-")]
    for v, present in (("0.5.20", True), ("0.5.23", False)):
        src = (unpack_wheel(v).root / rel).read_text().splitlines()
        found = any(src[i:i + len(old)] == old for i in range(len(src)))
        assert found is present, v
    # after the card's files, 0.5.20's CUTLASS path: the same verdict as our reconstruction applied
    # by the project's own (non-GNU) diff applier on another copy
    from nvfp4study.sglang import patch as sp
    from nvfp4study.sglang.audit import audit_tree
    from nvfp4study.sglang.source import copy_tree

    copy = copy_tree(unpack_wheel("0.5.20"), tmp_path / "ours")
    sp.apply(copy, "card")
    ours = {r.path: r.verdict.value for r in audit_tree(copy, cpt.AUDITED_PATHS)}
    assert sm["cutlass"] == {"0.5.20": ours["nvfp4-w4a4-cutlass"]}
    r20 = data["results"][0]
    assert r20["py_compile_ok"] == sorted(cpt.check_unified_diff("x", card_layout(f.read_text()))[0][2:]
                                         for f in RECON.iterdir())
    assert not list((tmp_path / "work").iterdir())  # the copies are gone
    assert (unpack_wheel("0.5.20").root / rel).read_bytes() == cached  # the cache was never patched


def test_a_hunk_that_does_not_apply_is_a_finding(tmp_path):
    folder = write_patches(tmp_path / "local", break_context=True)
    data = cpt.run(None, str(folder), ["0.5.20"], tmp_path / "work")
    assert data["run"] and data["summary"]["applies_to"] == []
    r = data["results"][0]
    assert [p["applies"] for p in r["patches"]] == [False]  # stopped at the first, as a shell `&&` would
    assert r["patches"][0]["failed_hunks"] == {"layers/moe/moe_runner/flashinfer_cutlass.py": [{"hunk": 1, "line": 58}]}
    assert cpt.table(data)[0]["failed hunks"] == "layers/moe/moe_runner/flashinfer_cutlass.py #1 at 58"


def test_a_file_that_is_not_a_diff_is_named(tmp_path):
    folder = write_patches(tmp_path / "local", junk=True)
    with pytest.raises(CardPatchNotUnifiedDiff, match="03-notes.patch is not a unified diff"):
        cpt.replay(sorted((folder / "sglang_patch").glob("*.patch")), unpack_wheel("0.5.20"), tmp_path / "w")
    data = cpt.run(None, str(folder), ["0.5.20"], tmp_path / "work")
    assert not data["run"] and data["reason"].startswith("CardPatchNotUnifiedDiff")


def test_nothing_named_is_not_run_without_network(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    data = cpt.run(None, None, ["0.5.20"], tmp_path)
    assert not data["run"] and "params/card-files.yaml" in data["reason"]
    assert cpt.table(data)[0]["note"].startswith("not run: no Hub access")

"""sglang.patch_journal: the crash-safe writes of ``nvfp4study patch``, on a small tree in tmp_path.

The pending journals here are built by hand from the format in the module's docstring (files
``<i>.new`` / ``<i>.old`` and ``journal.json`` with each target's path and the sha256 of its bytes
before and after), so :func:`recover` is checked against the format, not against
:func:`write_all`'s own output.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from nvfp4study.core.errors import PatchStateError, PatchTargetReadOnly
from nvfp4study.sglang import patch_journal as pj

OLD = {"pkg/a.py": b"a = 1\n", "pkg/b.py": b"b = 2\n"}
NEW = {"pkg/a.py": b"a = 1  # patched\n", "pkg/b.py": b"b = 3  # patched\n"}


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _tree(tmp_path: Path, state: dict[str, bytes]) -> Path:
    root = tmp_path / "site"
    (root / "pkg").mkdir(parents=True)
    for rel, data in state.items():
        (root / rel).write_bytes(data)
    return root


def _pending(tmp_path: Path, renamed: int = 1) -> Path:
    """A tree killed after its first ``renamed`` target renames: journal written, the other
    targets still in their before state with their ``.new`` files waiting."""
    names = list(OLD)
    root = _tree(tmp_path, {r: (NEW if i < renamed else OLD)[r] for i, r in enumerate(names)})
    jdir = root / ".nvfp4study-patch"
    jdir.mkdir()
    entries = []
    for i, rel in enumerate(names):
        if i >= renamed:
            (jdir / f"{i}.new").write_bytes(NEW[rel])
        (jdir / f"{i}.old").write_bytes(OLD[rel])
        entries.append({"path": rel, "new": f"{i}.new", "old": f"{i}.old",
                        "sha256_before": _sha(OLD[rel]), "sha256_after": _sha(NEW[rel])})
    (jdir / "journal.json").write_text(json.dumps({"files": entries}))
    return root


def _state(root: Path) -> dict[str, bytes]:
    return {rel: (root / rel).read_bytes() for rel in OLD}


def test_nothing_pending(tmp_path):
    root = _tree(tmp_path, OLD)
    assert not pj.pending(root) and pj.recover(root) == []
    assert _state(root) == OLD


def test_recover_finishes_an_interrupted_command(tmp_path):
    root = _pending(tmp_path, renamed=1)
    assert pj.pending(root)
    assert pj.recover(root) == ["finished an interrupted patch command: 2 file(s) in the after state, "
                                "renamed now: pkg/b.py"]
    assert _state(root) == NEW
    assert not pj.pending(root) and sorted(p.name for p in root.iterdir()) == ["pkg"]


def test_recover_after_every_rename_renames_nothing(tmp_path):
    root = _pending(tmp_path, renamed=2)
    assert pj.recover(root) == ["finished an interrupted patch command: 2 file(s) in the after state"]
    assert _state(root) == NEW and not pj.pending(root)


@pytest.mark.parametrize("damage", ["tampered", "truncated", "missing"])
def test_pending_new_file_damaged_refused(tmp_path, damage):
    """A pending ``.new`` whose bytes are not the journal's ``sha256_after`` is never renamed over
    the target: PatchStateError, the target keeps its bytes, the journal is kept."""
    root = _pending(tmp_path, renamed=1)
    new = root / ".nvfp4study-patch" / "1.new"
    if damage == "tampered":
        new.write_bytes(NEW["pkg/b.py"].replace(b"3", b"4"))
    elif damage == "truncated":
        new.write_bytes(NEW["pkg/b.py"][:5])
    else:
        new.unlink()
    kept = new.read_bytes() if new.exists() else None
    with pytest.raises(PatchStateError, match=r"pkg/b.py \(sha256 [0-9a-f]{12}\) is neither in the state before"):
        pj.recover(root)
    assert (root / "pkg/b.py").read_bytes() == OLD["pkg/b.py"]
    assert (root / "pkg/a.py").read_bytes() == NEW["pkg/a.py"]
    assert pj.pending(root) and (root / ".nvfp4study-patch" / "journal.json").is_file()
    assert (new.read_bytes() if new.exists() else None) == kept


@pytest.mark.parametrize("target", ["pkg/a.py", "pkg/b.py"])
def test_pending_target_edited_refused(tmp_path, target):
    root = _pending(tmp_path, renamed=1)
    (root / target).write_bytes(b"# edited meanwhile\n")
    with pytest.raises(PatchStateError, match=f"{target} .*nothing changed, journal kept"):
        pj.recover(root)
    assert pj.pending(root)


def test_pending_target_deleted_refused(tmp_path):
    root = _pending(tmp_path, renamed=1)
    (root / "pkg/b.py").unlink()
    with pytest.raises(PatchStateError, match=r"pkg/b.py \(sha256 None\)"):
        pj.recover(root)
    assert pj.pending(root) and (root / ".nvfp4study-patch" / "1.new").read_bytes() == NEW["pkg/b.py"]


def test_leftovers_without_journal_removed(tmp_path):
    root = _tree(tmp_path, OLD)
    jdir = root / ".nvfp4study-patch"
    jdir.mkdir()
    (jdir / "0.new").write_bytes(NEW["pkg/a.py"])
    assert pj.recover(root) == [f"removed the temporary files of an interrupted patch command ({jdir})"]
    assert not jdir.exists() and _state(root) == OLD


@pytest.mark.parametrize("text", ["{not json", '{"entries": []}', "[1, 2]"])
def test_unreadable_journal_kept(tmp_path, text):
    root = _pending(tmp_path, renamed=1)
    (root / ".nvfp4study-patch" / "journal.json").write_text(text)
    with pytest.raises(PatchStateError, match="unreadable patch journal"):
        pj.recover(root)
    assert pj.pending(root) and (root / "pkg/b.py").read_bytes() == OLD["pkg/b.py"]


def test_write_all_writes_every_target_keeps_modes(tmp_path):
    root = _tree(tmp_path, OLD)
    os.chmod(root / "pkg/a.py", 0o640)
    os.chmod(root / "pkg/b.py", 0o755)
    pj.write_all(root, {root / r: NEW[r] for r in OLD}, {root / r: OLD[r] for r in OLD})
    assert _state(root) == NEW and not pj.pending(root)
    assert (os.stat(root / "pkg/a.py").st_mode & 0o7777, os.stat(root / "pkg/b.py").st_mode & 0o7777) == (0o640, 0o755)


def test_write_all_refuses_while_a_journal_is_pending(tmp_path):
    root = _pending(tmp_path, renamed=1)
    before = _state(root)
    with pytest.raises(PatchStateError, match="interrupted patch command is pending; run `nvfp4study patch "
                                              "status` to finish it"):
        pj.write_all(root, {root / r: b"x\n" for r in OLD}, {root / r: before[r] for r in OLD})
    assert _state(root) == before and (root / ".nvfp4study-patch" / "1.new").read_bytes() == NEW["pkg/b.py"]


def test_write_all_failure_rolls_back(tmp_path, monkeypatch):
    """A rename of the second target fails after the first was renamed: both targets are back to
    their old bytes, the journal folder is gone, and the error is PatchTargetReadOnly."""
    root = _tree(tmp_path, OLD)
    real = os.replace

    def replace(src, dst):
        if Path(dst) == root / "pkg/b.py":
            raise PermissionError(13, "read-only", str(dst))
        return real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(PatchTargetReadOnly, match=r"writing .*pkg/b.py failed .*earlier files restored"):
        pj.write_all(root, {root / r: NEW[r] for r in OLD}, {root / r: OLD[r] for r in OLD})
    assert _state(root) == OLD and not pj.pending(root)


KILL_SCRIPT = """
import sys
from pathlib import Path
from nvfp4study.sglang import patch_journal as pj
root = Path(sys.argv[1])
new = {root / "pkg/a.py": b"a = 1  # patched\\n", root / "pkg/b.py": b"b = 3  # patched\\n"}
pj.write_all(root, new, {p: p.read_bytes() for p in new})
"""


def test_killed_at_every_step_recovers_wholly_before_or_after(tmp_path):
    """``NVFP4STUDY_PATCH_KILL_AT=N`` kills the writer just before its N-th step (11 for two files:
    mkdir, 2 x (new, old), journal tmp, journal rename, 2 target renames, unlink, rmtree); after
    each kill :func:`recover` leaves the tree wholly before (killed before the journal's rename)
    or wholly after (killed after it)."""
    lib = Path(pj.__file__).resolve().parents[2]  # the package this test imported, in the child too
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(lib), os.environ.get("PYTHONPATH", "")])}
    seen = []
    for n in range(1, 13):
        root = _tree(tmp_path / str(n), OLD)
        r = subprocess.run([sys.executable, "-c", KILL_SCRIPT, str(root)], env={**env, pj.KILL_ENV: str(n)},
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == (-9 if n <= 11 else 0), (n, r.stderr)
        pj.recover(root)
        assert not pj.pending(root)
        seen.append("after" if _state(root) == NEW else "before" if _state(root) == OLD else "mixed")
    assert seen == ["before"] * 7 + ["after"] * 5


def test_recover_renames_every_pending_file_and_names_them(tmp_path):
    root = _pending(tmp_path, renamed=0)
    assert pj.recover(root) == ["finished an interrupted patch command: 2 file(s) in the after state, "
                                "renamed now: pkg/a.py, pkg/b.py"]
    assert _state(root) == NEW


def test_recover_rename_failure_is_read_only_error(tmp_path, monkeypatch):
    root = _pending(tmp_path, renamed=1)

    def replace(src, dst):
        raise PermissionError(13, "read-only", str(dst))

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(PatchTargetReadOnly, match=r"finishing the interrupted patch command in .*\.nvfp4study-patch "
                                                  r"failed: .*read-only"):
        pj.recover(root)
    assert pj.pending(root)


def test_write_all_failure_before_any_target(tmp_path):
    """The journal folder cannot be made (no tree there): PatchTargetReadOnly naming no target, and
    the roll-back (no folder to remove) does not replace the error."""
    with pytest.raises(PatchTargetReadOnly, match="writing None failed"):
        pj.write_all(tmp_path / "absent", {}, {})


def test_write_all_rollback_skips_a_vanished_target(tmp_path, monkeypatch):
    """A target gone when the write fails is not recreated, and the error stays PatchTargetReadOnly."""
    root = _tree(tmp_path, OLD)
    real = os.replace

    def replace(src, dst):
        if Path(dst) == root / "pkg/b.py":
            (root / "pkg/b.py").unlink()
            raise PermissionError(13, "read-only", str(dst))
        return real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(PatchTargetReadOnly):
        pj.write_all(root, {root / r: NEW[r] for r in OLD}, {root / r: OLD[r] for r in OLD})
    assert (root / "pkg/a.py").read_bytes() == OLD["pkg/a.py"] and not (root / "pkg/b.py").exists()


class _Killed(BaseException):
    pass


def test_kill_hook_steps_in_order(tmp_path, monkeypatch):
    """``NVFP4STUDY_PATCH_KILL_AT=N`` sends SIGKILL to this process just before the N-th step; with
    ``os.kill`` replaced, the state of the tree at each step shows what was done before it (the
    journal and its ``.tmp`` with mode 0644 and the format of the module docstring)."""
    seen = {}
    journal = {"files": [{"path": r, "new": f"{i}.new", "old": f"{i}.old", "sha256_before": _sha(OLD[r]),
                          "sha256_after": _sha(NEW[r])} for i, r in enumerate(OLD)]}
    for n in range(1, 13):
        root = _tree(tmp_path / str(n), OLD)
        jdir = root / ".nvfp4study-patch"

        def kill(pid, sig, n=n, root=root, jdir=jdir):
            assert (pid, sig) == (os.getpid(), signal.SIGKILL)
            files = sorted(p.name for p in jdir.iterdir()) if jdir.is_dir() else None
            seen[n] = (files, [_state(root)[r] == NEW[r] for r in OLD])
            if (jdir / "journal.json").is_file():
                assert json.loads((jdir / "journal.json").read_text()) == journal
                assert os.stat(jdir / "journal.json").st_mode & 0o777 == 0o644
            raise _Killed

        monkeypatch.setattr(os, "kill", kill)
        monkeypatch.setattr(pj, "_steps", 0)
        monkeypatch.setenv(pj.KILL_ENV, str(n))
        if n == 12:
            pj.write_all(root, {root / r: NEW[r] for r in OLD}, {root / r: OLD[r] for r in OLD})
            assert _state(root) == NEW
        else:
            with pytest.raises(_Killed):
                pj.write_all(root, {root / r: NEW[r] for r in OLD}, {root / r: OLD[r] for r in OLD})
            assert _state(root) == OLD  # in-process: rolled back
        assert not pj.pending(root)
    j, t = "journal.json", "journal.json.tmp"
    assert seen == {1: (None, [False, False]), 2: ([], [False, False]), 3: (["0.new"], [False, False]),
                    4: (["0.new", "0.old"], [False, False]), 5: (["0.new", "0.old", "1.new"], [False, False]),
                    6: (["0.new", "0.old", "1.new", "1.old"], [False, False]),
                    7: (["0.new", "0.old", "1.new", "1.old", t], [False, False]),
                    8: (["0.new", "0.old", "1.new", "1.old", j], [False, False]),
                    9: (["0.old", "1.new", "1.old", j], [True, False]),
                    10: (["0.old", "1.old", j], [True, True]), 11: (["0.old", "1.old"], [True, True])}

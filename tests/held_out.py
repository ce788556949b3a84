"""Whether a blind sample is still held out: no commit since the one it was drawn at changed the audit.

Issue 36's bar is measured on a sample drawn after the audit's last change. The sample's header records
the commit it was drawn at (``population: ... at commit <sha> ...``); a later commit touching the audit's code
or data (``lib/nvfp4study/sglang``, less the hand-readings files and the agreement code that record and count
the readings) makes it a guiding sample, whatever its figure.
"""

from __future__ import annotations

import re
import subprocess

import pytest

from nvfp4study.core.params import REPO_ROOT

#: what recording and counting readings touches (not the audit)
NOT_AUDIT = ("data/hand_readings.yaml", "data/param_hand_readings.yaml", "agreement.py", "double_reading.py")


def drawn_at(sample: dict) -> str:
    """The commit a sample header's ``population`` names; AssertionError where it names none."""
    m = re.search(r"at commit ([0-9a-f]{7,40})", str(sample.get("population", "")))
    assert m, f"the sample's header names no commit it was drawn at: {sample.get('population')!r}"
    return m.group(1)


def audit_commits_since(commit: str) -> list[str]:
    """Commits after ``commit`` (to HEAD) that changed the audit; skips where the checkout has no git history."""
    spec = ["lib/nvfp4study/sglang"] + [f":(exclude)lib/nvfp4study/sglang/{p}" for p in NOT_AUDIT]
    r = subprocess.run(["git", "log", "--format=%h", f"{commit}..HEAD", "--", *spec], cwd=REPO_ROOT,
                       capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        pytest.skip(f"not run: no git history to tell whether the audit changed since {commit} ({r.stderr.strip()[:200]})")
    return r.stdout.split()

"""The served corruption study run LIVE against the fake SGLang server (tests/fake_sglang.py):
real launches (``server.serving``), real HTTP (``client.chat_completion``), the real patcher
switching a minimal "installed" SGLang 0.5.23 between clamp modes, the sandbox.

What the fake answers, by construction (``replies``; it learns the clamp mode of each launch
from the install the study's patcher switched, as its clamp log lines do):

* clamp ``exact``: every card task gets its reference solution (prompt + canonical body) in a
  fenced block: clean, and it passes.
* clamp ``none``: eight tasks get the card's kinds of junk, the other seven the reference code:

  =========================  ============================================  ==========  =======
  task                       junk                                          detector    exec
  =========================  ============================================  ==========  =======
  binary_search              ``len(arr) -  Advisory`` (undefined name)      corrupted   fails
  is_balanced                ``stack.append(c)ulp`` (glued, no parse)       corrupted   fails
  dedupe                     ``seen.add(culp)`` (undefined name)            corrupted   fails
  first_unique_char          ``counts.get(c, 0) + 1eville`` (glued number)  corrupted   fails
  rotate_left                ``culp`` on the closing fence (code intact)    corrupted   passes
  longest_common_prefix      ``prefix[:-1]oly`` (glued, no parse)           corrupted   fails
  remove_adjacent_duplicates ``stack[-1] == c Advisory:`` (no parse)         corrupted   fails
  fibonacci                  ``a + culp`` (undefined name)                  corrupted   fails
  =========================  ============================================  ==========  =======

Sampling: ``t0-off-a`` (thinking off; claim set: all 15 card tasks) and ``t06-on`` (thinking on;
claim set: the first 10). So by hand: none/t0-off-a 7/15 clean, none/t06-on 7/10 (three of the
junk tasks are in the first ten), exact 15/15 and 10/10. The probe (parser ``ling3``, thinking
off, first 2 claim tasks, streamed and not) is served with ``strand_with_parser``: every answer
lands in ``reasoning_content`` with ``content`` empty.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import psutil
import pytest

from nvfp4study.codeeval import served_data
from nvfp4study.codeeval.tasks import CARD_TASK_IDS, card_tasks
from nvfp4study.core.ledger import read_ledger
from nvfp4study.core.params import REPO_ROOT
from nvfp4study.core.stage import open_stage
from nvfp4study.sglang import patch as sglang_patch
from nvfp4study.sglang.source import open_tree
from nvfp4study.stages import s05_corruption as s5
from serving_fixtures import fake_params, fake_processes, installed_sglang, no_leftover  # noqa: F401

pytestmark = pytest.mark.usefixtures("no_leftover")

# (old, new) in prompt + canonical body: the card's kinds of junk (module docstring)
JUNK = {
    "binary_search": ("len(arr) - 1\n", "len(arr) -  Advisory\n"),
    "is_balanced": ("stack.append(c)\n", "stack.append(c)ulp\n"),
    "dedupe": ("seen.add(item)", "seen.add(culp)"),
    "first_unique_char": ("counts.get(c, 0) + 1", "counts.get(c, 0) + 1eville"),
    "longest_common_prefix": ("prefix = prefix[:-1]", "prefix = prefix[:-1]oly"),
    "remove_adjacent_duplicates": ("stack[-1] == c:", "stack[-1] == c Advisory:"),
    "fibonacci": ("a, b = b, a + b", "a, b = b, a + culp"),
}
FENCE_JUNK = "rotate_left"  # code intact, junk on the closing fence
CORRUPTED_NONE = {*JUNK, FENCE_JUNK}
EXEC_FAILS_NONE = set(JUNK)  # every in-code junk breaks the program; the fence junk does not
SAMPLING = ("corruption.sampling=[{name: t0-off-a, temperature: 0.0, max_tokens: 512}, "
            "{name: t06-on, temperature: 0.6, top_p: 0.95, top_k: 20, thinking: true, max_tokens: 512}]")
OVERRIDES = ["corruption.humaneval_count=0", SAMPLING, "corruption.reasoning_probe_tasks=2",
             "corruption.validate_detector=false", "sglang.apply_to_install=true",
             "sglang.source=installed",
             # 06 and 07 off the card's configuration, so 05's exact sweep (the card's configuration)
             # carries 05's requests alone (a launch shared with 06/07: tests/test_serving_plans.py)
             "mtp.depths=[0]", "determinism.spec_depth=1", "corruption.clamp_modes=[none, exact]"]
SERVER_KEY = "clamp={}-spec=2-det=off"  # the card's configuration per clamp mode


def fenced(code: str, tail: str = "") -> str:
    return f"Here is the function.\n\n```python\n{code}```{tail}\n"


def replies() -> list[dict]:
    rules = []
    for t in card_tasks():
        code = t.prompt + t.canonical_solution
        match = f"def {t.entry_point}("
        if t.entry_point in JUNK:
            old, new = JUNK[t.entry_point]
            assert code.count(old) == 1, t.entry_point
            rules.append({"mode": "none", "match": match, "content": fenced(code.replace(old, new))})
        elif t.entry_point == FENCE_JUNK:
            rules.append({"mode": "none", "match": match, "content": fenced(code, tail="culp")})
        rules.append({"mode": None, "match": match, "content": fenced(code)})
    return rules


def requests_seen(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.is_file() else []


def own_processes(tmp: Path, log: Path) -> list[psutil.Process]:
    """Live fake-server processes of this module's study: started with its fake config, or in
    the process group of one of its servers (their "scheduler" child). Narrower than
    ``fake_processes()``, so another session's fake servers on the machine do not count."""
    groups = {r["pid"] for r in requests_seen(log)}
    out = []
    for p in fake_processes():
        try:
            if str(tmp) in " ".join(p.cmdline()) or os.getpgid(p.pid) in groups:
                out.append(p)
        except (psutil.Error, OSError):
            continue
    return out


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("served")
    site, files = installed_sglang(tmp / "site")
    installed = {f: (site / f).read_bytes() for f in files}
    log = tmp / "fake-requests.jsonl"
    fake = {"clamp_form": "install", "sglang_origin": str(site / "sglang/__init__.py"),
            "replies": replies(), "strand_with_parser": True, "request_log": str(log),
            "step_s": 0.0, "prefill_s": 0.0, "listen_delay_s": 0.05, "starting_s": 0.1}
    _, pf, run = fake_params(tmp, *OVERRIDES, fake=fake)
    stage = open_stage("05_corruption", str(pf), str(run))
    result = s5.run_served_study(stage)
    assert not own_processes(tmp, log)  # every server's process group is gone
    assert {f: (site / f).read_bytes() for f in files} == installed  # install restored
    return {"stage": stage, "result": result, "log": log, "site": site, "pf": pf, "run": run,
            "tmp": tmp}


def test_one_server_per_clamp_mode_and_the_probe(study):
    run, seen = study["run"], requests_seen(study["log"])
    assert study["result"]["status"] == "live"
    logs = sorted(p.name for p in (run / "logs").glob("sglang-*.log"))
    # the probe is a configuration of its own (ServerConfig.reasoning_parser: tag "parser")
    assert logs == [f"sglang-{SERVER_KEY.format('exact')}-parser=ling3.log", f"sglang-{SERVER_KEY.format('exact')}.log",
                    f"sglang-{SERVER_KEY.format('none')}.log"]
    # each launch served the mode the patcher put in the install (the fake read it from there)
    assert "fake: install clamp mode none" in (run / "logs" / f"sglang-{SERVER_KEY.format('none')}.log").read_text()
    exact_log = (run / "logs" / f"sglang-{SERVER_KEY.format('exact')}.log").read_text()
    assert "fake: install clamp mode exact" in exact_log
    assert "mode=exact form=SwigluStep layer=35" in exact_log
    # requests in order: none (2 samplings x 15), exact (2 x 15), probe (2 tasks x stream on/off)
    assert len(seen) == 2 * 2 * 15 + 4 and all(r["scripted"] for r in seen)
    assert [r["mode"] for r in seen] == ["none"] * 30 + ["exact"] * 34
    assert len({r["pid"] for r in seen}) == 3
    assert [r["thinking"] for r in seen[:30]] == [False] * 15 + [True] * 15
    probe = seen[60:]
    assert all(r["reasoning_parser"] == "ling3" and not r["thinking"] for r in probe)
    assert not any(r["reasoning_parser"] for r in seen[:60])
    assert [r["stream"] for r in probe] == [True, False, True, False]
    state = sglang_patch.status(open_tree(study["site"]))
    assert state["clamp_mode"] == "stock"  # back as found after the last server stopped


def test_raw_files_one_row_per_request(study):
    stage = study["stage"]
    ids = list(CARD_TASK_IDS)
    for mode in ("none", "exact"):
        for sampling, thinking in (("t0-off-a", False), ("t06-on", True)):
            rows = served_data.read_rows(served_data.raw_path(stage.paths, mode, sampling))
            assert [r["task_id"] for r in rows] == ids
            for r in rows:
                assert (r["clamp"], r["sampling"], r["thinking"], r["status"]) == (mode, sampling, thinking, "ok")
                assert r["server"] == SERVER_KEY.format(mode) and r["stream"] is True
                assert r["finish_reason"] == "stop" and r["completion_tokens"] > 10
                assert r["request"]["chat_template_kwargs"] == {"enable_thinking": thinking}
                assert r["request"]["temperature"] == (0.6 if thinking else 0.0)
                assert r["params_digest"] == stage.params.digest() and r["reasoning_content"] is None
            by_id = {r["task_id"]: r for r in rows}
            dd = by_id["card/dedupe"]["content"]
            assert ("seen.add(culp)" in dd) == (mode == "none")  # the streamed text arrived whole
    probe = served_data.read_rows(served_data.probe_path(stage.paths, "exact", "ling3"))
    assert [(r["task_id"], r["stream"]) for r in probe] == [
        ("card/binary_search", True), ("card/binary_search", False),
        ("card/is_balanced", True), ("card/is_balanced", False)]
    assert all(r["content"] == "" and "def " in r["reasoning_content"] for r in probe)


def test_classified_counts_match_the_replies(study):
    df, s = study["result"]["classified"], study["result"]["summary"]
    assert len(df) == 60 and (df.detector != "request_failed").all()
    for r in df.itertuples():
        name = r.task_id.split("/")[1]
        bad = r.clamp == "none" and name in CORRUPTED_NONE
        assert r.detector == ("corrupted" if bad else "clean"), (r.clamp, r.sampling, name)
        fails = r.clamp == "none" and name in EXEC_FAILS_NONE
        assert r.passed == (not fails), (r.clamp, r.sampling, name, r.exec_outcome)
    cols = ["requests", "failed", "n", "clean", "corrupted", "no_code", "executed", "passed"]
    got = {(r.clamp, r.sampling, r.task_set): tuple(int(getattr(r, c)) for c in cols) for r in s.itertuples()}
    assert got == {  # by hand from the replies (module docstring)
        ("none", "t0-off-a", "claim"): (15, 0, 15, 7, 8, 0, 15, 8),
        ("none", "t0-off-a", "all"): (15, 0, 15, 7, 8, 0, 15, 8),
        ("none", "t06-on", "claim"): (10, 0, 10, 7, 3, 0, 10, 7),
        ("none", "t06-on", "all"): (15, 0, 15, 7, 8, 0, 15, 8),
        ("exact", "t0-off-a", "claim"): (15, 0, 15, 15, 0, 0, 15, 15),
        ("exact", "t0-off-a", "all"): (15, 0, 15, 15, 0, 0, 15, 15),
        ("exact", "t06-on", "claim"): (10, 0, 10, 10, 0, 0, 10, 10),
        ("exact", "t06-on", "all"): (15, 0, 15, 15, 0, 0, 15, 15),
    }
    j = study["result"]["junk"].set_index("fragment")
    # culp: dedupe, fibonacci, rotate_left's fence; one each of the rest; x2 samplings; none only
    assert j.total.to_dict() == {"culp": 6, "Advisory": 2, "eville": 2, "oly": 2, "ulp": 2}
    assert (j["exact"] == 0).all()
    back = pd.read_parquet(study["result"]["files"]["classified"])
    assert len(back) == 60


def test_ledger_rows_measured(study):
    rows = {r["id"]: r for r in read_ledger(study["run"])}
    r = rows["corruption.t0-off-15"]
    # Wilson, z^2 = 3.841459: 7/15 -> center (0.466667 + 0.128049) / 1.256097 = 0.473464,
    # half 1.959964 * sqrt(0.016593 + 0.004268) / 1.256097 = 0.225368 -> [0.2481, 0.6988];
    # 15/15 -> 0.898058 -/+ 0.101940 -> [0.7961, 1]. 0.6988 < 0.7961: resolved.
    assert r["measured"]["clean_before"] == 7 and r["measured"]["clean_after"] == 15
    assert r["measured"]["before"]["ci95"] == [0.2481, 0.6988]
    assert r["measured"]["after"]["ci95"] == [0.7961, 1.0]
    assert r["verdict"] == "reproduced"
    r = rows["corruption.t06-on"]
    # 7/10 -> center (0.7 + 0.192073) / 1.384146 = 0.644492, half 0.247716 -> [0.3968, 0.8922],
    # above 10/10's lower bound 0.7225: all clean after, but not resolved -> partly
    assert (r["measured"]["clean_before"], r["measured"]["clean_after"], r["measured"]["n"]) == (7, 10, 10)
    assert r["measured"]["before"]["ci95"] == [0.3968, 0.8922]
    assert r["verdict"] == "partly"
    for cid in ("corruption.t0-off-10", "corruption.t06-off"):  # sampling configs not served
        assert rows[cid]["verdict"] == "not run" and "was not served" in rows[cid]["note"]
    r = rows["corruption.executed"]  # first 8 claim tasks, t0-off-a, exact: reference code
    assert r["verdict"] == "reproduced"
    assert r["measured"] == {"passed": 8, "n": 8, "outcomes": {"pass": 8}, "sampling": "t0-off-a",
                             "clamp": "exact"}
    r = rows["serve.reasoning-parser"]
    assert r["verdict"] == "reproduced"
    both = {"n": 2, "content_empty": 2, "answer_in_reasoning_content": 2}
    assert r["measured"] == {"parser": "ling3", "stream": both, "non_stream": both}
    for cid in served_data.SERVED_CLAIMS:
        if rows[cid]["verdict"] != "not run":
            assert rows[cid]["checked_on"] == "sglang 0.5.23"
            assert all((study["run"] / e).is_file() for e in rows[cid]["evidence"]), cid


def test_second_call_resumes_without_requests(study):
    run, log = study["run"], study["log"]
    before, logs = len(requests_seen(log)), sorted((run / "logs").iterdir())
    ledger = {r["id"]: (r["measured"], r["verdict"]) for r in read_ledger(run)}
    again = s5.run_served_study(open_stage("05_corruption", str(study["pf"]), str(run)))
    assert len(requests_seen(log)) == before  # nothing sent
    assert sorted((run / "logs").iterdir()) == logs  # no server launched
    assert not own_processes(study["tmp"], log)
    pd.testing.assert_frame_equal(again["summary"], study["result"]["summary"])
    assert {r["id"]: (r["measured"], r["verdict"]) for r in read_ledger(run)} == ledger
    for mode in ("none", "exact"):
        assert len(served_data.read_rows(served_data.raw_path(study["stage"].paths, mode, "t06-on"))) == 15


def test_continued_after_a_changed_timeout_sends_nothing(study, tmp_path):
    """A run continued with a changed time-out (an operational key) is accepted by the runner's
    check and resumes from its recorded rows: no request is sent again, no server launched. A
    changed result key is refused, named."""
    import shutil

    from nvfp4study.core import runner
    from nvfp4study.core.errors import ResultParamsChanged
    from nvfp4study.core.params import dump_params, load_params

    run = tmp_path / "run"
    shutil.copytree(study["run"], run)
    old = load_params(study["pf"])
    # the manifest `nvfp4study run` writes holds the params the run was made with
    (run / "manifest.json").write_text(json.dumps({"params": old.model_dump(mode="json"),
                                                   "params_hash": old.digest()}))
    new = load_params(study["pf"], ["server.request_timeout_s=1234", "execution_timeout_s=86400"])
    assert new.server.request_timeout_s != old.server.request_timeout_s and new.digest() == old.digest()
    runner._previous_manifest(run, new)  # accepted: raises on a result key (below)
    before, logs = len(requests_seen(study["log"])), sorted((run / "logs").iterdir())
    again = s5.run_served_study(open_stage("05_corruption", str(dump_params(new, tmp_path / "new.yaml")), str(run)))
    assert len(requests_seen(study["log"])) == before  # nothing sent again
    assert sorted((run / "logs").iterdir()) == logs  # no server launched
    pd.testing.assert_frame_equal(again["summary"], study["result"]["summary"])
    with pytest.raises(ResultParamsChanged, match=rf"mtp\.prompts: {old.mtp.prompts} -> 3"):
        runner._previous_manifest(run, load_params(study["pf"], ["mtp.prompts=3"]))


def test_a_lost_request_is_asked_again(study, tmp_path):
    """Drop one row from a copy of the run: the study serves that mode again for that row only."""
    import shutil

    run, log = tmp_path / "run", study["log"]
    shutil.copytree(study["run"], run)
    raw = served_data.raw_path(open_stage("05_corruption", str(study["pf"]), str(run)).paths, "none", "t06-on")
    lines = raw.read_text().splitlines(keepends=True)
    raw.write_text("".join(lines[:3] + lines[4:]))  # card/merge_sorted (the 4th task) lost
    before = len(requests_seen(log))
    result = s5.run_served_study(open_stage("05_corruption", str(run / "params.yaml"), str(run)))
    new = requests_seen(log)[before:]
    assert [(r["mode"], r["thinking"]) for r in new] == [("none", True)]
    assert "def merge_sorted(" in new[0]["last"]
    rows = served_data.read_rows(raw)
    assert len(rows) == 15 and rows[-1]["task_id"] == "card/merge_sorted"
    pd.testing.assert_frame_equal(result["summary"], study["result"]["summary"])


@pytest.mark.slow
def test_notebook_runs_live_through_papermill(study, tmp_path):
    """Notebook 05 with the same params (detector validation off) on a copy of the fake run's
    params: it serves live, then shows the tables; the summary equals the library call's."""
    run = tmp_path / "nb"
    run.mkdir()
    pf = run / "params.yaml"
    pf.write_text(study["pf"].read_text())
    before = len(requests_seen(study["log"]))
    r = subprocess.run([sys.executable, "-m", "papermill", str(REPO_ROOT / "notebooks" / "05_corruption.ipynb"),
                        str(run / "05.ipynb"), "-p", "params_file", str(pf), "-p", "run_dir", str(run),
                        "--cwd", str(REPO_ROOT / "notebooks"), "--no-progress-bar"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    new = requests_seen(study["log"])[before:]
    assert len(new) == 2 * 2 * 15 + 4, [(r["mode"], r["pid"]) for r in new]  # served live, in full
    summary = pd.read_parquet(run / "data" / "corruption-summary.parquet")
    pd.testing.assert_frame_equal(summary, study["result"]["summary"])
    nb = (run / "05.ipynb").read_text()
    assert "Served live" in nb and "none/t0-off-a: 7/15 clean" in nb

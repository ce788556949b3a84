"""The served corruption study's analysis, on raw JSONL written by hand in this file.

Recorded set (clamp x sampling x task), and what each completion is, by construction:

=========  =========  ===============  ===================================================  =====
clamp      sampling   task             completion                                           exec
=========  =========  ===============  ===================================================  =====
none       t0-off-a   binary_search    ``high = len(arr) -  Advisory`` (undefined name)     name_error
none       t0-off-a   is_balanced      ``stack.append(c)ulp`` (glued name, syntax error)     syntax_error
none       t0-off-a   dedupe           clean, correct                                       pass
exact      t0-off-a   all three        clean, correct (dedupe: a cut stream, then resumed)  pass
none       t06-on     binary_search    <think>...</think> then clean, correct               pass
none       t06-on     is_balanced      content "", code in reasoning_content, fence junk    pass
none       t06-on     dedupe           ``seen.add(culp)`` (undefined name)                  name_error
exact      t06-on     binary_search    clean but wrong (returns 0)                          assertion_failure
exact      t06-on     is_balanced      request timed out (not a completion)                 -
exact      t06-on     dedupe           no code                                              -
=========  =========  ===============  ===================================================  =====

So by hand: none/t0-off-a 1/3 clean, exact/t0-off-a 3/3, none/t06-on 1/3, exact/t06-on 1/2
(n excludes the failed request; the no-code answer counts, as not clean).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from nvfp4study.codeeval import served_data
from nvfp4study.codeeval.served_analysis import junk_fragments, wilson_interval
from nvfp4study.codeeval.served_data import append_row, read_rows
from nvfp4study.codeeval.tasks import card_tasks
from nvfp4study.core.errors import RawDataError, ReplayDataMissing, TaskSelectionError
from nvfp4study.core.ledger import init_ledger, read_ledger
from nvfp4study.core.params import dump_params, load_params
from nvfp4study.core.paths import RunPaths
from nvfp4study.core.stage import Stage
from nvfp4study.stages import s05_corruption as s5
from nvfp4study.stages.s05_corruption import run_served_study

OVERRIDES = [
    # the GPU profile's served study without a server (the default profile's CPU engine runs in
    # tests/test_real_engine.py and the end-to-end study)
    "server.enabled=false", "corruption.clamp_modes=[none, exact]",
    "corruption.humaneval_count=0",
    "corruption.sampling=[{name: t0-off-a, temperature: 0.0}, {name: t06-on, temperature: 0.6, "
    "top_p: 0.95, top_k: 20, thinking: true}]",
    "corruption.reasoning_probe_tasks=2",
]

BS_OK = """def binary_search(arr, x):
    low, high = 0, len(arr) - 1
    while low <= high:
        mid = (low + high) // 2
        if arr[mid] == x:
            return mid
        elif arr[mid] < x:
            low = mid + 1
        else:
            high = mid - 1
    return -1
"""
BS_JUNK = BS_OK.replace("low, high = 0, len(arr) - 1", "low = 0\n    high = len(arr) -  Advisory")
BS_WRONG = "def binary_search(arr, x):\n    return 0\n"
IB_OK = """def is_balanced(s):
    pairs = {')': '(', ']': '[', '}': '{'}
    stack = []
    for c in s:
        if c in '([{':
            stack.append(c)
        elif c in pairs:
            if not stack or stack.pop() != pairs[c]:
                return False
    return not stack
"""
IB_GLUED = IB_OK.replace("stack.append(c)\n", "stack.append(c)ulp\n")
DD_OK = """def dedupe(items):
    seen = set()
    out = []
    for c in items:
        if c not in seen:
            seen.add(c)
            out.append(c)
    return out
"""
DD_CULP = DD_OK.replace("seen.add(c)", "seen.add(culp)")


def fenced(code: str, tail: str = "") -> str:
    return f"Here is the function.\n\n```python\n{code}```{tail}\n"


def row(clamp, sampling, task, content, reasoning=None, status="ok", stream=True, thinking=None):
    return {"schema": served_data.ROW_SCHEMA, "clamp": clamp, "sampling": sampling,
            "task_id": f"card/{task}", "source": "card",
            "thinking": (sampling == "t06-on") if thinking is None else thinking,
            "stream": stream, "reasoning_parser": None, "status": status,
            "error": None if status == "ok" else "no data within 600 s", "content": content,
            "reasoning_content": reasoning, "finish_reason": "stop" if status == "ok" else None,
            "completion_tokens": 100}


RAW = {
    ("none", "t0-off-a"): [
        row("none", "t0-off-a", "binary_search", fenced(BS_JUNK)),
        row("none", "t0-off-a", "is_balanced", fenced(IB_GLUED)),
        row("none", "t0-off-a", "dedupe", fenced(DD_OK)),
    ],
    ("exact", "t0-off-a"): [
        row("exact", "t0-off-a", "binary_search", fenced(BS_OK)),
        row("exact", "t0-off-a", "is_balanced", fenced(IB_OK)),
        row("exact", "t0-off-a", "dedupe", None, status="stream_cut"),
        row("exact", "t0-off-a", "dedupe", fenced(DD_OK)),  # the resumed request
    ],
    ("none", "t06-on"): [
        row("none", "t06-on", "binary_search", "<think>Halve the range each step.</think>\n"
            + fenced(BS_OK)),
        row("none", "t06-on", "is_balanced", "", reasoning=fenced(IB_OK, tail="culp\nDone.")),
        row("none", "t06-on", "dedupe", fenced(DD_CULP)),
    ],
    ("exact", "t06-on"): [
        row("exact", "t06-on", "binary_search", fenced(BS_WRONG)),
        row("exact", "t06-on", "is_balanced", None, status="timeout"),
        row("exact", "t06-on", "dedupe", "I am sorry, I cannot write that function."),
    ],
}
# reasoning-parser probe (exact, parser ling3, thinking off): streamed both answers stranded in
# reasoning_content; not streamed, one recovered into content.
PROBE = [
    {**row("exact", "t0-off-a", "binary_search", "", reasoning=fenced(BS_OK)), "stream": True},
    {**row("exact", "t0-off-a", "is_balanced", "", reasoning=fenced(IB_OK)), "stream": True},
    {**row("exact", "t0-off-a", "binary_search", fenced(BS_OK)), "stream": False},
    {**row("exact", "t0-off-a", "is_balanced", None, reasoning=fenced(IB_OK)), "stream": False},
]

# (clamp, sampling, task_set) -> (requests, failed, n, clean, corrupted, no_code, executed, passed)
EXPECTED = {
    ("none", "t0-off-a", "claim"): (3, 0, 3, 1, 2, 0, 3, 1),
    ("exact", "t0-off-a", "claim"): (3, 0, 3, 3, 0, 0, 3, 3),
    ("none", "t06-on", "claim"): (3, 0, 3, 1, 2, 0, 3, 2),
    ("exact", "t06-on", "claim"): (3, 1, 2, 1, 0, 1, 1, 0),
}


def make_stage(root: Path, *extra: str) -> Stage:
    params = load_params(None, [*OVERRIDES, *extra])
    root.mkdir(parents=True, exist_ok=True)
    dump_params(params, root / "params.yaml")
    init_ledger(root)
    return Stage(name="05_corruption", params=params, paths=RunPaths(root))


def write_recorded(stage: Stage) -> None:
    for (clamp, sampling), rows in RAW.items():
        path = served_data.raw_path(stage.paths, clamp, sampling)
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    probe = served_data.probe_path(stage.paths, "exact", "ling3")
    probe.write_text("".join(json.dumps(r) + "\n" for r in PROBE))


@pytest.fixture(scope="module")
def analysed(tmp_path_factory):
    stage = make_stage(tmp_path_factory.mktemp("rec") / "run")
    write_recorded(stage)
    result = s5.analyse_served(stage, stage.params, "live")
    return stage, result


def test_wilson_interval_by_hand():
    # p = 1/3, z^2 = 3.841459, z^2/n = 1.280486, denom = 2.280486,
    # center = (0.333333 + 0.640243) / 2.280486 = 0.426916,
    # half = 1.959964 * sqrt(0.074074 + 0.106707) / 2.280486 = 0.365425
    lo, hi = wilson_interval(1, 3)
    assert lo == pytest.approx(0.426916 - 0.365425, abs=2e-6)
    assert hi == pytest.approx(0.426916 + 0.365425, abs=2e-6)
    # textbook values: 0/10 -> [0, 0.2775], 10/10 -> [0.7225, 1]; 4/15 -> [0.1090, 0.5195]
    assert wilson_interval(0, 10) == pytest.approx((0.0, 0.277533), abs=1e-6)
    assert wilson_interval(10, 10) == pytest.approx((0.722467, 1.0), abs=1e-6)
    assert wilson_interval(4, 15) == pytest.approx((0.108975, 0.519504), abs=1e-6)
    assert all(math.isnan(v) for v in wilson_interval(0, 0))
    # exact ends at 0/n and n/n (in floats the formula gives 10/10 -> 0.9999999999999999 and
    # 0/3 -> 5.6e-17: the interval then missed p and the figure's error bars went negative)
    assert all(wilson_interval(n, n)[1] == 1.0 and wilson_interval(0, n)[0] == 0.0 for n in range(1, 60))


def test_summary_matches_hand_counts(analysed):
    _, result = analysed
    s = result["summary"]
    cols = ["requests", "failed", "n", "clean", "corrupted", "no_code", "executed", "passed"]
    got = {(r.clamp, r.sampling, r.task_set): tuple(int(getattr(r, c)) for c in cols)
           for r in s.itertuples() if r.task_set == "claim"}
    assert got == EXPECTED
    # with only card tasks loaded, "all" is the same set
    alls = s[s.task_set == "all"].drop(columns="task_set").reset_index(drop=True)
    claims = s[s.task_set == "claim"].drop(columns="task_set").reset_index(drop=True)
    pd.testing.assert_frame_equal(alls, claims)
    none_a = s[(s.clamp == "none") & (s.sampling == "t0-off-a") & (s.task_set == "claim")].iloc[0]
    assert none_a.clean_frac == pytest.approx(1 / 3)
    assert (none_a.ci_low, none_a.ci_high) == pytest.approx((0.061492, 0.792340), abs=1e-6)


def test_classified_rows(analysed):
    _, result = analysed
    df = result["classified"].set_index(["clamp", "sampling", "task_id"])
    assert len(df) == 12  # the cut-stream row is replaced by its resumed twin
    r = df.loc[("none", "t0-off-a", "card/binary_search")]
    assert (r.detector, r.label, r.exec_outcome, r.exec_name) == ("corrupted", "undefined_name",
                                                                  "name_error", "Advisory")
    r = df.loc[("none", "t0-off-a", "card/is_balanced")]
    assert (r.detector, r.label, r.exec_outcome) == ("corrupted", "glued_name", "syntax_error")
    r = df.loc[("none", "t06-on", "card/is_balanced")]
    assert (r.detector, r.label, r.code_origin, r.misplaced, r.content_empty) == (
        "corrupted", "junk_fence", "reasoning_content", True, True)
    assert r.exec_outcome == "pass"  # the code before the junk fence is correct
    r = df.loc[("none", "t06-on", "card/binary_search")]
    assert (r.detector, r.think, r.exec_outcome) == ("clean", "closed", "pass")
    r = df.loc[("exact", "t06-on", "card/binary_search")]
    assert (r.detector, r.exec_outcome, r.exec_exception) == ("clean", "assertion_failure",
                                                              "AssertionError")
    assert df.loc[("exact", "t06-on", "card/is_balanced")].detector == "request_failed"
    r = df.loc[("exact", "t06-on", "card/dedupe")]
    assert r.detector == "no_code" and pd.isna(r.exec_outcome)
    assert set(result["classified"].isolation.dropna()) <= {"bwrap", "subprocess-unsafe"}


def test_junk_fragments(analysed):
    _, result = analysed
    j = result["junk"].set_index("fragment")
    # by hand: Advisory (none, t0-off-a), ulp (none, t0-off-a), culp twice (none, t06-on:
    # the fence junk and the undefined name); nothing in exact
    assert j.total.to_dict() == {"culp": 2, "Advisory": 1, "ulp": 1}
    assert j.loc["culp", "none"] == 2 and j.loc["culp", "exact"] == 0
    assert list(j.index)[0] == "culp"
    assert junk_fragments(result["classified"], top=1).fragment.tolist() == ["culp"]


def test_probe_summary(analysed):
    _, result = analysed
    p = result["probe"].set_index("stream")
    assert p.loc[True, ["n", "content_empty", "answer_in_reasoning", "code_in_content"]].tolist() == [2, 2, 2, 0]
    assert p.loc[False, ["n", "content_empty", "answer_in_reasoning", "code_in_content"]].tolist() == [2, 1, 1, 1]


def test_ledger_rows(analysed):
    stage, _ = analysed
    rows = {r["id"]: r for r in read_ledger(stage.run_dir)}
    r = rows["corruption.t0-off-15"]
    # after 3/3 clean, but before 1/3 has upper bound 0.7923 > after's lower bound 0.4385
    assert r["verdict"] == "partly"
    assert r["measured"]["clean_before"] == 1 and r["measured"]["clean_after"] == 3
    assert r["measured"]["after"]["ci95"] == [0.4385, 1.0]
    assert r["card"]["clean_before"] == 4  # the card's value stays in "card"
    r = rows["corruption.t06-on"]
    assert r["verdict"] == "contradicted"  # after 1/2 clean, intervals overlap
    assert r["measured"]["after"] == {"clean": 1, "n": 2, "clean_frac": 0.5, "no_code": 1,
                                      "unjudged": 0, "failed": 1, "ci95": [0.0945, 0.9055]}
    for cid in ("corruption.t0-off-10", "corruption.t06-off"):  # not in these params
        assert rows[cid]["verdict"] == "not run" and "not served" in rows[cid]["note"]
    r = rows["corruption.executed"]
    assert r["verdict"] == "reproduced" and r["measured"]["passed"] == 3 and r["measured"]["n"] == 3
    r = rows["serve.reasoning-parser"]
    assert r["verdict"] == "partly"  # all streamed answers stranded, one of two non-streamed
    assert r["measured"]["stream"] == {"n": 2, "content_empty": 2, "answer_in_reasoning_content": 2}
    assert all(e.startswith("data/") or e.startswith("figures/") for e in rows["corruption.t06-on"]["evidence"])


def test_files_written(analysed):
    stage, result = analysed
    for key in ("classified", "summary", "junk", "figure", "provenance", "probe"):
        assert Path(result["files"][key]).is_file(), key
    prov = json.loads(Path(result["files"]["provenance"]).read_text())
    assert prov["claim_sets"]["t0-off-a"][:3] == ["card/binary_search", "card/is_balanced", "card/dedupe"]
    assert len(prov["claim_sets"]["t0-off-a"]) == 15 and len(prov["claim_sets"]["t06-on"]) == 10
    back = pd.read_parquet(result["files"]["summary"])
    pd.testing.assert_frame_equal(back, result["summary"])


def test_replay_gives_identical_tables(analysed, tmp_path):
    recorded, first = analysed
    stage = make_stage(tmp_path / "replay", f"replay_from={recorded.run_dir}")
    result = run_served_study(stage)
    assert result["status"] == "replay"
    pd.testing.assert_frame_equal(result["summary"], first["summary"])
    pd.testing.assert_frame_equal(result["junk"], first["junk"])
    cols = [c for c in first["classified"].columns if c != "isolation"]
    pd.testing.assert_frame_equal(result["classified"][cols], first["classified"][cols])
    assert served_data.raw_path(stage.paths, "none", "t06-on").is_file()  # copied in
    a = {r["id"]: r["measured"] for r in read_ledger(recorded.run_dir)}
    b = {r["id"]: r["measured"] for r in read_ledger(stage.run_dir)}
    assert all(a[c] == b[c] for c in served_data.SERVED_CLAIMS)


def test_replay_missing_data(tmp_path):
    empty = make_stage(tmp_path / "empty")
    stage = make_stage(tmp_path / "replay", f"replay_from={empty.run_dir}")
    with pytest.raises(ReplayDataMissing, match="corruption-raw-clamp=none-sampling=t0-off-a"):
        run_served_study(stage)


def test_not_run_without_server(tmp_path):
    stage = make_stage(tmp_path / "run")
    assert stage.params.server.enabled is False
    result = run_served_study(stage)
    assert result["status"] == "not run"
    rows = {r["id"]: r for r in read_ledger(stage.run_dir)}
    reason = "not run: needs an NVFP4-capable GPU (server.enabled is false)"
    for cid in served_data.SERVED_CLAIMS:
        assert rows[cid]["verdict"] == "not run" and rows[cid]["measured"] is None
        if cid.startswith("corruption."):  # the card's corruption rows cite the outside evidence, as theirs
            assert rows[cid]["note"].startswith(reason + ". Outside evidence, theirs")
            assert "jundot/omlx/pull/2571" in rows[cid]["note"] and "88.41 %" in rows[cid]["note"]
        else:
            assert rows[cid]["note"] == reason
    assert not list(stage.paths.data_dir.glob("corruption-raw-*"))


def test_raw_file_robustness(tmp_path):
    p = tmp_path / "raw.jsonl"
    good = row("none", "t0-off-a", "dedupe", fenced(DD_OK))
    p.write_text(json.dumps(good) + "\n" + json.dumps(good)[:40])  # a write cut by a crash
    append_row(p, good)  # resumes on a fresh line
    assert len(read_rows(p)) == 2
    p.write_text("not json\n")
    with pytest.raises(RawDataError, match="line 1"):
        read_rows(p)
    p.write_text(json.dumps({"task_id": "x"}) + "\n")
    with pytest.raises(RawDataError, match="not a request row"):
        read_rows(p)


def test_claim_sets_from_params():
    from serving_fixtures import GPU_ENGINE

    card = [o for o in GPU_ENGINE if o.startswith("corruption.sampling=")]  # the card's four configurations
    params = load_params(None, ["corruption.humaneval_count=3", *card])
    sets = served_data.claim_sets(params)
    ids = [t.task_id for t in card_tasks()]
    assert sets == {"t0-off-a": ids[:15], "t0-off-b": ids[:10], "t06-on": ids[:10], "t06-off": ids[:10]}
    params = load_params(None, ["corruption.card_tasks=false", "corruption.humaneval_count=20", *card])
    assert served_data.claim_sets(params)["t0-off-b"] == [f"HumanEval/{i}" for i in range(10)]
    params = load_params(None, ["corruption.claim_tasks=[HumanEval/3, card/dedupe]"])
    assert served_data.claim_task_ids(params, 15) == ["HumanEval/3", "card/dedupe"]
    params = load_params(None, ["corruption.claim_tasks=[HumanEval/999]"])
    with pytest.raises(TaskSelectionError, match="HumanEval/999"):
        served_data.claim_sets(params)


# --- live collection, with the server and client replaced by stand-ins ------------------------
class FakeServing:
    """Stands in for the one collector's launch (``measure._recorded_launch``) and
    client.chat_completion: answers every request with the task's reference solution; can fail
    after a number of requests to test resuming."""

    def __init__(self, fail_after: int | None = None):
        self.launches, self.calls, self.fail_after = [], [], fail_after
        self.solutions = {t.prompt.rstrip(): t for t in card_tasks()}

    def install(self, monkeypatch):
        from nvfp4study.serving import client, measure

        monkeypatch.setattr(measure, "_recorded_launch", self.recorded_launch)
        monkeypatch.setattr(client, "chat_completion", self.chat_completion)
        for name in ("server_info", "model_info", "get_metrics"):
            monkeypatch.setattr(client, name, lambda url: {})

    def recorded_launch(self, stage, config, loaded_with):
        import contextlib
        from types import SimpleNamespace

        @contextlib.contextmanager
        def cm():
            self.launches.append((config.clamp, config.reasoning_parser or stage.params.server.reasoning_parser))
            yield SimpleNamespace(record={"launch": len(self.launches), "sent": 0, "failed": 0},
                                  url="http://fake", wait_healthy=lambda: "http://fake")
        return cm()

    def chat_completion(self, url, messages, **kw):
        if self.fail_after is not None and len(self.calls) >= self.fail_after:
            raise KeyboardInterrupt("study interrupted")
        self.calls.append(kw)
        text = messages[0]["content"]
        task = next(t for p, t in self.solutions.items() if p in text)
        code = task.prompt + task.canonical_solution
        return {"status": "ok", "error": None, "content": fenced(code), "reasoning_content": None,
                "finish_reason": "stop", "usage": {"completion_tokens": 50}, "request": {"n": 1},
                "end_s": 0.1, "ttft_s": 0.01, "t_wall": "2026-01-01T00:00:00Z"}


def test_live_collection_resumes(tmp_path, monkeypatch):
    """05's plan on the one collector: three claim tasks per sampling configuration and clamp
    mode, then the probe; interrupted after 8 requests, resumed with only what is missing."""
    from nvfp4study.serving import measure

    three = ",".join(t.task_id for t in card_tasks()[:3])
    stage = make_stage(tmp_path / "run", "server.enabled=true", "server.require_gpu=false", "server.engine=gpu",
                       "corruption.reasoning_probe_tasks=1", "corruption.protocol=card",
                       f"corruption.claim_tasks=[{three}]",
                       "corruption.concurrency=2")  # 05's own configurations: not 04/06/07's card one
    tasks = card_tasks()[:3]
    fake = FakeServing(fail_after=8)
    fake.install(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        measure.collect(stage)
    assert len(fake.calls) == 8  # 2 samplings x 3 tasks for "none", then 2 of "exact"
    fake.fail_after = None
    measure.collect(stage)
    assert len(fake.calls) == 14  # only the 4 missing requests were sent again, then the probe's 2
    measure.collect(stage)
    assert len(fake.calls) == 14  # complete: no server launched
    # the probe (mode exact, one install state with the exact sweep) loads beside the exact sweep
    # (server.parallel_loads): launched with it in the interrupted call, and again on resume
    assert fake.launches == [("none", None), ("exact", None), ("exact", "ling3"), ("exact", None), ("exact", "ling3")]
    for clamp in ("none", "exact"):
        for s in ("t0-off-a", "t06-on"):
            rows = read_rows(served_data.raw_path(stage.paths, clamp, s))
            assert [r["task_id"] for r in rows] == [t.task_id for t in tasks]
            assert all(r["status"] == "ok" and r["clamp"] == clamp for r in rows)
    thinking = {r["sampling"]: r["thinking"] for r in read_rows(served_data.raw_path(stage.paths, "none", "t06-on"))}
    assert thinking == {"t06-on": True}
    assert fake.calls[3]["chat_template_kwargs"] == {"enable_thinking": True}
    assert fake.calls[0]["chat_template_kwargs"] == {"enable_thinking": False}
    assert (fake.calls[3]["temperature"], fake.calls[3]["top_p"], fake.calls[3]["top_k"]) == (0.6, 0.95, 20)
    assert fake.launches[-1] == ("exact", "ling3")  # the probe's server has the parser on
    probe = read_rows(served_data.probe_path(stage.paths, "exact", "ling3"))
    assert [(r["task_id"], r["stream"]) for r in probe] == [("card/binary_search", True),
                                                            ("card/binary_search", False)]
    assert stage.params.server.reasoning_parser is None  # the stage's own params untouched


def test_card_protocol_asks_each_sampling_its_claim_tasks(tmp_path, monkeypatch):
    """corruption.protocol card: t0-off-a the 15 card tasks, t0-off-b / t06-on / t06-off the first
    10 (claims.yaml n), 45 per clamp mode; a sampling config no claim names asks the 15; the
    extended protocol asks every loaded task with every config."""
    from nvfp4study.codeeval.tasks import CARD_TASK_IDS
    from nvfp4study.serving import measure

    four = ("corruption.sampling=[{name: t0-off-a, temperature: 0.0}, {name: t0-off-b, temperature: 0.0}, "
            "{name: t06-on, temperature: 0.6, thinking: true}, {name: t06-off, temperature: 0.6}, "
            "{name: mine, temperature: 0.3}]")
    stage = make_stage(tmp_path / "run", "server.enabled=true", "server.require_gpu=false", four,
                       "corruption.protocol=card", "server.engine=gpu", "corruption.reasoning_probe_tasks=0",
                       "corruption.concurrency=2")  # 05's own configurations: not 04/06/07's card one
    fake = FakeServing()
    fake.install(monkeypatch)
    measure.collect(stage)
    want = {"t0-off-a": 15, "t0-off-b": 10, "t06-on": 10, "t06-off": 10, "mine": 15}
    for clamp in ("none", "exact"):
        for name, n in want.items():
            rows = read_rows(served_data.raw_path(stage.paths, clamp, name))
            assert [r["task_id"] for r in rows] == list(CARD_TASK_IDS[:n])
    assert len(fake.calls) == 2 * sum(want.values()) and len(fake.launches) == 2
    ext = make_stage(tmp_path / "ext", "corruption.protocol=extended", four)
    assert all(served_data.sweep_task_ids(ext.params, s) is None for s in ext.params.corruption.sampling)


def test_gpu_profile_claim_sets(repo):
    from nvfp4study.codeeval.tasks import CARD_TASK_IDS

    params = load_params(repo / "params" / "ling3-flash.yaml")
    sets = served_data.claim_sets(params)
    assert sets == {"t0-off-a": list(CARD_TASK_IDS), "t0-off-b": list(CARD_TASK_IDS[:10]),
                    "t06-on": list(CARD_TASK_IDS[:10]), "t06-off": list(CARD_TASK_IDS[:10])}
    off, ids = served_data.probe_plan(params)
    assert off.thinking is False and len(ids) == params.corruption.reasoning_probe_tasks


def test_an_answer_cut_before_its_code_is_not_counted_as_unclean():
    """A thinking-on answer stopped at max_tokens while still reasoning (finish_reason length, no
    code) is "cut": neither clean nor corrupted, out of n; cut after its code it is judged."""
    from nvfp4study.codeeval import served_analysis as sa

    still_thinking = {**row("exact", "t06-on", "dedupe", "", reasoning="Let me think. " * 400),
                      "finish_reason": "length", "completion_tokens": 2048}
    cut_after_code = {**row("exact", "t06-on", "binary_search", fenced(BS_JUNK) + "And more"),
                      "finish_reason": "length"}
    clean = row("exact", "t06-on", "is_balanced", fenced(IB_OK))
    no_code = row("exact", "t06-on", "flatten", "I cannot answer that.")  # stopped by itself: judged
    rambling = {**row("exact", "t06-on", "two_sum", "words " * 900, thinking=False), "finish_reason": "length"}
    tasks = {t.task_id: t for t in card_tasks()}
    df = sa.classify_rows([still_thinking, cut_after_code, clean, no_code, rambling], tasks, execute=False)
    assert df.cut.tolist() == [True, False, False, False, False]  # thinking off: no code is no_code
    assert df.detector.tolist() == ["no_code", "corrupted", "clean", "no_code", "no_code"]
    s = sa.summarize(df, {}).iloc[0]
    # n = 4 (the cut answer is out): 1 clean, 1 corrupted, 2 no_code
    assert (s.requests, s.cut, s.n, s.clean, s.corrupted, s.no_code) == (5, 1, 4, 1, 1, 2)
    assert s.clean_frac == pytest.approx(1 / 4)

"""Stage 05's served corruption study (``s05_corruption.run_served_study``: its plan's
``served_collect`` requests on the one collector, ``served_data``, ``served_analysis``) against SGLang 0.5.23's
REAL HTTP/OpenAI layer and its real ``ling3`` reasoning parser, over the stub engine answering
from ``tests/real_sglang/corruption_outputs.json`` (one canned answer per card task).

Two launches: the study's (clamp ``exact`` only, ``--reasoning-parser ling3``, 15 card tasks x
``t0-off-a`` thinking off / ``t06-on`` thinking on, streamed) and the probe's (``ling3``,
thinking off, first 2 claim tasks, streamed and not).

Where SGLang puts the text (``Ling3Detector``, ``sglang/srt/parser/reasoning_parser.py``
955-996, over ``Glm45Detector`` 911-952, ``reasoning_default="enable_thinking"``), as
:func:`served` restates it and the raw rows confirm:

* thinking off: the parser does not split; everything, a ``</think>`` included, is ``content``.
* thinking on: text before ``</think>`` is ``reasoning_content``, after it ``content``. When
  nothing follows (binary_search's answer inside the think block), streamed: ``content`` ""
  and the answer in ``reasoning_content`` (not streamed, Ling3's fallback in ``detect_and_parse``,
  987-996, would move it into ``content``; the study streams thinking-on requests). No ``</think>`` at all, streamed: the reasoning increments
  arrive as ``reasoning_content`` and, at the end, the same text again as ``content`` (the
  base detector's ``force_nonempty_content``, which Ling3 switches on).

Expected verdicts are computed here from the canned texts: an answer is corrupted iff it holds
one of the card's junk fragments (:data:`JUNK`), and its code passes the task's checks iff it
is clean (every other answer is the task's reference solution).
"""

from __future__ import annotations

import json

import pytest

from nvfp4study.codeeval import served_data
from nvfp4study.codeeval.tasks import CARD_TASK_IDS, card_tasks
from nvfp4study.core.ledger import read_ledger
from nvfp4study.core.stage import open_stage
from nvfp4study.stages import s05_corruption as s5
from real_sglang_fixtures import HERE, real_params
from serving_fixtures import no_leftover  # noqa: F401

pytestmark = [pytest.mark.real_sglang, pytest.mark.usefixtures("no_leftover")]
CANNED = HERE / "corruption_outputs.json"
# junk fragment -> (reference code, the canned answer's code)
JUNK = {"culp": ("seen.add(item)", "seen.add(culp)"),
        "eville": ("counts.get(c, 0) + 1", "counts.get(c, 0) + 1eville")}
SAMPLING = ("corruption.sampling=[{name: t0-off-a, temperature: 0.0, max_tokens: 512}, "
            "{name: t06-on, temperature: 0.6, top_p: 0.95, top_k: 20, thinking: true, max_tokens: 512}]")
OVERRIDES = ["corruption.humaneval_count=0", SAMPLING, "corruption.reasoning_probe_tasks=2",
             "corruption.validate_detector=false", "corruption.clamp_modes=[exact]",
             "server.reasoning_parser=ling3",
             # 06 and 07 off the card's configuration: 05's exact sweep launches with 05's requests alone
             "mtp.depths=[0]", "determinism.spec_depth=1"]
SAMPLINGS = (("t0-off-a", False), ("t06-on", True))
KEY = "clamp=exact-spec=2-det=off"


def canned(entry_point: str, thinking: bool) -> dict:
    """The canned output the stub answers ``entry_point``'s prompt with (its thinking variant
    when the prompt leaves the think block open)."""
    out = next(o for o in json.loads(CANNED.read_text())["outputs"] if o["name"] == entry_point)
    return {**out, **out["thinking"]} if thinking and "thinking" in out else out


def served(text: str, thinking: bool, stream: bool) -> tuple[str, str | None]:
    """(content, reasoning_content) SGLang's ``ling3`` parser makes of ``text`` (module docstring)."""
    if not thinking:
        return text, None
    assert stream, "the study streams every thinking-on request"
    if "</think>" not in text:
        return text, text
    reasoning, content = text.split("</think>", 1)
    return content, reasoning


def expected_origin(content: str, reasoning: str | None) -> str:
    if not content.strip():
        return "reasoning_content"
    return "after_stray_think" if "</think>" in content else "content"


def fence(text: str) -> str:
    return text.split("```python\n", 1)[1].split("```", 1)[0]


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("real-served")
    _, pf, run = real_params(tmp, *OVERRIDES, outputs=CANNED)
    stage = open_stage("05_corruption", str(pf), str(run))
    return {"stage": stage, "result": s5.run_served_study(stage), "run": run}


def test_canned_texts_are_the_reference_code_or_the_card_junk():
    """The data the expectations rest on: each answer's code is its task's reference solution,
    with exactly the junk named in the file's comment."""
    for t in card_tasks():
        ref = t.prompt + t.canonical_solution
        for thinking in (False, True):
            o = canned(t.entry_point, thinking)
            text = "".join(o["texts"])
            got = fence(text)
            hits = [f for f in JUNK if f in text]
            assert len(hits) <= 1 and got == (ref.replace(*JUNK[hits[0]]) if hits else ref), t.entry_point
            assert not hits or got != ref


def test_two_launches_of_the_real_layer(study):
    run = study["run"]
    assert study["result"]["status"] == "live"
    logs = sorted(p.name for p in (run / "logs").glob("sglang-*.log"))
    # the probe is a configuration of its own (ServerConfig.reasoning_parser: tag "parser")
    assert logs == [f"sglang-{KEY}-parser=ling3.log", f"sglang-{KEY}.log"]
    for name in logs:  # both served with SGLang's ling3 parser, by SGLang's own flag parser
        assert "reasoning_parser='ling3'" in (run / "logs" / name).read_text()


def test_raw_rows_hold_what_the_real_parser_served(study):
    stage = study["stage"]
    for sampling, thinking in SAMPLINGS:
        rows = served_data.read_rows(served_data.raw_path(stage.paths, "exact", sampling))
        assert [r["task_id"] for r in rows] == list(CARD_TASK_IDS)
        for r in rows:
            o = canned(r["task_id"].split("/")[1], thinking)
            content, reasoning = served("".join(o["texts"]), thinking, stream=True)
            assert (r["content"], r["reasoning_content"]) == (content, reasoning), (sampling, r["task_id"])
            assert (r["status"], r["finish_reason"], r["stream"], r["reasoning_parser"]) == ("ok", "stop", True, "ling3")
            assert r["completion_tokens"] == len(o["token_ids"]) and r["server"] == KEY
            assert r["request"]["chat_template_kwargs"] == {"enable_thinking": thinking}
            assert r["params_digest"] == stage.params.digest()
    on = {r["task_id"]: r for r in served_data.read_rows(served_data.raw_path(stage.paths, "exact", "t06-on"))}
    assert on["card/binary_search"]["content"] == "" and "def binary_search(" in on["card/binary_search"]["reasoning_content"]
    off = {r["task_id"]: r for r in served_data.read_rows(served_data.raw_path(stage.paths, "exact", "t0-off-a"))}
    assert "</think>Here is the function." in off["card/is_balanced"]["content"]  # leaked thinking
    probe = served_data.read_rows(served_data.probe_path(stage.paths, "exact", "ling3"))
    assert [(r["task_id"], r["stream"]) for r in probe] == [
        ("card/binary_search", True), ("card/binary_search", False),
        ("card/is_balanced", True), ("card/is_balanced", False)]
    for r in probe:
        text = "".join(canned(r["task_id"].split("/")[1], False)["texts"])
        assert (r["status"], r["content"], r["reasoning_content"]) == ("ok", *served(text, False, r["stream"]))


def test_classification_and_sandbox_follow_the_canned_texts(study):
    df = study["result"]["classified"]
    assert len(df) == 30
    for r in df.itertuples():
        thinking = r.sampling == "t06-on"
        text = "".join(canned(r.task_id.split("/")[1], thinking)["texts"])
        content, reasoning = served(text, thinking, stream=True)
        bad = any(f in text for f in JUNK)
        assert r.detector == ("corrupted" if bad else "clean"), (r.sampling, r.task_id)
        assert r.code_origin == expected_origin(content, reasoning), (r.sampling, r.task_id)
        assert r.misplaced == (r.code_origin != "content")
        assert r.exec_outcome is not None and r.passed == (not bad), (r.sampling, r.task_id, r.exec_outcome)
        if "culp" in text:
            assert r.exec_exception == "NameError" and "culp" in r.junk
    # the sandbox ran the code the extraction took from reasoning_content and after </think>
    ran = {(r.sampling, r.task_id): r.exec_outcome for r in df.itertuples()}
    assert ran[("t06-on", "card/binary_search")] == "pass" and ran[("t0-off-a", "card/is_balanced")] == "pass"
    cols = ["requests", "failed", "n", "clean", "corrupted", "no_code", "executed", "passed"]
    got = {(r.sampling, r.task_set): tuple(int(getattr(r, c)) for c in cols)
           for r in study["result"]["summary"].itertuples()}
    # by hand: dedupe (3rd) and first_unique_char (11th) carry junk; t06-on's claim set is the first 10
    assert got == {("t0-off-a", "claim"): (15, 0, 15, 13, 2, 0, 15, 13),
                   ("t0-off-a", "all"): (15, 0, 15, 13, 2, 0, 15, 13),
                   ("t06-on", "claim"): (10, 0, 10, 9, 1, 0, 10, 9),
                   ("t06-on", "all"): (15, 0, 15, 13, 2, 0, 15, 13)}


def test_ledger_rows_from_the_real_layer(study):
    rows = {r["id"]: r for r in read_ledger(study["run"])}
    r = rows["corruption.t0-off-15"]  # before mode not served: not separated, not all clean
    assert (r["measured"]["clean_before"], r["measured"]["clean_after"], r["verdict"]) == (None, 13, "contradicted")
    r = rows["corruption.executed"]  # first 8 claim tasks: dedupe's junk fails
    assert r["measured"]["passed"] == 7 and r["measured"]["n"] == 8 and r["verdict"] == "contradicted"
    assert "card/dedupe" in r["note"]
    # thinking off, SGLang 0.5.23's ling3 parser leaves every answer in content
    r = rows["serve.reasoning-parser"]
    none = {"n": 2, "content_empty": 0, "answer_in_reasoning_content": 0}
    assert r["measured"] == {"parser": "ling3", "stream": none, "non_stream": none}
    assert r["verdict"] == "contradicted" and r["checked_on"] == "sglang 0.5.23"

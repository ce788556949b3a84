"""The study's client and collection code against SGLang 0.5.23's REAL HTTP/OpenAI layer
(``http_server.app``, ``OpenAIServingChat``, the protocol models, the ``ling3`` reasoning parser,
``add_prometheus_middleware`` + ``TokenizerMetricsCollector``) over a stub engine whose outputs
are data (``tests/real_sglang/outputs.json``). Launched, health-waited and stopped by the study's
own ``serving.server.serving``.

Hand-checked values, from ``outputs.json``:

* "answer" (any prompt, thinking off): 10 tokens ``" The answer is forty-two, said the fox."``,
  ids 11..20, forward passes ``[1, 3, 3, 2, 1]``: the prefill's token then 4 verify passes with
  2, 2, 1, 0 accepted drafts. With 3 draft tokens (the card's depth 2) SGLang reports
  ``spec_verify_ct`` 4, correct drafts 5, proposed 4 x (3 - 1) = 8, accept length 10 / 4 = 2.5
  (bonus token included), accept rate 5 / 8 = 0.625, histogram of correct drafts [1, 1, 2].
  The stream's cumulative token counts are 1, 4, 7, 9, 10.
* "answer" with thinking on: ``"Let me think.</think>The answer is 42."`` (10 tokens).
* "[[abort]]": the engine aborts (HTTP status 500) after 3 forward passes.
"""

from __future__ import annotations

import pytest

from nvfp4study.core.errors import RequestFailed
from nvfp4study.serving import client, measure, server
from real_sglang_fixtures import real_params
from serving_fixtures import no_leftover, stage_for  # noqa: F401

pytestmark = [pytest.mark.real_sglang, pytest.mark.usefixtures("no_leftover")]
MSG = [{"role": "user", "content": "What is the answer?"}]
ANSWER = " The answer is forty-two, said the fox."
OFF = {"enable_thinking": False}


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    """The card's configuration: NEXTN depth 2, 3 draft tokens, metrics on, no reasoning parser."""
    p, _, run = real_params(tmp_path_factory.mktemp("real"))
    rec: dict = {}
    with server.serving(stage_for(p, run), server.card_config(p), launch_record=rec) as u:
        assert rec["sglang_version"] == "0.5.23" and rec["gpu"] is None  # SGLang's own probes
        yield u


@pytest.fixture(scope="module")
def parser_url(tmp_path_factory):
    """Speculation off, ``--reasoning-parser ling3`` (SGLang's Ling3Detector)."""
    p, _, run = real_params(tmp_path_factory.mktemp("real-parser"), "server.reasoning_parser=ling3")
    with server.serving(stage_for(p, run), server.card_config(p, spec_depth=None)) as u:
        yield u


def test_streamed_record_and_spec_details_by_hand(url):
    r = client.chat_completion(url, MSG, temperature=0.0, max_tokens=32, chat_template_kwargs=OFF,
                               return_spec_tokens_details=True, return_output_ids=True, keep_sse=True)
    assert r["status"] == "ok" and r["done"] and r["error"] is None and r["http_status"] == 200
    assert r["content"] == ANSWER and r["reasoning_content"] is None and r["finish_reason"] == "stop"
    assert r["output_ids"] == list(range(11, 21)) and r["usage"]["completion_tokens"] == 10
    kinds = [c["kind"] for c in r["chunks"]]
    assert kinds == ["role"] + ["content"] * 5 + ["finish", "sglext", "usage"]
    assert [c["tokens"] for c in r["chunks"] if c["kind"] == "content"] == [1, 4, 7, 9, 10]
    assert r["spec_tokens_details"] == {
        "spec_accept_rate": 0.625, "spec_accept_length": 2.5, "spec_cap_length": 0.0,
        "spec_block_accept_length": 0.0, "spec_num_correct_drafts": 5, "spec_num_proposed_drafts": 8,
        "spec_verify_ct": 4, "spec_correct_drafts_histogram": [1, 1, 2], "spec_cap_lens_histogram": []}
    assert r["sse"][-1][1] == "[DONE]"


def test_non_streamed_matches_streamed(url):
    a = client.chat_completion(url, MSG, temperature=0, max_tokens=32, chat_template_kwargs=OFF,
                               return_spec_tokens_details=True)
    b = client.chat_completion(url, MSG, temperature=0, max_tokens=32, chat_template_kwargs=OFF,
                               return_spec_tokens_details=True, stream=False)
    assert b["status"] == "ok" and b["content"] == a["content"] == ANSWER and b["chunks"] == []
    assert b["spec_tokens_details"] == a["spec_tokens_details"]
    assert b["usage"]["completion_tokens"] == 10 and b["finish_reason"] == "stop"


def test_max_tokens_cuts_and_one_token_has_no_spec_details(url):
    r = client.chat_completion(url, MSG, temperature=0, max_tokens=5, chat_template_kwargs=OFF,
                               return_spec_tokens_details=True)
    # passes [1, 3, 1]: 2 verify passes, 2 correct drafts; accept length 5 / 2, rate 2 / 4
    assert r["content"] == " The answer is forty-two" and r["finish_reason"] == "length"
    s = r["spec_tokens_details"]
    assert (s["spec_verify_ct"], s["spec_num_correct_drafts"], s["spec_accept_length"],
            s["spec_accept_rate"]) == (2, 2, 2.5, 0.5)
    for stream in (True, False):  # one token = the prefill's: spec_verify_ct 0 -> no details
        one = client.chat_completion(url, MSG, temperature=0, max_tokens=1, chat_template_kwargs=OFF,
                                     return_spec_tokens_details=True, stream=stream)
        assert one["status"] == "ok" and one["content"] == " The" and one["spec_tokens_details"] is None
        miss = client.chat_completion(url, MSG, temperature=0, max_tokens=1, chat_template_kwargs=OFF,
                                      stream=stream, expect_spec_details=True, raise_on_error=False)
        assert miss["status"] == "missing_fields" and "sglext.spec_tokens_details" in miss["error"]


def test_thinking_on_without_parser_keeps_the_think_text_in_content(url):
    r = client.chat_completion(url, MSG, temperature=0, max_tokens=32)
    assert r["content"] == "Let me think.</think>The answer is 42." and r["reasoning_content"] is None


def test_mid_stream_abort_is_a_named_error(url):
    msg = [{"role": "user", "content": "count [[abort]]"}]
    with pytest.raises(RequestFailed, match="stub engine fault"):
        client.chat_completion(url, msg, temperature=0, max_tokens=32, chat_template_kwargs=OFF)
    rec = client.chat_completion(url, msg, temperature=0, max_tokens=32, chat_template_kwargs=OFF,
                                 raise_on_error=False)
    assert rec["status"] != "ok" and rec["content"] == " one two"  # two passes streamed, then the error
    full = client.chat_completion(url, msg, temperature=0, max_tokens=32, chat_template_kwargs=OFF,
                                  stream=False, raise_on_error=False)
    assert full["status"] != "ok" and full["http_status"] == 500 and "stub engine fault" in full["error"]


def test_study_estimators_match_sglang_counts(url, tmp_path):
    """06/07's per-request path (``measure.ask`` + ``request_metrics``) against SGLang's numbers:
    the spec fields from ``_calculate_spec_decoding_metrics``, the Prometheus counters from
    ``TokenizerMetricsCollector`` (by hand: +10 generation tokens, +4 verify calls)."""
    p, _, run = real_params(tmp_path)
    stage = stage_for(p, run)
    spec = measure.RequestSpec(prompt_id=measure.all_prompts()[0]["id"], repeat=0, max_tokens=64)
    row = measure.ask(stage, url, server.card_config(p), spec, launch=1)
    m = measure.request_metrics(row)
    assert row["status"] == "ok" and row["content"] == ANSWER
    assert (m["accept_len"], m["accept_rate"], m["verify_ct"], m["correct"], m["proposed"]) == (2.5, 0.625, 4, 5, 8)
    assert (m["d_gen"], m["d_verify"], m["counter_scoped"]) == (10, 4, True)
    assert m["completion_tokens"] == 10 and m["token_count"] == "per-chunk usage"
    before, after = row["metrics_before"], row["metrics_after"]
    assert after["sglang:num_requests_total"] - before["sglang:num_requests_total"] == 1
    assert after["sglang:prompt_tokens_total"] - before["sglang:prompt_tokens_total"] == row["usage"]["prompt_tokens"]


def test_other_endpoints(url):
    assert client.flush_cache(url) is True
    info = client.server_info(url)
    assert info["version"] == "0.5.23" and info["speculative_algorithm"] == "EAGLE"
    assert info["speculative_num_draft_tokens"] == 3 and info["enable_metrics"] is True
    assert client.model_info(url)["reasoning_parser"] is None
    with pytest.raises(RequestFailed):
        client._get_json(url, "/nope", 5)


@pytest.mark.parametrize("stream", [True, False])
def test_reasoning_parser_splits_thinking(parser_url, stream):
    on = client.chat_completion(parser_url, MSG, temperature=0, max_tokens=32, stream=stream,
                                return_spec_tokens_details=True)
    assert on["reasoning_content"] == "Let me think." and on["content"] == "The answer is 42."
    assert on["spec_tokens_details"] is None  # speculation off: SGLang computes no spec fields
    off = client.chat_completion(parser_url, MSG, temperature=0, max_tokens=32, stream=stream,
                                 chat_template_kwargs=OFF)
    assert off["content"] == ANSWER and not off["reasoning_content"]
    assert client.model_info(parser_url)["reasoning_parser"] == "ling3"


def test_counters_without_speculation(parser_url):
    before = client.get_metrics(parser_url)
    client.chat_completion(parser_url, MSG, temperature=0, max_tokens=32, chat_template_kwargs=OFF)
    after = client.get_metrics(parser_url)
    # a labelled Prometheus counter appears only once incremented: no verify calls, no sample
    # (the study's measure._counters reads a missing counter as 0.0)
    assert "sglang:spec_verify_calls_total" not in after
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in client.COUNTERS}
    assert d["sglang:generation_tokens_total"] == 10 and d["sglang:spec_verify_calls_total"] == 0
    assert d["sglang:num_requests_total"] == 1


def test_stages_04_06_07_collect_and_analyse(tmp_path):
    """The launch checks, the MTP sweep and the determinism collection, live: six launches of
    SGLang's real layer (card k=2, off, k=1, k=3, deterministic off and k=2), every request
    answered, then each stage's analysis. By hand for "answer" (passes [1, 3, 3, 2, 1], split
    into passes of at most draft-tokens): k=1 (2 draft tokens) -> [1, 2, 1, 2, 1, 2, 1], accept
    length 10/6, rate 3/6; k=2 -> 10/4, 5/8; k=3 (4 draft tokens) -> 10/4, 5/12."""
    from nvfp4study.core.stage import open_stage
    from nvfp4study.stages import s04_launch, s06_mtp, s07_determinism

    small = ["mtp.prompts=2", "mtp.max_tokens=24", "determinism.prompts=2", "determinism.repeats=2",
             "determinism.max_tokens=16"]
    _, pf, run = real_params(tmp_path, *small)
    for name in ("04_launch_server", "06_mtp_sweep", "07_determinism"):
        measure.collect(open_stage(name, str(pf), str(run)))
    launches = sorted((run / "data").glob("serve-launch-*.jsonl"))
    assert len(launches) == 6
    rows = [r for f in sorted((run / "data").glob("serve-raw-*.jsonl")) for r in measure.read_jsonl(f)]
    assert rows and all(r["status"] == "ok" for r in rows)
    s4 = open_stage("04_launch_server", str(pf), str(run))
    rec = [r for f in launches for r in measure.read_jsonl(f) if r["config_key"] == "clamp=exact-spec=2-det=off"][-1]
    assert s04_launch.tensor_parallel(rec) == (1, "/server_info tp_size")
    assert s04_launch.clamp_table(s4) is not None  # stock SGLang prints no clamp lines
    got = {}
    for r in rows:
        m = measure.request_metrics(r)
        if r["content"] == ANSWER and r["config"]["spec_depth"]:
            got.setdefault(r["config"]["spec_depth"], set()).add((m["accept_len"], m["accept_rate"]))
    assert got == {1: {(10 / 6, 3 / 6)}, 2: {(2.5, 0.625)}, 3: {(2.5, 5 / 12)}}
    s6 = open_stage("06_mtp_sweep", str(pf), str(run))
    for f in (s06_mtp.request_table, s06_mtp.estimator_table, s06_mtp.record_claims):
        f(s6)
    s7 = open_stage("07_determinism", str(pf), str(run))
    for f in (s07_determinism.pair_table, s07_determinism.identity_table, s07_determinism.record_claims):
        f(s7)
    assert (run / "data" / "det-identity.json").is_file() and (run / "data" / "mtp-requests.json").is_file()

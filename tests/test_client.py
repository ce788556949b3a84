"""serving/client.py against the fake SGLang server speaking 0.5.23's streaming protocol."""

from __future__ import annotations

import pytest

from fake_sglang import WORDS
from nvfp4study.core.errors import RequestFailed, ResponseMissingFields, StreamCut
from nvfp4study.serving import client, server
from serving_fixtures import fake_params, free_port, no_leftover, stage_for  # noqa: F401

pytestmark = pytest.mark.usefixtures("no_leftover")
MSG = [{"role": "user", "content": "Write binary search."}]


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    p, _, run = fake_params(tmp_path_factory.mktemp("client"))
    with server.serving(stage_for(p, run), server.card_config(p)) as u:
        yield u


def test_streamed_record(url):
    r = client.chat_completion(url, MSG, temperature=0.0, max_tokens=24, chat_template_kwargs={"enable_thinking": False},
                               return_spec_tokens_details=True, return_output_ids=True, keep_sse=True)
    assert r["status"] == "ok" and r["done"] and r["error"] is None and r["http_status"] == 200
    assert r["request"]["max_completion_tokens"] == 24 and r["request"]["temperature"] == 0.0
    assert r["request"]["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert r["request"]["chat_template_kwargs"] == {"enable_thinking": False}
    ids = r["output_ids"]
    assert len(ids) == r["usage"]["completion_tokens"] == 24
    assert r["content"] == "".join(" " + WORDS[t] for t in ids)  # the text is the token ids' words
    assert r["finish_reason"] == "length" and r["reasoning_content"] is None
    kinds = [c["kind"] for c in r["chunks"]]
    assert kinds[0] == "role" and kinds[-3:] == ["finish", "sglext", "usage"]
    assert set(kinds[1:-3]) == {"content"}
    times = [c["t"] for c in r["chunks"]]
    assert times == sorted(times) and r["ttft_s"] == r["chunks"][1]["t"] and r["end_s"] >= times[-1]
    toks = [c["tokens"] for c in r["chunks"] if c["kind"] == "content"]
    assert toks == sorted(toks) and toks[-1] == 24
    assert sum(c["chars"] for c in r["chunks"]) == len(r["content"])
    s = r["spec_tokens_details"]
    assert set(s) == {"spec_accept_rate", "spec_accept_length", "spec_cap_length", "spec_block_accept_length",
                      "spec_num_correct_drafts", "spec_num_proposed_drafts", "spec_verify_ct",
                      "spec_correct_drafts_histogram", "spec_cap_lens_histogram"}
    assert s["spec_accept_length"] == pytest.approx(24 / s["spec_verify_ct"])
    assert s["spec_num_proposed_drafts"] == s["spec_verify_ct"] * 2  # 3 draft tokens - 1
    assert r["sse"][-1][1] == "[DONE]" and len(r["sse"]) == len(r["chunks"]) + 1


def test_non_streamed_matches_streamed(url):
    a = client.chat_completion(url, MSG, temperature=0, max_tokens=16)
    b = client.chat_completion(url, MSG, temperature=0, max_tokens=16, stream=False)
    assert b["status"] == "ok" and b["content"] == a["content"] and b["chunks"] == [] and b["ttft_s"] is None
    assert b["usage"]["completion_tokens"] == 16


@pytest.mark.parametrize("marker,error,match", [
    ("cut=3", StreamCut, "incomplete chunked read"),
    ("nodone", StreamCut, r"before data: \[DONE\]"),
    ("nousage", ResponseMissingFields, "usage.completion_tokens"),
    ("nofinish", ResponseMissingFields, "finish_reason"),
    ("errorchunk", RequestFailed, "Generation aborted"),
    ("http500", RequestFailed, "HTTP 500"),
])
def test_faults_are_named_errors_with_the_record(url, marker, error, match):
    msg = [{"role": "user", "content": f"hi [[fake:{marker}]]"}]
    with pytest.raises(error, match=match) as e:
        client.chat_completion(url, msg, temperature=0, max_tokens=20)
    assert "--- server log, last lines ---" in str(e.value)  # the log tail rides along
    rec = client.chat_completion(url, msg, temperature=0, max_tokens=20, raise_on_error=False)
    assert rec["status"] != "ok" and rec is not None and rec["error"]
    if marker == "cut=3":
        assert rec["content"] and not rec["done"] and rec["usage"] is None


def test_missing_spec_details_and_output_ids(url):
    r = client.chat_completion(url, MSG, temperature=0, max_tokens=8, expect_spec_details=True, raise_on_error=False)
    assert r["status"] == "missing_fields" and "sglext.spec_tokens_details" in r["error"]


def test_overall_timeout(url):
    r = client.chat_completion(url, MSG, temperature=0, max_tokens=3000, timeout=0.3, raise_on_error=False)
    assert r["status"] == "timeout"


def test_connection_refused():
    port = free_port()
    with pytest.raises(RequestFailed, match="connection_error"):
        client.chat_completion(f"http://127.0.0.1:{port}", MSG, temperature=0, max_tokens=4, timeout=5)


def test_metrics_counters_move_by_our_tokens(url):
    before = client.get_metrics(url)
    r = client.chat_completion(url, MSG, temperature=0, max_tokens=10, return_spec_tokens_details=True)
    after = client.get_metrics(url)
    d = {k: after[k] - before[k] for k in client.COUNTERS}
    assert d["sglang:generation_tokens_total"] == 10 and d["sglang:num_requests_total"] == 1
    assert d["sglang:spec_verify_calls_total"] == r["spec_tokens_details"]["spec_verify_ct"]


def test_parse_metrics_by_hand():
    text = """# HELP sglang:generation_tokens Number of generation tokens processed.
# TYPE sglang:generation_tokens counter
sglang:generation_tokens_total{model_name="m",is_streaming="true"} 120.0
sglang:generation_tokens_total{model_name="m",is_streaming="false"} 30.0
# HELP sglang:e2e_request_latency_seconds x
# TYPE sglang:e2e_request_latency_seconds histogram
sglang:e2e_request_latency_seconds_bucket{le="1.0",model_name="m"} 2.0
sglang:e2e_request_latency_seconds_bucket{le="+Inf",model_name="m"} 5.0
sglang:e2e_request_latency_seconds_count{model_name="m"} 5.0
sglang:e2e_request_latency_seconds_sum{model_name="m"} 7.5
"""
    m = client.parse_metrics(text)
    assert m == {"sglang:generation_tokens_total": 150.0, "sglang:e2e_request_latency_seconds_count": 5.0,
                 "sglang:e2e_request_latency_seconds_sum": 7.5}


def test_other_endpoints(url):
    assert client.flush_cache(url) is True
    info = client.server_info(url)
    assert info["version"] == "0.5.23" and info["speculative_algorithm"] == "EAGLE"
    assert "avg_spec_accept_length" in info["internal_states"][0]
    assert client.model_info(url)["reasoning_parser"] is None
    with pytest.raises(RequestFailed):
        client._get_json(url, "/nope", 5)

"""``tests/fake_sglang.py`` (kept for faults SGLang's real layer cannot produce) compared field by
field with SGLang 0.5.23's real HTTP layer (``tests/real_sglang``) for the same answer, so the
two cannot drift apart silently: the same JSON shape (keys, nesting, JSON types) for the
non-streamed body and for every kind of streamed chunk, and the same text, finish reason and
token count."""

from __future__ import annotations

import json

import httpx
import pytest

from nvfp4study.serving import server
from real_sglang_fixtures import real_params
from serving_fixtures import fake_params, no_leftover, stage_for  # noqa: F401

pytestmark = [pytest.mark.real_sglang, pytest.mark.usefixtures("no_leftover")]
ANSWER = " The answer is forty-two, said the fox."  # tests/real_sglang/outputs.json "answer"
BODY = {"model": "default", "messages": [{"role": "user", "content": "What is the answer?"}],
        "max_tokens": 32, "temperature": 0, "chat_template_kwargs": {"enable_thinking": False},
        "return_spec_tokens_details": True, "return_output_ids_in_sglext": True}


def shape(v):
    """Keys and JSON types, recursively (a list by its first item)."""
    if isinstance(v, dict):
        return {k: shape(x) for k, x in sorted(v.items())}
    if isinstance(v, list):
        return [shape(v[0])] if v else []
    return "number" if isinstance(v, int | float) and not isinstance(v, bool) else type(v).__name__


def kind(chunk: dict) -> str:
    if not chunk.get("choices"):
        return "sglext" if "sglext" in chunk else "usage"
    c = chunk["choices"][0]
    return "finish" if c.get("finish_reason") else "role" if "role" in c["delta"] else "content"


def exchange(url: str) -> dict:
    full = httpx.post(url + "/v1/chat/completions", json=BODY, timeout=30).json()
    chunks = []
    with httpx.stream("POST", url + "/v1/chat/completions", timeout=30, json={
            **BODY, "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    by_kind = {}
    for c in chunks:
        by_kind.setdefault(kind(c), shape(c))
    return {"full": full, "full_shape": shape(full), "chunks": by_kind,
            "text": "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices"))}


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    p, _, run = real_params(tmp_path_factory.mktemp("real"))
    with server.serving(stage_for(p, run), server.card_config(p)) as u:
        real = exchange(u)
    fp, _, frun = fake_params(tmp_path_factory.mktemp("fake"),
                              fake={"replies": [{"mode": None, "match": "answer", "content": ANSWER}]})
    with server.serving(stage_for(fp, frun), server.card_config(fp)) as u:
        fake = exchange(u)
    return real, fake


def test_same_answer(both):
    real, fake = both
    for side in (real, fake):
        assert side["full"]["choices"][0]["message"]["content"] == ANSWER == side["text"]
        assert side["full"]["choices"][0]["finish_reason"] == "stop"
    assert real["full"]["usage"]["completion_tokens"] == 10


def test_non_streamed_body_has_the_real_shape(both):
    real, fake = both
    assert fake["full_shape"] == real["full_shape"]


@pytest.mark.parametrize("k", ["role", "content", "finish", "sglext", "usage"])
def test_streamed_chunks_have_the_real_shape(both, k):
    real, fake = both
    assert fake["chunks"][k] == real["chunks"][k]

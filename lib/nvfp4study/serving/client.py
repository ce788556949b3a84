"""HTTP client for SGLang 0.5.23's OpenAI-compatible endpoints, keeping the raw record.

``chat_completion`` streams ``POST /v1/chat/completions`` (SSE) and returns one JSON-able record
per request: the request body, the text, finish reason, usage, ``sglext.spec_tokens_details``,
the output token ids, and every chunk's arrival time on a monotonic clock (seconds since the
request was sent). Chunk order in 0.5.23 (``entrypoints/openai/serving_chat.py`` 2441-2805): a
role chunk, text chunks (each with ``usage`` when ``stream_options.continuous_usage_stats``),
a finish chunk, then ``choices: []`` chunks carrying ``sglext`` (spec details, output ids; only
for finished requests) and ``usage`` (when ``include_usage``), then ``data: [DONE]``. An error
mid-stream is a chunk ``{"error": {...}}`` (``serving_base.py`` 223-237).

A failed request is a record with ``status`` and ``error`` (never a placeholder text); with
``raise_on_error`` the matching named error is raised with the record attached (``.record``)
and the server log's tail when the server was started by :func:`nvfp4study.serving.server.serving`.
"""

from __future__ import annotations

import datetime as _dt
import json
import time
from typing import Any

import httpx

from ..core.errors import RequestFailed, ResponseMissingFields, ServerError, StreamCut
from ..core.kinds import RequestStatus
from .process import process_for
from .transport import http

RECORD_SCHEMA = "nvfp4study.chat-record/1"
# Prometheus samples the MTP study snapshots around each request (metrics_collector.py 1855-1869).
COUNTERS = ("sglang:generation_tokens_total", "sglang:spec_verify_calls_total",
            "sglang:prompt_tokens_total", "sglang:num_requests_total")


def _error(kind: type[ServerError], message: str, base_url: str, record: dict | None) -> ServerError:
    sp = process_for(base_url)
    exc = kind(message, log=sp.log_path if sp else None, log_tail=sp.tail() if sp else "")
    exc.record = record  # type: ignore[attr-defined]
    return exc


_STATUS_ERRORS: dict[RequestStatus, type[ServerError]] = {
    RequestStatus.STREAM_CUT: StreamCut, RequestStatus.MISSING_FIELDS: ResponseMissingFields,
    RequestStatus.HTTP_ERROR: RequestFailed, RequestStatus.ERROR_CHUNK: RequestFailed,
    RequestStatus.TIMEOUT: RequestFailed, RequestStatus.CONNECTION_ERROR: RequestFailed,
}


def raise_for_record(record: dict, base_url: str | None = None) -> None:
    """Raise the named error matching a record's ``status`` (no-op when ``"ok"``)."""
    status = record.get("status")
    if status == RequestStatus.OK:
        return
    kind = _STATUS_ERRORS.get(status, RequestFailed)
    raise _error(kind, f"{status}: {record.get('error')}", base_url or record.get("base_url", ""), record)


def chat_completion(
    base_url: str,
    messages: list[dict[str, Any]],
    *,
    temperature: float,
    top_p: float = 1.0,
    top_k: int = -1,
    max_tokens: int,
    chat_template_kwargs: dict[str, Any] | None = None,
    stream: bool = True,
    return_spec_tokens_details: bool = False,
    timeout: float = 600,
    return_output_ids: bool = False,
    expect_spec_details: bool = False,
    extra_body: dict[str, Any] | None = None,
    raise_on_error: bool = True,
    keep_sse: bool = False,
) -> dict[str, Any]:
    """One chat completion; returns the raw record (see the module docstring).

    Args:
        base_url: ``http://host:port`` of the server.
        messages: OpenAI chat messages.
        temperature, top_p, top_k: sampling (``top_k=-1`` = off); temperature is always sent
            because 0.5.23 falls back to the model's preferred value when it is absent.
        max_tokens: sent as ``max_completion_tokens`` (``max_tokens`` is deprecated in 0.5.23).
        chat_template_kwargs: e.g. ``{"enable_thinking": False}``.
        stream: SSE streaming (timings per chunk) or one JSON response (end time only).
        return_spec_tokens_details: ask for ``sglext.spec_tokens_details``.
        timeout: seconds; the read timeout between bytes and the limit for the whole request.
        return_output_ids: ask for ``sglext.output_ids`` (token ids: exact divergence indices).
        expect_spec_details: a response without spec details counts as ``missing_fields``.
        extra_body: more request fields (e.g. ``rid``, ``ignore_eos``).
        raise_on_error: raise the named error (``StreamCut``, ``ResponseMissingFields``,
            ``RequestFailed``) instead of returning a failed record.
        keep_sse: also store every raw ``data:`` payload in ``record["sse"]``.

    Returns:
        dict with ``request``, ``status`` ("ok", "http_error", "error_chunk", "stream_cut",
        "missing_fields", "timeout", "connection_error"), ``error``, ``http_status``, ``id``,
        ``content``, ``reasoning_content``, ``finish_reason``, ``usage``, ``spec_tokens_details``,
        ``output_ids``, ``chunks`` (``[{"t": s, "kind": str, "chars": int, "tokens": int|None}]``),
        ``ttft_s``, ``end_s`` (seconds since send, monotonic), ``done``, ``t_wall`` (UTC ISO).
    """
    body: dict[str, Any] = {
        "model": "default", "messages": messages, "temperature": temperature, "top_p": top_p,
        "top_k": top_k, "max_completion_tokens": max_tokens, "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    if chat_template_kwargs is not None:
        body["chat_template_kwargs"] = chat_template_kwargs
    if return_spec_tokens_details:
        body["return_spec_tokens_details"] = True
    if return_output_ids:
        body["return_output_ids_in_sglext"] = True
    body.update(extra_body or {})
    base_url = base_url.rstrip("/")
    rec: dict[str, Any] = {
        "schema": RECORD_SCHEMA, "base_url": base_url, "request": body, "status": RequestStatus.OK, "error": None,
        "http_status": None, "id": None, "content": None, "reasoning_content": None,
        "finish_reason": None, "matched_stop": None, "usage": None, "spec_tokens_details": None,
        "output_ids": None, "chunks": [], "ttft_s": None, "end_s": None, "done": False,
        "t_wall": _dt.datetime.now(_dt.UTC).isoformat(timespec="milliseconds"),
    }
    if keep_sse:
        rec["sse"] = []
    t0 = time.monotonic()
    tmo = httpx.Timeout(timeout, connect=min(30.0, timeout))
    try:
        with http(tmo) as session:
            if stream:
                _stream(session, base_url, body, rec, t0, timeout)
            else:
                r = session.post(base_url + "/v1/chat/completions", json=body)
                rec["http_status"] = r.status_code
                rec["end_s"] = time.monotonic() - t0
                if r.status_code != 200:
                    rec.update(status=RequestStatus.HTTP_ERROR, error=f"HTTP {r.status_code}: {r.text[:500]}")
                else:
                    _absorb_full(r.json(), rec)
                    rec["done"] = True
    except httpx.TimeoutException as exc:
        rec.update(status=RequestStatus.TIMEOUT, error=f"{type(exc).__name__}: no data within {timeout} s")
    except httpx.ConnectError as exc:
        rec.update(status=RequestStatus.CONNECTION_ERROR, error=f"{type(exc).__name__}: {exc}")
    except (httpx.RemoteProtocolError, httpx.ReadError) as exc:
        rec.update(status=RequestStatus.STREAM_CUT, error=f"{type(exc).__name__}: {exc}")
    except _Overdue:
        rec.update(status=RequestStatus.TIMEOUT, error=f"request exceeded {timeout} s")
    if rec["end_s"] is None:
        rec["end_s"] = time.monotonic() - t0
    if rec["status"] == RequestStatus.OK:
        _check_complete(rec, stream, expect_spec_details)
    if raise_on_error:
        raise_for_record(rec, base_url)
    return rec


class _Overdue(Exception):
    pass


def _stream(session: httpx.Client, base_url: str, body: dict, rec: dict, t0: float, timeout: float) -> None:
    with session.stream("POST", base_url + "/v1/chat/completions", json=body) as r:
        rec["http_status"] = r.status_code
        if r.status_code != 200:
            rec.update(status=RequestStatus.HTTP_ERROR, error=f"HTTP {r.status_code}: {r.read().decode(errors='replace')[:500]}")
            return
        data: list[str] = []
        for line in r.iter_lines():
            if time.monotonic() - t0 > timeout:
                raise _Overdue
            if line.startswith("data:"):
                data.append(line[5:].lstrip(" "))
                continue
            if line.strip() or not data:
                continue  # "event:", comments, or a blank line with nothing pending
            payload, data = "\n".join(data), []
            t = time.monotonic() - t0
            if "sse" in rec:
                rec["sse"].append([round(t, 6), payload])
            if payload == "[DONE]":
                rec["done"], rec["end_s"] = True, t
                return
            if not _absorb_chunk(payload, rec, t):
                return
        # the body ended without "data: [DONE]"
        if data and "sse" in rec:
            rec["sse"].append([round(time.monotonic() - t0, 6), "\n".join(data)])
        rec.update(status=RequestStatus.STREAM_CUT, error="stream ended before data: [DONE]")


def _absorb_chunk(payload: str, rec: dict, t: float) -> bool:
    """Fold one SSE JSON payload into the record. False stops reading (an error chunk)."""
    try:
        obj = json.loads(payload)
    except json.JSONDecodeError:
        rec.update(status=RequestStatus.STREAM_CUT, error=f"unparsable chunk: {payload[:200]!r}")
        return False
    if "error" in obj:
        err = obj["error"]
        rec.update(status=RequestStatus.ERROR_CHUNK, error=f"{err.get('type')} {err.get('code')}: {err.get('message')}"
                   if isinstance(err, dict) else str(err))
        return False
    rec["id"] = rec["id"] or obj.get("id")
    kind, chars = "empty", 0
    usage = obj.get("usage")
    for ch in obj.get("choices") or []:
        if ch.get("index", 0) != 0:
            continue
        delta = ch.get("delta") or {}
        c, rc = delta.get("content"), delta.get("reasoning_content")
        if c:
            rec["content"] = (rec["content"] or "") + c
            kind, chars = "content", chars + len(c)
        elif c is not None and rec["content"] is None:
            rec["content"] = ""
        if rc:
            rec["reasoning_content"] = (rec["reasoning_content"] or "") + rc
            kind, chars = ("content" if kind == "content" else "reasoning"), chars + len(rc)
        if delta.get("role") and kind == "empty":
            kind = "role"
        if ch.get("finish_reason"):
            rec["finish_reason"], rec["matched_stop"] = ch["finish_reason"], ch.get("matched_stop")
            kind = "finish" if kind == "empty" else kind
    if not obj.get("choices"):
        ext = obj.get("sglext") or {}
        if ext:
            kind = "sglext"
            if "spec_tokens_details" in ext:
                rec["spec_tokens_details"] = ext["spec_tokens_details"]
            if ext.get("output_ids"):
                rec["output_ids"] = ext["output_ids"][0]
        if usage:
            kind = "usage" if kind == "empty" else kind
            rec["usage"] = usage
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    rec["chunks"].append({"t": round(t, 6), "kind": kind, "chars": chars, "tokens": tokens})
    if kind in ("content", "reasoning") and rec["ttft_s"] is None:
        rec["ttft_s"] = round(t, 6)
    return True


def _absorb_full(obj: dict, rec: dict) -> None:
    rec["id"] = obj.get("id")
    choices = obj.get("choices") or []
    if choices:
        msg = choices[0].get("message") or {}
        rec["content"], rec["reasoning_content"] = msg.get("content"), msg.get("reasoning_content")
        rec["finish_reason"], rec["matched_stop"] = choices[0].get("finish_reason"), choices[0].get("matched_stop")
    rec["usage"] = obj.get("usage")
    ext = obj.get("sglext") or {}
    rec["spec_tokens_details"] = ext.get("spec_tokens_details")
    if ext.get("output_ids"):
        rec["output_ids"] = ext["output_ids"][0]


def _check_complete(rec: dict, stream: bool, expect_spec: bool) -> None:
    missing = []
    if rec["content"] is None and rec["reasoning_content"] is None:
        missing.append("content")
    if not rec["finish_reason"]:
        missing.append("finish_reason")
    if not isinstance(rec["usage"], dict) or "completion_tokens" not in rec["usage"]:
        missing.append("usage.completion_tokens")
    if expect_spec and not rec["spec_tokens_details"]:
        missing.append("sglext.spec_tokens_details")
    if rec["request"].get("return_output_ids_in_sglext") and rec["output_ids"] is None:
        missing.append("sglext.output_ids")
    if missing:
        rec.update(status=RequestStatus.MISSING_FIELDS, error="response lacks " + ", ".join(missing))


# --- other endpoints -------------------------------------------------------------------------
def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> ``{sample name: value summed over label sets}`` (bucket samples dropped).

    Parsed with ``prometheus_client.parser.text_string_to_metric_families``. Sums are meaningful
    for counters (``..._total``) and histogram ``_count``/``_sum``; a gauge reported by several
    processes also comes back summed.
    """
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if "le" in s.labels or "quantile" in s.labels:
                continue
            out[s.name] = out.get(s.name, 0.0) + float(s.value)
    return out


def get_metrics(base_url: str, timeout: float = 30) -> dict[str, float]:
    """``GET /metrics`` (needs ``--enable-metrics``) parsed by :func:`parse_metrics`.

    Raises:
        RequestFailed: non-200 (metrics off) or no connection.
    """
    try:
        with http(timeout) as session:
            r = session.get(base_url.rstrip("/") + "/metrics")
    except httpx.HTTPError as exc:
        raise _error(RequestFailed, f"/metrics: {type(exc).__name__}: {exc}", base_url, None) from None
    if r.status_code != 200:
        raise _error(RequestFailed, f"/metrics answered HTTP {r.status_code} (is --enable-metrics set?)",
                     base_url, None)
    return parse_metrics(r.text)


def _get_json(base_url: str, path: str, timeout: float) -> dict[str, Any]:
    try:
        with http(timeout) as session:
            r = session.get(base_url.rstrip("/") + path)
        r.raise_for_status()
        return r.json()
    except (httpx.HTTPError, ValueError) as exc:
        raise _error(RequestFailed, f"{path}: {type(exc).__name__}: {exc}", base_url, None) from None


def server_info(base_url: str, timeout: float = 30) -> dict[str, Any]:
    """``GET /server_info``: resolved server args, ``version``, ``internal_states``."""
    return _get_json(base_url, "/server_info", timeout)


def model_info(base_url: str, timeout: float = 30) -> dict[str, Any]:
    """``GET /model_info``: model path, ``reasoning_parser``, ``tool_call_parser``, architectures."""
    return _get_json(base_url, "/model_info", timeout)


def flush_cache(base_url: str, timeout: float = 60) -> bool:
    """``POST /flush_cache``; True when flushed (0.5.23 answers 400 while requests are running)."""
    try:
        with http(timeout) as session:
            r = session.post(base_url.rstrip("/") + "/flush_cache")
    except httpx.HTTPError as exc:
        raise _error(RequestFailed, f"/flush_cache: {type(exc).__name__}: {exc}", base_url, None) from None
    return r.status_code == 200


def generate(base_url: str, input_ids: list[int], *, max_new_tokens: int, stop: list[str] | None = None,
             logprob_start_len: int | None = None, timeout: float = 300) -> dict[str, Any]:
    """``POST /generate`` (SGLang's native endpoint, ``entrypoints/http_server.py`` 928) with token
    ids, greedy (temperature 0), asking for logprobs (the generated token ids come from
    ``meta_info.output_token_logprobs``, ``[logprob, token id, None]`` each). With
    ``logprob_start_len`` the response's ``meta_info.input_token_logprobs`` holds the logprob of
    every input token from that position on (the first is None at position 0): teacher-forced
    scoring; without it only the last input token's (SGLang's minimum).

    Returns:
        ``{"text", "output_ids", "output_logprobs", "finish_reason", "completion_tokens",
        "input_token_logprobs"}``.

    Raises:
        RequestFailed: a transport error, a non-200 answer or a body without ``text``/``meta_info``.
    """
    body: dict[str, Any] = {"input_ids": list(map(int, input_ids)),
                            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0,
                                                **({"stop": list(stop)} if stop else {})}}
    start = len(input_ids) - 1 if logprob_start_len is None else int(logprob_start_len)
    body.update(return_logprob=True, logprob_start_len=max(0, start))
    try:
        with http(timeout) as session:
            r = session.post(base_url.rstrip("/") + "/generate", json=body)
        obj = r.json() if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError) as exc:
        raise _error(RequestFailed, f"/generate: {type(exc).__name__}: {exc}", base_url, None) from None
    if not isinstance(obj, dict) or "text" not in obj or not isinstance(obj.get("meta_info"), dict):
        raise _error(RequestFailed, f"/generate answered HTTP {r.status_code}: {r.text[:300]}", base_url, None)
    meta = obj["meta_info"]
    out_lp = meta.get("output_token_logprobs") or []
    return {"text": obj["text"], "output_ids": [int(x[1]) for x in out_lp],
            "output_logprobs": [x[0] for x in out_lp],
            "finish_reason": (meta.get("finish_reason") or {}).get("type"),
            "completion_tokens": meta.get("completion_tokens"),
            "input_token_logprobs": ([x[0] for x in meta.get("input_token_logprobs") or []]
                                     if logprob_start_len is not None else [])}

"""Per-request numbers shared by stages 06 and 07, from one raw row of ``data/serve-raw-*.jsonl``:
timing, acceptance and counter deltas (:func:`request_metrics`), and byte/token identity of two
outputs (:func:`compare_outputs`). Pure functions; :mod:`nvfp4study.serving.measure` re-exports them.
"""

from __future__ import annotations

from typing import Any


def request_metrics(row: dict[str, Any]) -> dict[str, Any]:
    """Timing, acceptance and counter deltas of one raw row (one request).

    Definitions (all times on the client's monotonic clock, seconds since the request was sent):

    - ``ttft_s``: arrival of the first chunk carrying text (content or reasoning).
    - ``decode_tok_s``: tokens after the first text chunk / time from the first to the last text
      chunk; token counts are the cumulative ``usage.completion_tokens`` each chunk carries
      (``continuous_usage_stats``), else ``completion_tokens - 1`` over the same interval
      (``token_count`` says which). Excludes TTFT (prefill).
    - ``e2e_tok_s``: ``completion_tokens / end_s`` (``end_s`` = arrival of ``data: [DONE]``).
    - ``accept_len`` / ``accept_rate``: the server's per-request ``spec_accept_length``
      (completion tokens / verify passes, bonus token included) and ``spec_accept_rate``
      (correct / proposed drafts) (``managers/tokenizer_manager.py`` 3138-3172).
    - ``d_gen`` / ``d_verify``: ``sglang:generation_tokens_total`` and
      ``sglang:spec_verify_calls_total`` after minus before this request; ``counter_scoped`` is
      True when ``d_gen`` equals this request's completion tokens (no other traffic counted).
    """
    ok = row.get("status") == "ok"
    usage = row.get("usage") or {}
    n = usage.get("completion_tokens") if ok else None
    text = [c for c in row.get("chunks") or [] if c.get("kind") in ("content", "reasoning")]
    out: dict[str, Any] = {"status": row.get("status"), "completion_tokens": n,
                           "ttft_s": row.get("ttft_s"), "end_s": row.get("end_s") if ok else None,
                           "decode_tok_s": None, "e2e_tok_s": None, "token_count": None}
    if ok and len(text) >= 2:
        first, last = text[0], text[-1]
        if first.get("tokens") is not None and last.get("tokens") is not None:
            dtok, out["token_count"] = last["tokens"] - first["tokens"], "per-chunk usage"
        else:
            dtok, out["token_count"] = (n or 0) - 1, "completion_tokens - 1"
        dt = last["t"] - first["t"]
        out["decode_tok_s"] = dtok / dt if dt > 0 and dtok > 0 else None
    if ok and n and row.get("end_s"):
        out["e2e_tok_s"] = n / row["end_s"]
    spec = row.get("spec_tokens_details") or {}
    out.update(accept_len=spec.get("spec_accept_length"), accept_rate=spec.get("spec_accept_rate"),
               verify_ct=spec.get("spec_verify_ct"), correct=spec.get("spec_num_correct_drafts"),
               proposed=spec.get("spec_num_proposed_drafts"))
    b, a = row.get("metrics_before"), row.get("metrics_after")
    if ok and b and a:
        out["d_gen"] = a["sglang:generation_tokens_total"] - b["sglang:generation_tokens_total"]
        out["d_verify"] = a["sglang:spec_verify_calls_total"] - b["sglang:spec_verify_calls_total"]
        out["counter_scoped"] = out["d_gen"] == n
    else:
        out.update(d_gen=None, d_verify=None, counter_scoped=None)
    return out


def compare_outputs(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Byte/token identity of two recorded outputs, lengths first (Spec-Bench's ``zip`` check
    lets a truncated text pass), then the first position that differs.

    Token ids (``output_ids``) are compared when both rows have them, else the text
    (``reasoning_content`` + ``content``) character by character.

    Returns:
        ``{"comparable", "identical", "unit" ("token"/"char"), "len_a", "len_b", "first_divergence"}``;
        ``first_divergence`` is None when identical, the shorter length when one is a prefix.
    """
    if a.get("status") != "ok" or b.get("status") != "ok":
        return {"comparable": False, "identical": None, "unit": None, "len_a": None, "len_b": None,
                "first_divergence": None}
    if a.get("output_ids") is not None and b.get("output_ids") is not None:
        x, y, unit = list(a["output_ids"]), list(b["output_ids"]), "token"
    else:
        x = (a.get("reasoning_content") or "") + (a.get("content") or "")
        y = (b.get("reasoning_content") or "") + (b.get("content") or "")
        unit = "char"
    same_len = len(x) == len(y)
    div = next((i for i, (p, q) in enumerate(zip(x, y, strict=False)) if p != q), None)
    if div is None and not same_len:
        div = min(len(x), len(y))
    return {"comparable": True, "identical": same_len and div is None, "unit": unit, "len_a": len(x),
            "len_b": len(y), "first_divergence": div}

"""SGLang's server log, read in one place: every kind of line the study takes from it.

SGLang 0.5.23's logger prefix is ``[%Y-%m-%d %H:%M:%S(.ms) (DP/TP/EP ranks)]`` (``utils/common.py``
2629-2636, local time). The lines read, each with its source:

- **Clamp lines** (04, :func:`parse_clamp_lines`): the card's form ``[swiglu-clamp-patch] cutlass
  nvfp4 limit=4`` (no layer index) and the study's patch forms (``patches/0.5.23/exact``: ``...
  limit=4 mode=exact form=SwigluStep layer=35``; ``none``: ``limit=None mode=none config_limit=4
  layer=35``).
- **Load lines** (04, :func:`parse_load_lines`): ``Load weight end. elapsed=X s, type=T, ..., mem
  usage=Y GB.`` (``model_executor/model_runner.py`` 1371-1379; SGLang's "GB" is GiB).
- **Warnings** (04, :func:`find_warnings`): :data:`WARNINGS`, e.g. ``w1_weight_global_scale must
  match w3_weight_global_scale`` (``compressed_tensors_w4a4_nvfp4_moe.py`` 188-194) and
  ``Auto-detected --reasoning-parser as '...'`` (``parser/template_detection.py`` 886-890).
- **Decode lines** (06, :func:`parse_line` / :func:`parse_log`): ``Decode batch, #running-req: N,
  ...`` (``srt/managers/scheduler_components/metrics_reporter.py`` 963-1043; the fields and
  their meaning: :mod:`nvfp4study.serving.decode_log`).
- **Refusals** (04-07, :func:`refusal_message`): the last ``SomeError: message`` line, the
  exception that ended a launch SGLang refused; and for any failed launch, the log's traceback or
  error lines and its tail (:func:`log_tail`, in the named serving errors).

Every reader takes text (or a path, read with undecodable bytes replaced) and returns plain rows;
what the rows mean is decided by the stage or wing that reads them.
"""

from __future__ import annotations

import datetime as _dt
import re
from pathlib import Path
from typing import Any


def read_log(path: Path) -> str:
    """A server log's text (undecodable bytes replaced: a log may end mid-character)."""
    return Path(path).read_text(errors="replace")


# --- clamp, load and warning lines (04) ----------------------------------------------------------
CLAMP_TAG = "[swiglu-clamp-patch]"
_RANK = re.compile(r"^\[[^\]]*?\b((?:TP|DP|EP|PP)\d+(?:\s+(?:TP|DP|EP|PP)\d+)*)\]")
_KV = re.compile(r"(\w+)=(\S+)")
_LOAD_END = re.compile(r"Load weight end\. elapsed=(?P<elapsed>[\d.]+) s, type=(?P<type>\w+),.*?"
                       r"mem usage=(?P<mem>[\d.]+) GB")
WARNINGS = {
    "gate/up global scales differ": re.compile(r"w1_weight_global_scale must match w3_weight_global_scale"),
    "reasoning parser auto-detected": re.compile(r"Auto-detected --reasoning-parser as '([^']+)'"),
    "NVFP4 refused (not Blackwell)": re.compile(r"does not support NVFP4"),
    "DeepGEMM failure (MIN_DEEPGEMM_DIM)": re.compile(r"DeepGEMM failed for matrix shapes"),
    "traceback": re.compile(r"^Traceback \(most recent call last\)"),
    "out of memory": re.compile(r"out of memory", re.I),
}



def _num(v: str) -> float | None:
    if v in ("None", "none", "null", "0", "0.0"):
        return None if v in ("None", "none", "null") else 0.0
    try:
        return float(v)
    except ValueError:
        return None


def parse_clamp_lines(text: str) -> list[dict[str, Any]]:
    """Every clamp log line: ``rank`` (e.g. "TP0" or ""), ``order`` (per rank), ``path`` (words
    before the first ``key=value``), ``limit`` (float or None), ``mode``, ``layer`` (int or None)."""
    out, order = [], {}
    for line in text.splitlines():
        i = line.find(CLAMP_TAG)
        if i < 0:
            continue
        m = _RANK.match(line)
        rank = m.group(1) if m else ""
        body = line[i + len(CLAMP_TAG):].strip()
        kv = dict(_KV.findall(body))
        first = _KV.search(body)
        path = (body[:first.start()] if first else body).strip() or kv.get("path", "")
        layer = kv.get("layer", kv.get("layer_id"))
        n = order.get(rank, 0)
        order[rank] = n + 1
        out.append({"rank": rank, "order": n, "path": kv.get("path", path), "limit": _num(kv.get("limit", "None")),
                    "mode": kv.get("mode"), "form": kv.get("form"),
                    "config_limit": _num(kv["config_limit"]) if "config_limit" in kv else None,
                    "layer": int(layer) if layer and layer.isdigit() else None, "line": line.strip()})
    return out


def parse_load_lines(text: str) -> list[dict[str, Any]]:
    """``Load weight end`` lines: ``type``, ``elapsed_s``, ``mem_gib`` (SGLang's "GB"), ``rank``."""
    out = []
    for line in text.splitlines():
        m = _LOAD_END.search(line)
        if m:
            r = _RANK.match(line)
            out.append({"rank": r.group(1) if r else "", "type": m["type"], "elapsed_s": float(m["elapsed"]),
                        "mem_gib": float(m["mem"])})
    return out


def find_warnings(text: str, model_info: dict | None = None) -> list[dict[str, Any]]:
    """Warnings worth surfacing: kind, count, first matching line (and the active parser)."""
    rows = []
    lines = text.splitlines()
    for kind, rx in WARNINGS.items():
        hits = [ln for ln in lines if rx.search(ln)]
        if hits:
            rows.append({"warning": kind, "count": len(hits), "first line": hits[0].strip()[:200]})
    rp = (model_info or {}).get("reasoning_parser")
    if rp:
        rows.append({"warning": "reasoning parser active", "count": 1,
                     "first line": f"/model_info reasoning_parser={rp!r}: with enable_thinking false the "
                                   "answer can land in reasoning_content"})
    return rows


# --- decode lines (06) -------------------------------------------------------------------------
LINE_RE = re.compile(r"\[(?P<time>\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})(?P<ms>\.\d{3})?(?P<ranks>[^\]]*)\]\s+"
                     r"Decode batch(?: \[\d+\])?, (?P<body>.*)$")
FIELDS = {  # log key -> our name and type
    "#running-req": ("running_req", int), "#token": ("tokens", int), "token usage": ("token_usage", float),
    "#full token": ("tokens", int), "full token usage": ("token_usage", float),
    "accept len": ("accept_len", float), "accept rate": ("accept_rate", float), "cap len": ("cap_len", float),
    "cuda graph": ("cuda_graph", lambda v: v == "True"), "gen throughput (token/s)": ("gen_tok_s", float),
    "#queue-req": ("queue_req", int),
}
def parse_line(line: str) -> dict[str, Any] | None:
    """One ``Decode batch`` line as ``{"time": datetime (naive, the log's local time), "ranks",
    "running_req", "tokens", "token_usage", "accept_len"?, "accept_rate"?, "cuda_graph",
    "gen_tok_s", "queue_req"}``; ``None`` when it is not such a line or lacks ``gen throughput``."""
    m = LINE_RE.search(line.rstrip("\n"))
    if not m:
        return None
    out: dict[str, Any] = {"time": _dt.datetime.strptime(m["time"] + (m["ms"] or ".000"), "%Y-%m-%d %H:%M:%S.%f"),
                           "ranks": m["ranks"].strip()}
    for part in m["body"].split(", "):
        key, sep, val = part.partition(": ")
        if sep and key.strip() in FIELDS:
            name, cast = FIELDS[key.strip()]
            try:
                out[name] = cast(val.strip().rstrip(","))
            except ValueError:
                return None
    return out if "gen_tok_s" in out and "running_req" in out else None


def parse_log(text: str) -> tuple[list[dict[str, Any]], int]:
    """All parsed lines of a log and the number of ``Decode batch`` lines that did not parse."""
    rows, skipped = [], 0
    for line in text.splitlines():
        if "Decode batch" not in line:
            continue
        r = parse_line(line)
        if r is None:
            skipped += 1
        else:
            rows.append(r)
    return rows, skipped


# --- refusals (launches SGLang refused) --------------------------------------------------------
REFUSAL_LINE = re.compile(r"^\s*(?:\w+\.)*\w*(?:Error|Exception): .+")


def refusal_message(log_path: Path) -> str | None:
    """SGLang's own error message in a server log: the last ``SomeError: message`` line (the
    exception that ended the launch), or None when there is none."""
    if not Path(log_path).is_file():
        return None
    hits = [ln.strip() for ln in read_log(log_path).splitlines() if REFUSAL_LINE.match(ln)]
    return hits[-1] if hits else None


# --- a failed launch, explained (the log's error lines and its tail) ------------------------------
ERROR_LINE = re.compile(r"Traceback|Error|Exception|error:|FAILED|out of memory|Killed", re.I)


def log_tail(path: str | Path | None, lines: int = 40) -> str:
    """The server log's last lines; when it holds a traceback or error lines, those first."""
    if path is None or not Path(path).is_file():
        return ""
    text = read_log(Path(path)).splitlines()
    tail = text[-lines:]
    tb = max((i for i, ln in enumerate(text) if ln.startswith("Traceback")), default=None)
    if tb is not None and tb < len(text) - lines:
        return "\n".join(text[tb:tb + lines // 2] + ["..."] + tail[-lines // 2:])
    errs = [ln for ln in text[:-lines] if ERROR_LINE.search(ln)][-5:]
    return "\n".join((errs + ["..."] if errs else []) + tail)

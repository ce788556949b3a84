"""The card's estimator: SGLang's own ``Decode batch`` log lines, parsed and kept to our requests.

SGLang 0.5.23 formats the line in ``srt/managers/scheduler_components/metrics_reporter.py``:
line 963 starts it (``Decode batch{iter}, #running-req: N, `` + the pool's usage parts from
``pool_stats_observer.py`` 119-149: ``#token: T, token usage: U`` or, on hybrid models such as
Ling, ``#full token: ..., full token usage: ..., mamba num: ..., mamba usage: ...``); with
speculation line 1015 adds ``accept len: X, accept rate: Y, `` (``cap len``/``block accept len``
only when non-zero, 1016-1019); lines 1039-1043 end it with ``cuda graph: B, gen throughput
(token/s): Z, #queue-req: Q``. Without speculation the accept fields are absent. The line is
written every ``--decode-log-interval`` decode steps (default 40,
``srt/arg_groups/fields/observability.py`` 136-139) and covers the steps since the previous one:
``accept len`` = accepted tokens / verify passes and ``accept rate`` = correct drafts /
(passes x (draft tokens - 1)) over those steps; ``gen throughput`` = tokens / wall time since the
previous line (which can include idle time before a request). The logger prefix is
``[%Y-%m-%d %H:%M:%S(.ms) (DP/TP/EP ranks)]`` (``utils/common.py`` 2629-2636), local time,
one-second resolution unless ``SGLANG_LOG_MS``.

``nvfp4study decode-log LOG [--json]`` prints each parsed line, the median / min / max of each
field and how many ``Decode batch`` lines did not parse.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import statistics
from pathlib import Path
from typing import Any

from ..core.errors import StudyError
from .sglang_log import FIELDS, LINE_RE, parse_line, parse_log, read_log  # noqa: F401  (the one log parser)

AGGREGATED = ("gen_tok_s", "accept_len", "accept_rate")


def request_window(row: dict[str, Any]) -> tuple[_dt.datetime, _dt.datetime] | None:
    """A raw request row's wall-clock window in the log's local time: from ``t_wall`` (UTC, at
    send) floored to the second to ``t_wall + end_s`` ceiled to the second (the log's resolution)."""
    if not row.get("t_wall") or row.get("end_s") is None:
        return None
    start = _dt.datetime.fromisoformat(row["t_wall"]).astimezone().replace(tzinfo=None)
    end = start + _dt.timedelta(seconds=float(row["end_s"]))
    return start.replace(microsecond=0), end.replace(microsecond=0) + _dt.timedelta(seconds=1)


def in_windows(lines: list[dict[str, Any]], windows: list[tuple[_dt.datetime, _dt.datetime]]) -> list[dict[str, Any]]:
    """The lines whose time falls inside one of ``windows`` (inclusive), each once."""
    return [r for r in lines if any(a <= r["time"] <= b for a, b in windows)]


def aggregates(lines: list[dict[str, Any]]) -> dict[str, dict[str, float | int | None]]:
    """Median, min, max and count of ``gen_tok_s``, ``accept_len``, ``accept_rate`` over lines
    (fields absent without speculation give n 0 and None)."""
    out = {}
    for f in AGGREGATED:
        xs = [r[f] for r in lines if r.get(f) is not None]
        out[f] = {"median": statistics.median(xs) if xs else None, "min": min(xs, default=None),
                  "max": max(xs, default=None), "n": len(xs)}
    return out


def study_lines(run_dir: Path, launch_rows: list[dict[str, Any]], request_rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Decode lines of the launches' logs (``log`` of each launch record, relative to the run)
    that fall inside the windows of the given (non-warm-up, ok) requests of the same launch."""
    out = []
    for rec in launch_rows:
        log = run_dir / rec["log"] if rec.get("log") else None
        if log is None or not log.is_file():
            continue
        wins = [w for r in request_rows if r.get("launch") == rec.get("launch") and not r.get("warmup")
                and r.get("status") == "ok" and (w := request_window(r))]
        out += in_windows(parse_log(read_log(log))[0], wins)
    return out


def estimator_row(lines: list[dict[str, Any]]) -> dict[str, Any]:
    """The log estimator as a row of the 06 estimator table: medians over the lines, ranges."""
    a = aggregates(lines)
    return {"estimator": "SGLang decode log, median over lines in our request windows (the card's)",
            "accept_len": a["accept_len"]["median"], "accept_rate": a["accept_rate"]["median"],
            "rate_derived": False, "n": len(lines), "len_min": a["accept_len"]["min"],
            "len_max": a["accept_len"]["max"], "rate_min": a["accept_rate"]["min"],
            "rate_max": a["accept_rate"]["max"], "gen_tok_s": a["gen_tok_s"]["median"]}


def main(argv: list[str]) -> int:
    """``nvfp4study decode-log LOG [--json]``: each parsed line, aggregates, skipped count."""
    ap = argparse.ArgumentParser(prog="nvfp4study decode-log", description="Parse SGLang's 'Decode batch' "
                                 "log lines (the estimator behind the card's accept len/rate and tok/s).",
                                 epilog="example: nvfp4study decode-log outputs/latest/logs/sglang-clamp=exact-spec=2-det=off.log")
    ap.add_argument("log")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    path = Path(a.log)
    if not path.is_file():
        raise StudyError(f"{path}: no such log file")
    lines, skipped = parse_log(read_log(path))
    agg = aggregates(lines)
    if a.json:
        print(json.dumps({"lines": [{**r, "time": r["time"].isoformat()} for r in lines],
                          "aggregates": agg, "skipped": skipped}, indent=1))
        return 0
    for r in lines:
        extra = "" if r.get("accept_len") is None else f"  accept len {r['accept_len']:.2f}  accept rate {r['accept_rate']:.2f}"
        print(f"{r['time']}  running {r['running_req']}  gen {r['gen_tok_s']:.2f} tok/s{extra}")
    for f, v in agg.items():
        print(f"{f}: " + ("no values" if not v["n"] else f"median {v['median']:.2f}, min {v['min']:.2f}, max {v['max']:.2f} (n={v['n']})"))
    print(f"{len(lines)} lines parsed, {skipped} 'Decode batch' lines skipped")
    return 0

"""SGLang's ``Decode batch`` lines (0.5.23 metrics_reporter.py 963-1043 format), with and without
speculation, kept to request windows; the CLI; and the estimator in a recorded run's replay."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys

import pytest

from nvfp4study.serving import decode_log as dl
from serving_fixtures import no_leftover  # noqa: F401

SPEC = ("[2026-05-09 07:35:25 TP0] Decode batch, #running-req: 1, #token: 1834, token usage: 0.01, "
        "accept len: 2.65, accept rate: 0.83, cuda graph: True, gen throughput (token/s): 45.12, #queue-req: 0")
SPEC_CAP = ("[2026-05-09 07:35:27.120] Decode batch [812], #running-req: 1, #full token: 1900, full token usage: 0.02, "
            "mamba num: 2, mamba usage: 0.01, accept len: 2.70, accept rate: 0.85, cap len: 2.90, "
            "cuda graph: True, gen throughput (token/s): 44.80, #queue-req: 0")
OFF = ("[2026-05-09 07:40:01 TP0] Decode batch, #running-req: 1, #token: 640, token usage: 0.00, "
       "cuda graph: True, gen throughput (token/s): 22.61, #queue-req: 0")
BROKEN = "[2026-05-09 07:40:02 TP0] Decode batch, #running-req: x, gen throughput (token/s): 1.0, #queue-req: 0"


def test_parse_real_format_lines():
    a = dl.parse_line(SPEC)
    assert a == {"time": dt.datetime(2026, 5, 9, 7, 35, 25), "ranks": "TP0", "running_req": 1, "tokens": 1834,
                 "token_usage": 0.01, "accept_len": 2.65, "accept_rate": 0.83, "cuda_graph": True,
                 "gen_tok_s": 45.12, "queue_req": 0}
    b = dl.parse_line(SPEC_CAP)
    assert b["time"] == dt.datetime(2026, 5, 9, 7, 35, 27, 120000) and b["cap_len"] == 2.90 and b["tokens"] == 1900
    c = dl.parse_line(OFF)
    assert "accept_len" not in c and c["gen_tok_s"] == 22.61
    assert dl.parse_line("[2026-05-09 07:35:25] Prefill batch, #new-seq: 1") is None
    rows, skipped = dl.parse_log("\n".join([SPEC, "noise", SPEC_CAP, OFF, BROKEN]))
    assert len(rows) == 3 and skipped == 1
    agg = dl.aggregates(rows)
    assert agg["gen_tok_s"] == {"median": 44.80, "min": 22.61, "max": 45.12, "n": 3}
    assert agg["accept_len"] == {"median": (2.65 + 2.70) / 2, "min": 2.65, "max": 2.70, "n": 2}


def test_windows_keep_only_our_requests():
    rows, _ = dl.parse_log("\n".join([SPEC, SPEC_CAP, OFF]))
    local = dt.datetime(2026, 5, 9, 7, 35, 24, 500000).astimezone()  # naive = local, as the log
    row = {"t_wall": local.astimezone(dt.UTC).isoformat(), "end_s": 1.2}
    w = dl.request_window(row)
    assert w == (dt.datetime(2026, 5, 9, 7, 35, 24), dt.datetime(2026, 5, 9, 7, 35, 26))
    assert [r["gen_tok_s"] for r in dl.in_windows(rows, [w])] == [45.12]


def test_cli(tmp_path):
    log = tmp_path / "s.log"
    log.write_text("\n".join([SPEC, OFF, BROKEN]) + "\n")
    r = subprocess.run([sys.executable, "-m", "nvfp4study.cli", "decode-log", str(log), "--json"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert len(d["lines"]) == 2 and d["skipped"] == 1 and d["aggregates"]["accept_rate"]["median"] == 0.83
    r = subprocess.run([sys.executable, "-m", "nvfp4study.cli", "decode-log", str(log)], capture_output=True, text=True)
    assert "2 lines parsed, 1 'Decode batch' lines skipped" in r.stdout
    r = subprocess.run([sys.executable, "-m", "nvfp4study.cli", "decode-log", str(tmp_path / "no.log")],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "no such log file" in r.stderr


@pytest.mark.usefixtures("no_leftover")
def test_log_estimator_in_a_recorded_run_and_its_replay(tmp_path):
    from nvfp4study.core.params import dump_params, load_params
    from nvfp4study.core.stage import open_stage
    from nvfp4study.serving import measure
    from nvfp4study.stages import s06_mtp as mtp
    from serving_fixtures import fake_params

    p, pf, run = fake_params(tmp_path, "mtp.prompts=2", "mtp.max_tokens=24", "mtp.depths=[0,2]",
                             "determinism.prompts=1", "determinism.repeats=1", "determinism.max_tokens=8")
    measure.collect(open_stage("06_mtp_sweep", str(pf), str(run)))
    est = mtp.estimator_table(open_stage("06_mtp_sweep", str(pf), str(run)))
    row = est[est.estimator.str.startswith("SGLang decode log")].iloc[0]
    # the fake logs one line per request with that request's accept len (2 decimals); at the log's
    # one-second resolution the windows of fast requests also take in the warm-up's and 07's lines
    # of the same second, so only bounds hold: at least our 2 lines, within the logged values
    per_req = est[est.estimator == "request-weighted median"].iloc[0]
    text = next((run / "logs").glob("sglang-clamp=exact-spec=2*.log")).read_text()
    logged = [r["accept_len"] for r in dl.parse_log(text)[0]]
    assert 2 <= row["n"] <= len(logged)
    assert min(logged) <= row["accept_len"] <= max(logged)
    assert abs(row["accept_len"] - per_req["accept_len"]) < 0.5
    rp = load_params(None, [f"replay_from={run}"])
    rpf = dump_params(rp, tmp_path / "replay.yaml")
    rrun = tmp_path / "replay-run"
    rrun.mkdir()
    s6 = open_stage("06_mtp_sweep", str(rpf), str(rrun))
    measure.collect(s6)
    again = mtp.estimator_table(s6)
    assert again[again.estimator.str.startswith("SGLang decode log")].iloc[0]["accept_len"] == row["accept_len"]


def _row(launch, start, end_s, **kw):
    """A raw request row sent at the naive local time ``start`` (the log's clock)."""
    return {"launch": launch, "t_wall": start.astimezone().astimezone(dt.UTC).isoformat(), "end_s": end_s,
            "status": "ok", **kw}


def test_study_lines_keep_each_launch_to_its_own_requests(tmp_path):
    """Launch 1's log keeps the lines inside its ok, non-warm-up requests' windows; launch 2's
    request does not reach into launch 1's log; a launch without a log file (or without ``log``)
    adds nothing."""
    (tmp_path / "logs").mkdir()
    # a byte that is not UTF-8 in a noise line does not stop the read
    (tmp_path / "logs" / "a.log").write_bytes(("\n".join([SPEC, SPEC_CAP, OFF]) + "\n").encode() + b"noise \xff\n")
    (tmp_path / "logs" / "b.log").write_text(OFF + "\n")
    t = dt.datetime(2026, 5, 9, 7, 35, 24, 500000)
    launches = [{"launch": 3, "log": "logs/missing.log"}, {"launch": 4}, {"launch": 1, "log": "logs/a.log"},
                {"launch": 2, "log": "logs/b.log"}]
    ok = _row(1, t, 1.2)  # window 07:35:24-07:35:26: SPEC only
    lines = dl.study_lines(tmp_path, launches, [ok])
    assert [r["gen_tok_s"] for r in lines] == [45.12]
    later = _row(1, dt.datetime(2026, 5, 9, 7, 40, 0, 200000), 0.5)  # 07:40:00-07:40:01: OFF
    others = [_row(1, t, 1.2, warmup=True), _row(1, t, 1.2, status="stream_cut"), _row(2, t, 1.2),
              _row(1, t, None), _row(3, t, 100.0), _row(4, t, 100.0)]
    assert dl.study_lines(tmp_path, launches, others) == []
    assert [r["gen_tok_s"] for r in dl.study_lines(tmp_path, launches, [ok, later, *others])] == [45.12, 22.61]
    # launch 2's own request keeps launch 2's line
    launch2 = _row(2, dt.datetime(2026, 5, 9, 7, 40, 0, 200000), 0.5)
    assert [r["gen_tok_s"] for r in dl.study_lines(tmp_path, launches, [launch2])] == [22.61]
    assert [r["gen_tok_s"] for r in dl.study_lines(tmp_path, launches, [ok, launch2])] == [45.12, 22.61]


def test_estimator_row_by_hand():
    rows, _ = dl.parse_log("\n".join([SPEC, SPEC_CAP, OFF]))
    assert dl.estimator_row(rows) == {
        "estimator": "SGLang decode log, median over lines in our request windows (the card's)",
        "accept_len": (2.65 + 2.70) / 2, "accept_rate": (0.83 + 0.85) / 2, "rate_derived": False, "n": 3,
        "len_min": 2.65, "len_max": 2.70, "rate_min": 0.83, "rate_max": 0.85, "gen_tok_s": 44.80}


def test_parse_edges():
    """A trailing comma on the last value, a line without gen throughput or without #running-req
    (None), each unparsed line counted, an empty aggregate, and a window's end inclusive."""
    assert dl.parse_line(OFF + ",")["queue_req"] == 0
    assert dl.parse_line(OFF.replace(", gen throughput (token/s): 22.61", "")) is None
    assert dl.parse_line(OFF.replace("#running-req: 1, ", "")) is None
    assert dl.parse_log("\n".join([BROKEN, SPEC, BROKEN, "Decode batch, nothing"]))[1] == 3
    assert dl.aggregates([]) == {f: {"median": None, "min": None, "max": None, "n": 0}
                                 for f in ("gen_tok_s", "accept_len", "accept_rate")}
    rows, _ = dl.parse_log(SPEC)
    t = dt.datetime(2026, 5, 9, 7, 35, 25)
    assert dl.in_windows(rows, [(t - dt.timedelta(seconds=1), t)]) == rows
    assert dl.in_windows(rows, [(t, t + dt.timedelta(seconds=1))]) == rows
    assert dl.in_windows(rows, [(t + dt.timedelta(seconds=1), t + dt.timedelta(seconds=2))]) == []
    assert dl.request_window({"t_wall": "2026-05-09T05:35:24+00:00", "end_s": None}) is None
    assert dl.request_window({"t_wall": None, "end_s": 1.0}) is None

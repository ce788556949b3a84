"""Stage 07: are greedy outputs byte-identical with and without speculation (and in
deterministic mode)? Reads only the recorded raw files of the run.

Configurations: speculation off and NEXTN at ``determinism.spec_depth`` (the card's k=2), then
both again with ``--enable-deterministic-inference`` (``determinism.deterministic_mode``). Each
prompt is sent ``determinism.repeats`` times to each, greedy (temperature 0), one at a time.

Comparisons (each pair: lengths first, then the first differing token; outputs that differ are
never turned into a speedup without saying so, fault F-09 in ``docs/faults.md``):

- spec-off self-reproducibility: every repeat equals repeat 0 (speculation off).
- spec-on self-reproducibility: the same with speculation.
- spec-on vs spec-off: repeat 0 of each, per prompt.
- the same three in deterministic mode, and deterministic spec-on vs plain spec-off.

Throughput per configuration: median decode tok/s over its requests, with the card's estimator
beside it (median ``gen throughput (token/s)`` of SGLang's decode log lines in our request windows). A speedup of spec-on over
spec-off is reported with how many of its pairs have identical texts; when texts differ the
label says so (different text, different acceptance), and an identical-pairs-only figure is
given beside it.

The card's three rows are decided by the rules of :mod:`~nvfp4study.stages.claim_rules.r07_determinism`;
on the CPU engine they are "not run" and the study's findings are recorded here.
"""

from __future__ import annotations

import statistics
from typing import Any

from ..core import ledger
from ..core.claim_rules import record_rules
from ..core.files import atomic_write
from ..core.ledger import Verdict
from ..core.stage import Stage, open_stage_named
from ..serving import acceptance, decode_log, measure
from ..serving.launch_env import sweep_note
from ..serving.plans import Served
from ..serving.server import (
    ServerConfig,
    card_refusal,
    engine_description,
    lifecycle,
)
from ..serving.strategies import serves_standin
from .claim_rules import r07_determinism as rules

NOTEBOOK = "07_determinism"


def serving_plan(params) -> list[Served]:
    """What 07 serves (:mod:`nvfp4study.serving.plans`), each asked
    :func:`~nvfp4study.serving.records.det_requests`: speculation off and at
    ``determinism.spec_depth``, then (``determinism.deterministic_mode``) both with deterministic
    mode. The CPU engine refuses deterministic mode at argument checking, whatever the depth: one
    launch, refusable, records SGLang's message for both."""
    from dataclasses import replace

    from ..serving.launch_env import trained_sweep

    clamp, model = params.server.clamp_mode, trained_sweep(params)  # the trained stand-in: 06's launches
    configs = [ServerConfig(clamp=clamp, spec_depth=None, **model),
               ServerConfig(clamp=clamp, spec_depth=params.determinism.spec_depth, **model)]
    standin = serves_standin(params)
    if params.determinism.deterministic_mode:
        configs += [replace(c, deterministic=True) for c in (configs[:1] if standin else configs)]
    requests = tuple(measure.det_requests(params))
    return [Served(c, requests, refusable=c.deterministic and standin) for c in configs]


def open_stage(params_file: str = "", run_dir: str = "") -> Stage:
    """:func:`nvfp4study.core.stage.open_stage_named` for notebook ``07_determinism``."""
    return open_stage_named(NOTEBOOK, params_file, run_dir)


def resolve_mode(stage: Stage) -> measure.Mode:
    """How this stage runs here: replay, live or "not run" (:func:`nvfp4study.serving.measure.resolve_mode`);
    its ``markdown()`` is the notebook's one box."""
    return measure.resolve_mode(stage)


def collect(stage: Stage) -> Any:
    """The stage's live collection, the replay import or "not run" recorded
    (:func:`nvfp4study.serving.measure.collect`): a DataFrame per configuration, or a note."""
    return measure.collect(stage)



def _nr(stage: Stage):
    """Nothing shown when the stage did not run (its one box says why), else None."""
    mode = measure.resolve_mode(stage)
    return measure.Quiet(f"not run: {mode.reason}") if mode.kind == "not run" else None


def configs(params) -> dict[str, ServerConfig]:
    """``{"spec-off": .., "spec-on": .., "det spec-off": .., "det spec-on": ..}`` (det only if on;
    on the CPU engine only "det spec-off" is launched: SGLang refuses the mode before any depth matters)."""
    cs = [s.config for s in serving_plan(params)]
    names = ["spec-off", "spec-on", "det spec-off", "det spec-on"]
    return dict(zip(names, cs, strict=False))


def refusals(stage: Stage) -> dict[str, str]:
    """``{configuration name: SGLang's message}`` for the configurations whose last launch SGLang
    refused (``status`` "refused" in the launch record, :func:`nvfp4study.serving.measure.collect`)."""
    out = {}
    for name, c in configs(measure.params_of(stage)).items():
        rows = measure.launches(stage.paths, c)
        if rows and rows[-1].get("status") == "refused":
            out[name] = rows[-1].get("refusal") or "the server exited while loading (no message in its log)"
    return out


def _rows(stage: Stage) -> dict[str, dict[tuple[str, int], dict[str, Any]]]:
    params = measure.params_of(stage)
    specs = measure.det_requests(params)
    refused = refusals(stage)
    out = {}
    for name, c in configs(params).items():
        if name in refused:
            continue
        out[name] = {(r["prompt_id"], r["repeat"]): r for r in measure.rows_for(stage, c, specs)}
    return out


COMPARISONS = [
    # (label, left config, right config, kind) kind: "self" = every repeat vs repeat 0 of left
    ("spec-off self-reproducibility", "spec-off", "spec-off", "self"),
    ("spec-on self-reproducibility", "spec-on", "spec-on", "self"),
    ("spec-on vs spec-off", "spec-on", "spec-off", "cross"),
    ("det spec-off self-reproducibility", "det spec-off", "det spec-off", "self"),
    ("det spec-on self-reproducibility", "det spec-on", "det spec-on", "self"),
    ("det spec-on vs det spec-off", "det spec-on", "det spec-off", "cross"),
    ("det spec-on vs plain spec-off", "det spec-on", "spec-off", "cross"),
]


def pair_rows(rows: dict[str, dict[tuple[str, int], dict]], prompt_ids: list[str], repeats: int) -> list[dict]:
    """Every comparison's pairs: comparison, prompt, repeats compared, identical, first divergence.

    Pure function of recorded rows (tested by hand).
    """
    out = []
    for label, left, right, kind in COMPARISONS:
        if left not in rows or right not in rows:
            continue
        for pid in prompt_ids:
            pairs = ([(r, 0) for r in range(1, repeats)] if kind == "self" else [(0, 0)])
            for ra, rb in pairs:
                a, b = rows[left].get((pid, ra)), rows[right].get((pid, rb))
                cmp = measure.compare_outputs(a or {}, b or {})
                ma = measure.request_metrics(a) if a else {}
                mb = measure.request_metrics(b) if b else {}
                out.append({"comparison": label, "prompt_id": pid, "left": f"{left} r{ra}", "right": f"{right} r{rb}",
                            **cmp, "left_decode_tok_s": ma.get("decode_tok_s"),
                            "right_decode_tok_s": mb.get("decode_tok_s")})
    return out


def identity_counts(pairs: list[dict]) -> list[dict]:
    """Per comparison: prompts all of whose pairs are identical / prompts compared."""
    out = []
    for label, *_ in COMPARISONS:
        mine = [p for p in pairs if p["comparison"] == label]
        if not mine:
            continue
        by_prompt: dict[str, list[dict]] = {}
        for p in mine:
            by_prompt.setdefault(p["prompt_id"], []).append(p)
        comparable = {k: v for k, v in by_prompt.items() if all(x["comparable"] for x in v)}
        same = [k for k, v in comparable.items() if all(x["identical"] for x in v)]
        divs = [x["first_divergence"] for v in comparable.values() for x in v if x["identical"] is False]
        out.append({"comparison": label, "identical prompts": len(same), "prompts compared": len(comparable),
                    "not comparable (failed request)": len(by_prompt) - len(comparable),
                    "first divergence (min..max)": f"{min(divs)}..{max(divs)}" if divs else "-"})
    return out


def pair_table(stage: Stage):
    """One row per compared pair (F-09). Writes ``data/det-pairs.json``."""
    import pandas as pd

    if (nr := _nr(stage)) is not None:
        return nr
    df = pd.DataFrame(_pairs(stage))
    atomic_write(stage.paths.data("det-pairs"), lambda tmp: tmp.write_text(df.to_json(orient="records", indent=1, double_precision=10)))
    return df


def _pairs(stage: Stage) -> list[dict]:
    d = measure.params_of(stage).determinism
    return pair_rows(_rows(stage), [p["id"] for p in measure.prompts(d.prompts)], d.repeats)


def identity_table(stage: Stage):
    """Per comparison: identical prompts / compared. Writes ``data/det-identity.json``."""
    import pandas as pd

    if (nr := _nr(stage)) is not None:
        return nr
    df = pd.DataFrame(identity_counts(_pairs(stage)))
    atomic_write(stage.paths.data("det-identity"), lambda tmp: tmp.write_text(df.to_json(orient="records", indent=1)))
    return df


def _med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


LOG_TOKS = "gen tok/s median (SGLang decode log, the card's estimator)"


def throughput_rows(rows: dict[str, dict], pairs: list[dict],
                    logs: dict[str, dict[str, Any]] | None = None) -> list[dict]:
    """Median decode tok/s per configuration, and spec-on/spec-off speedups labelled by identity.

    Args:
        rows: per configuration name, the recorded raw rows by ``(prompt_id, repeat)``.
        pairs: :func:`pair_rows`.
        logs: per configuration name, :func:`nvfp4study.serving.acceptance.log_summary` of its
            decode log lines in our request windows (the card's estimator), shown beside the
            per-request tok/s; None or a missing name gives empty log columns.
    """
    logs = logs or {}
    out = []
    for name, recs in rows.items():
        m = [measure.request_metrics(r) for r in recs.values()]
        ok = [x for x in m if x["status"] == "ok"]
        lg = logs.get(name, {})
        out.append({"row": name, "decode tok/s median": _med([x["decode_tok_s"] for x in ok]),
                    "e2e tok/s median": _med([x["e2e_tok_s"] for x in ok]), "requests ok": f"{len(ok)}/{len(m)}",
                    LOG_TOKS: lg.get("log gen tok/s median"), "log accept len median": lg.get("log accept len median"),
                    "log lines": lg.get("log lines"), "pairs": None, "identical pairs": None, "label": "throughput"})
    for label in ("spec-on vs spec-off",
                  "det spec-on vs det spec-off"):
        mine = [p for p in pairs if p["comparison"] == label and p["comparable"]]
        if not mine:
            continue
        same = [p for p in mine if p["identical"]]
        ratio = lambda ps: (_med([p["left_decode_tok_s"] for p in ps]) / _med([p["right_decode_tok_s"] for p in ps])  # noqa: E731
                            if ps and _med([p["right_decode_tok_s"] for p in ps]) else None)
        differ = len(mine) - len(same)
        left, right = (logs.get(n, {}).get("log gen tok/s median") for n in label.split(" vs "))
        out.append({"row": f"speedup {label}, all pairs", "decode tok/s median": ratio(mine), "e2e tok/s median": None,
                    LOG_TOKS: left / right if left and right else None,
                    "requests ok": None, "pairs": len(mine), "identical pairs": len(same),
                    "label": (f"texts differ in {differ} of {len(mine)} pairs: this ratio compares different texts "
                              "(different text, different acceptance)") if differ else "all pairs identical"})
        out.append({"row": f"speedup {label}, identical pairs only", "decode tok/s median": ratio(same),
                    "e2e tok/s median": None, "requests ok": None, "pairs": len(same), "identical pairs": len(same),
                    "label": "same texts on both sides" if same else "no identical pair: not computed"})
    return out


def throughput_table(stage: Stage):
    """Throughput of each configuration (per-request decode and end-to-end tok/s, and the SGLang
    decode log's gen tok/s beside them) and the labelled speedups. Writes ``data/det-throughput.json``."""
    import pandas as pd

    if (nr := _nr(stage)) is not None:
        return nr
    rows, params = _rows(stage), measure.params_of(stage)
    logs = {name: acceptance.log_summary(decode_log.study_lines(stage.run_dir, measure.launches(stage.paths, c),
                                                                list(rows[name].values())))
            for name, c in configs(params).items() if name in rows}
    df = pd.DataFrame(throughput_rows(rows, _pairs(stage), logs))
    atomic_write(stage.paths.data("det-throughput"), lambda tmp: tmp.write_text(df.to_json(orient="records", indent=1, double_precision=10)))
    return df


def record_claims(stage: Stage):
    """Record this stage's ledger rows, each decided by its rule
    (:mod:`~nvfp4study.stages.claim_rules.r07_determinism`). What the run can settle is asked of
    its strategy (:attr:`~nvfp4study.serving.measure.Mode.settles_card_claims`, ``standin``): the
    card's det.spec-off, det.spec-on and det.deterministic-mode where it serves the card's
    checkpoint, else "not run" (:func:`card_refusal`); on the stand-in the findings of
    :func:`_standin_measurements`. Returns this stage's ledger rows."""
    import pandas as pd

    if (nr := _nr(stage)) is not None:
        return nr
    mode = measure.resolve_mode(stage)
    params = measure.params_of(stage)
    if mode.settles_card_claims:
        pairs = _pairs(stage)
        thr = {r["row"]: r for r in throughput_rows(_rows(stage), pairs)}
        replay = params.replay_from
        ev = [stage.paths.data("det-pairs"), stage.paths.data("det-identity"), stage.paths.data("det-throughput")]
        ev += [measure.raw_path(stage.paths, c) for c in configs(params).values()]
        d = params.determinism
        record_rules(stage, rules.DeterminismMeasurements(
            counts=rules.counts_by_comparison(identity_counts(pairs)),
            det_tok_s=thr.get("det spec-on", {}).get("decode tok/s median"),
            cards={c["id"]: c["card"] for c in ledger.card_claims()}, spec_depth=d.spec_depth, repeats=d.repeats,
            deterministic_mode=d.deterministic_mode, evidence=ev,
            checked="sglang " + params.sglang.version + (f" (replay of {replay})" if replay else "")))
    else:
        stage.not_run(card_refusal(params))
    if mode.standin:
        record_rules(stage, _standin_measurements(stage))
    rows = [r for r in ledger.read_ledger(stage.run_dir) if r["id"] in stage.claims() or r["stage"] == stage.name]
    return pd.DataFrame([{k: r[k] for k in ("id", "card", "measured", "verdict", "note")} for r in rows])


# --- the CPU engine --------------------------------------------------------------------------
def teardown_result(launches: list[dict[str, Any]]) -> dict[str, Any]:
    """``serve.cpu-engine-teardown`` from every launch of the run (``data/serve-lifecycle.jsonl``,
    pure): reproduced when every launch left 0 processes after its stop. Returns
    ``{"measured", "verdict", "note"}``."""
    left = sum(len(r.get("left_after_stop") or []) for r in launches)
    healthy = sum(1 for r in launches if r.get("load_s") is not None)
    by_stage: dict[str, int] = {}
    for r in launches:
        by_stage[r["stage"]] = by_stage.get(r["stage"], 0) + 1
    return {"measured": {"launches": len(launches), "healthy": healthy, "processes_left": left, "by_stage": by_stage},
            "verdict": Verdict.REPRODUCED if launches and not left else Verdict.CONTRADICTED,
            "note": f"{len(launches)} launches ({healthy} healthy, the others refused or failed while loading), "
                    f"{left} processes left after their stops"}


def patched_modes_result(launches: list[dict[str, Any]], modes: list[str]) -> dict[str, Any]:
    """``serve.cpu-engine-patched-modes`` (pure): every clamp mode in ``modes`` had a launch that
    became healthy from the run's patched overlay of the install. Returns ``{"measured", "verdict", "note"}``."""
    ok = {m: sum(1 for r in launches if r.get("clamp") == m and r.get("load_s") is not None) for m in modes}
    return {"measured": {"healthy_launches_per_mode": ok},
            "verdict": Verdict.REPRODUCED if all(ok.values()) else Verdict.CONTRADICTED,
            "note": "the overlay is patched to each launch's clamp mode and restored after it "
                    "(data/sglang_patch_state.json); on the CPU the patched NVFP4 files are imported, not run"}


def _standin_measurements(stage: Stage) -> rules.CpuDeterminismMeasurements:
    """The stand-in's findings' measurements: ``det.cpu-spec-off-self``, ``det.cpu-spec-on-vs-off``
    (greedy token-for-token identity), ``det.cpu-deterministic-mode`` ("not run" with SGLang's own
    refusal) and, over every launch of the run, ``serve.cpu-engine-teardown`` and
    ``serve.cpu-engine-patched-modes``."""
    params = measure.params_of(stage)
    checked = engine_description(params)["summary"]
    counts = rules.counts_by_comparison(identity_counts(_pairs(stage)))
    ev = [stage.paths.data("det-pairs"), stage.paths.data("det-identity")]
    ev += [measure.raw_path(stage.paths, c) for n, c in configs(params).items() if n not in refusals(stage)]
    d = params.determinism
    ref = refusals(stage)
    launches = lifecycle(stage)
    modes = list(dict.fromkeys([params.server.clamp_mode, *params.corruption.clamp_modes]))
    return rules.CpuDeterminismMeasurements(
        counts=counts, repeats=d.repeats, spec_depth=d.spec_depth, deterministic_mode=d.deterministic_mode,
        evidence=ev, refusals=ref,
        refusal_evidence=[measure.launch_path(stage.paths, c) for n, c in configs(params).items() if n in ref],
        teardown=teardown_result(launches), patched=patched_modes_result(launches, modes),
        lifecycle_evidence=[stage.paths.data("serve-lifecycle", "jsonl")], checked=checked, standin_note=sweep_note(params))

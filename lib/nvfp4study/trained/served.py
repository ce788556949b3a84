"""Corruption before and after the fix, measured on the trained stand-in served by SGLang's real
engine on this CPU: one launch per arm (routed clamp form x expert weights), the same HumanEval
prompts, greedy.

Arms (:class:`Arm`): the routed clamp as SGLang 0.5.23's native MoE path ships it ("released":
dropped), in the pre-SiLU form SGLang's NVFP4 CUTLASS call computes ("approx") and in Ling's
post-SiLU form ("exact"), put on the run's overlay by the study's patch machinery per launch
(``ServerConfig.native``); weights as trained ("bf16") or with the routed experts rounded to NVFP4
by the study's own ``model_free_ptq`` output ("nvfp4", :func:`.artifact.nvfp4_copy`). The
reference arm is exact + bf16: the form the model was trained with.

Collection: stage 05's ``serving_plan`` lists one item per arm (:func:`server_config`,
:func:`arm_requests`) in :func:`serving_order`; the one serving pipeline
(:func:`nvfp4study.serving.measure.collect`) launches them, shares a launch with any stage serving
the same configuration, and appends each answer to ``data/trained-raw-arm=<arm>.jsonl`` as it
arrives (a row answered is never asked again); :func:`assemble` reads them back into
``data/trained_corruption.json``.

Requests: each task's prompt plus one indentation level (the toy model otherwise ends the
function after its docstring), greedy, at most ``max_new_tokens``, stopped at the HumanEval stop
sequences :data:`STOP` (Chen et al. 2021, arXiv 2107.03374, section 2.3). Each arm's launch also
scores the reference arm's continuations teacher-forced (``input_token_logprobs``), so "how
likely is what the trained form writes" is measured under every arm on the same tokens.
"""

from __future__ import annotations

import ast
import time
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path
from typing import Any, ClassVar

from ..codeeval.served_analysis import wilson_interval
from ..core.errors import StudyError
from ..core.stage import Stage

#: HumanEval's stop sequences (Codex paper, section 2.3).
STOP = ["\ndef", "\nclass", "\nif", "\n#", "\nprint"]
INDENT = "    "
REFERENCE = ("exact", "bf16")
CLAMP_NOTES = {"released": "routed clamp dropped (SGLang 0.5.23's native MoE path as shipped)",
               "approx": "pre-SiLU form silu(min(g, L)) * clamp(u, -L, L) (GPT-OSS's; SGLang's NVFP4 CUTLASS call)",
               "exact": "Ling's post-SiLU form min(silu(g), L) * clamp(u, -L, L) (what the model was trained with)"}


class TrainedStudyError(StudyError):
    """The engine's answers cannot be scored as asked (what is missing is named)."""


@dataclass(frozen=True)
class Arm:
    """One served arm: the routed clamp form on the native MoE path and the expert weights;
    ``again`` marks the null control (the reference arm launched a second time)."""

    clamp: str
    weights: str
    again: bool = False

    @property
    def key(self) -> str:
        """``"exact-bf16"`` (``"exact-bf16-again"`` for the null control)."""
        return f"{self.clamp}-{self.weights}" + ("-again" if self.again else "")

    @property
    def is_reference(self) -> bool:
        """Exact clamp, BF16 weights, first launch: the form the model was trained with."""
        return (self.clamp, self.weights) == REFERENCE and not self.again


REFERENCE_KEY = Arm(*REFERENCE).key
NULL_KEY = Arm(*REFERENCE, again=True).key


def arms(params: Any) -> list[Arm]:
    """The arms of ``server.cpu.trained``, the reference first (its continuations are scored
    under every other arm), the null control (the reference relaunched) last."""
    t = params.server.cpu.trained
    out = sorted([Arm(c, w) for w in t.weights for c in t.clamps], key=lambda a: not a.is_reference)
    return out + [Arm(*REFERENCE, again=True)]


def server_config(params: Any, arm: Arm, depth: int | None = None) -> Any:
    """The arm's :class:`~nvfp4study.serving.server.ServerConfig`: speculation off unless
    ``depth``; the card's clamp mode for the GPU paths (no CPU path reads it); the native MoE clamp
    of the arm; the served folder by its label (``serving.launch_env.TRAINED_LABELS``); the null
    control is instance "again" (a launch of its own, never shared)."""
    from ..serving.server import ServerConfig

    return ServerConfig(clamp=params.server.clamp_mode, spec_depth=depth, model_label=f"trained-{arm.weights}",
                        native=(("moe_clamp", arm.clamp),), instance="again" if arm.again else "")


def prompts(params: Any, tokenizer_json: Path) -> list[dict[str, Any]]:
    """The first ``prompts`` HumanEval tasks: ``task_id``, ``prompt`` (with :data:`INDENT`) and its
    token ids under the stand-in's tokenizer."""
    by_id = _prompt_ids(str(tokenizer_json))
    return [{"task_id": t, "prompt": by_id[t][0], "ids": list(by_id[t][1])}
            for t in task_ids(params.server.cpu.trained.prompts)]


@cache
def task_ids(n: int) -> tuple[str, ...]:
    """The first ``n`` HumanEval task ids (read once per process: every plan asks them)."""
    from ..codeeval.tasks import humaneval_tasks

    return tuple(t.task_id for t in humaneval_tasks()[:n])


@cache
def _prompt_ids(tokenizer_json: str) -> dict[str, tuple[str, tuple[int, ...]]]:
    """``{task id: (prompt + INDENT, its token ids)}`` of every HumanEval task under the tokenizer."""
    from tokenizers import Tokenizer

    from ..codeeval.tasks import humaneval_tasks

    tok = Tokenizer.from_file(tokenizer_json)
    return {t.task_id: (t.prompt + INDENT, tuple(tok.encode(t.prompt + INDENT).ids)) for t in humaneval_tasks()}


#: the trained arms' raw rows, one file per arm (``data/trained-raw-arm=<key>.jsonl``)
RAW_STEM = "trained-raw"
_ROW_EXTRAS = ("request_key", "status", "launch", "config_key", "elapsed_s", "model_sha256")


def raw_path(paths: Any, arm_key: str) -> Path:
    """``data/trained-raw-arm=<arm key>.jsonl``: the arm's answers, one row per task, appended as
    they arrive."""
    return paths.data(RAW_STEM, "jsonl", arm=arm_key)


def _latest_ok(path: Path) -> dict[str, dict[str, Any]]:
    """``{task id: the last row with status "ok"}`` of an arm's raw file (empty when absent)."""
    from ..core.jsonl import read_jsonl

    return {r["task_id"]: r for r in (read_jsonl(path) if path.is_file() else []) if r.get("status") == "ok"}


@dataclass(frozen=True)
class TrainedRequest:
    """One task asked of one arm (a :class:`~nvfp4study.serving.records.ServedRequest`): the
    greedy answer, then the reference arm's continuation of the task scored teacher-forced under
    the arm (the arm's own tokens on the reference arm itself)."""

    arm: Arm
    task_id: str
    max_tokens: int
    wants_warmup: ClassVar[bool] = False  # not timed

    @property
    def key(self) -> str:
        """``trained/<arm>/<task>``."""
        return f"trained/{self.arm.key}/{self.task_id}"

    def path(self, paths: Any, config: Any) -> Path:
        """:func:`raw_path` of the arm."""
        return raw_path(paths, self.arm.key)

    def reads(self, paths: Any, config: Any) -> tuple[Path, ...]:
        """The reference arm's raw file (a non-reference arm scores the reference's answer)."""
        return () if self.arm.is_reference else (raw_path(paths, REFERENCE_KEY),)

    @staticmethod
    def row_key(row: dict[str, Any]) -> str | None:
        """``trained/<arm>/<task>`` of a recorded row."""
        return f"trained/{row['arm']}/{row['task_id']}" if "arm" in row and "task_id" in row else None

    def send(self, stage: Stage, url: str, config: Any, launch: int) -> dict[str, Any]:
        """Ask it (:func:`_ask_arm`), append its row and return it.

        Raises:
            TrainedStudyError: a non-reference arm asked before the reference arm answered this
                task, or SGLang scored fewer reference tokens than asked.
        """
        from ..core.jsonl import append_jsonl
        from ..serving.launch_env import standin_path

        by_id = _prompt_ids(str(standin_path(stage, "trained-bf16") / "tokenizer.json"))
        text, ids = by_id[self.task_id]
        reference = None
        if not self.arm.is_reference:
            ref = _latest_ok(raw_path(stage.paths, REFERENCE_KEY)).get(self.task_id)
            if ref is None:
                raise TrainedStudyError(f"{self.arm.key} {self.task_id}: the reference arm {REFERENCE_KEY} "
                                        "has not answered this task (it is served first)")
            reference = {self.task_id: ref["output_ids"]}
        t0 = time.monotonic()
        (row,) = _ask_arm(url, stage, self.arm, [{"task_id": self.task_id, "prompt": text, "ids": list(ids)}],
                          reference, self.max_tokens)
        row.update(request_key=self.key, status="ok", launch=launch, config_key=config.key,
                   elapsed_s=time.monotonic() - t0, model_sha256=_model_sha(stage))
        append_jsonl(self.path(stage.paths, config), row)
        return row


def arm_requests(params: Any, arm: Arm) -> tuple[TrainedRequest, ...]:
    """The arm's requests: the first ``server.cpu.trained.prompts`` HumanEval tasks, in order."""
    t = params.server.cpu.trained
    return tuple(TrainedRequest(arm, i, t.max_new_tokens) for i in task_ids(t.prompts))


def _ask_arm(url: str, stage: Stage, arm: Arm, reqs: list[dict[str, Any]],
             reference: dict[str, list[int]] | None, max_new_tokens: int) -> list[dict[str, Any]]:
    """The arm's greedy answers, each with the reference arm's tokens scored teacher-forced (the
    arm's own tokens when ``reference`` is None: the reference arm itself)."""
    from ..serving.client import generate

    rows = []
    for r in reqs:
        g = generate(url, r["ids"], max_new_tokens=max_new_tokens, stop=STOP)
        row = {"arm": arm.key, "clamp": arm.clamp, "weights": arm.weights, "task_id": r["task_id"],
               "completion": g["text"], "output_ids": g["output_ids"], "finish_reason": g["finish_reason"]}
        ref = (reference or {}).get(r["task_id"], g["output_ids"])
        if ref:
            # SGLang gives no logprob for the first position of the range (None): start one
            # token early and drop it
            s = generate(url, r["ids"] + ref, max_new_tokens=1, logprob_start_len=len(r["ids"]) - 1)
            lps = s["input_token_logprobs"][1: 1 + len(ref)]
            if len(lps) != len(ref) or any(x is None for x in lps):
                raise TrainedStudyError(f"{arm.key} {r['task_id']}: SGLang scored {len(lps)} of "
                                        f"{len(ref)} reference tokens")
            row["reference_logprob_mean"] = sum(lps) / len(lps)
            row["reference_tokens"] = len(lps)
        rows.append(row)
    return rows


def _groups(all_arms: list[Arm]) -> list[list[Arm]]:
    """Arms by native clamp mode, the reference's group first: the arms of one group serve one
    install state, so they load at the same time (``serving.server.launched``)."""
    order = list(dict.fromkeys([REFERENCE[0], *(a.clamp for a in all_arms)]))
    return [[a for a in all_arms if a.clamp == c] for c in order if any(a.clamp == c for a in all_arms)]


def serving_order(params: Any) -> list[Arm]:
    """The arms in launch order: by clamp form (:func:`_groups`, the reference's first; one
    group's launches load together), each group in :func:`arms` order."""
    return [a for g in _groups(arms(params)) for a in g]


_SHA: dict[tuple[str, int, int], str] = {}


def _model_sha(stage: Stage) -> str:
    """sha256 of the trained weights served (the hash-checked copy's ``model.safetensors``),
    hashed once per file state (path, size, mtime)."""
    import hashlib

    from ..serving.launch_env import standin_path

    f = standin_path(stage, "trained-bf16") / "model.safetensors"
    st = f.stat()
    k = (str(f), st.st_size, st.st_mtime_ns)
    if k not in _SHA:
        _SHA[k] = hashlib.sha256(f.read_bytes()).hexdigest()
    return _SHA[k]


def assemble(stage: Stage, model_sha256: str | None = None) -> dict[str, Any]:
    """The arms' recorded answers (:func:`raw_path`, sent by the one collector) and launches
    (``serve-launch-<cfg>.jsonl``) as ``{"arms", "rows", "launches", "prompts", ...}`` in launch
    order; also written to ``data/trained_corruption.json``.

    Raises:
        TrainedStudyError: an arm lacks an answer, or answers were recorded with other weights.
    """
    from ..core.files import write_json
    from ..serving.records import launches as launch_rows

    params = stage.params
    sha = model_sha256 or _model_sha(stage)
    ids = task_ids(params.server.cpu.trained.prompts)
    rows: list[dict[str, Any]] = []
    launches = []
    for arm in serving_order(params):
        got = _latest_ok(raw_path(stage.paths, arm.key))
        missing = [i for i in ids if i not in got]
        if missing:
            raise TrainedStudyError(f"{arm.key}: no answer recorded for {len(missing)} task(s), e.g. {missing[0]}")
        mine = [got[i] for i in ids]
        other = {r.get("model_sha256") for r in mine} - {sha}
        if other:
            raise TrainedStudyError(f"{arm.key}: answers recorded with other trained weights (sha256 "
                                    f"{sorted(map(str, other))[0][:12]}...); remove {raw_path(stage.paths, arm.key).name}")
        rows += [{k: v for k, v in r.items() if k not in _ROW_EXTRAS} for r in mine]
        n = mine[-1]["launch"]
        rec = next((x for x in launch_rows(stage.paths, server_config(params, arm)) if x.get("launch") == n), {})
        launches.append({"arm": arm.key, "config_key": rec.get("config_key"), "load_s": rec.get("load_s"),
                         "requests_s": round(sum(r["elapsed_s"] for r in mine), 2),
                         **{k: rec.get(k) for k in ("log", "native_moe_audit", "model_path")}})
    out = {"arms": [asdict(a) | {"key": a.key} for a in arms(params)], "prompts": len(ids),
           "model_sha256": sha, "rows": rows, "launches": launches, "stop": STOP, "indent": INDENT,
           "max_new_tokens": params.server.cpu.trained.max_new_tokens}
    write_json(stage.paths.data("trained_corruption"), out)
    return out


def complete_lines(completion: str, finish_reason: str | None) -> str:
    """The completion up to its last complete line when the token limit cut it (``"length"``),
    without trailing lines that open a block (end in ``:``) whose body the cut removed: a toy
    model's answer cut mid-statement would otherwise never parse, whatever the clamp did. A
    completion ended by a stop sequence is whole."""
    if finish_reason != "length":
        return completion
    lines = completion.split("\n")[:-1]  # the last piece has no newline: cut
    while lines and lines[-1].rstrip().endswith(":"):
        lines.pop()
    return "".join(ln + "\n" for ln in lines)


def classify(data: dict[str, Any], run_code: bool = True, sandbox: Any = None) -> list[dict[str, Any]]:
    """Per row, on the completion's complete lines (:func:`complete_lines`): ``code`` (not
    blank); where there is code, ``parses`` (prompt + completion parses),
    ``junk`` (the study's detector flags the completion, checked inside its prompt), ``runs`` (the
    program reaches the task's checks in the sandbox: they pass or an assertion fails), ``passed``
    (they pass; both None when not run), ``same_as_reference`` (token ids equal
    the reference arm's); ``parses``/``junk``/``runs``/``passed`` are None for a row without code.
    Pure except the sandbox."""
    from ..codeeval.detect import detect_code
    from ..codeeval.tasks import humaneval_tasks

    tasks = {t.task_id: t for t in humaneval_tasks()}
    ref = {r["task_id"]: r["output_ids"] for r in data["rows"] if r["arm"] == REFERENCE_KEY}
    out = []
    for r in data["rows"]:
        task = tasks[r["task_id"]]
        lines = complete_lines(r["completion"], r["finish_reason"])
        body = INDENT + lines
        code = bool(lines.strip())
        parses = junk = None  # judged only where there is code
        if code:
            try:
                ast.parse(task.prompt + body)
                parses = True
            except (SyntaxError, ValueError):
                parses = False
            junk = bool(detect_code(body, prompt=task.prompt, source="trained-standin").corrupted)
        out.append({**{k: r[k] for k in ("arm", "clamp", "weights", "task_id")},
                    "code": code, "parses": parses, "junk": junk,
                    "same_as_reference": r["output_ids"] == ref.get(r["task_id"]),
                    "reference_logprob_mean": r.get("reference_logprob_mean"),
                    "reference_tokens": r.get("reference_tokens"), "body": body})
    if run_code:
        from ..codeeval.sandbox import check_many

        coded = [o for o in out if o["code"]]
        results = check_many([(tasks[o["task_id"]], o["body"]) for o in coded], sandbox) if coded else []
        for o, res in zip(coded, results, strict=True):
            o["passed"] = res.outcome == "pass"
            # ran to the task's checks: passed them, or an assertion of theirs failed
            o["runs"] = res.outcome in ("pass", "assertion_failure")
            o["outcome"] = str(res.outcome)
    return out


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per arm: ``requests``; per outcome its count, its denominator (``<col>_n``: the rows
    that have it; ``parses``, ``junk``, ``runs``, ``passed`` only rows with code) and a Wilson 95 %
    interval; the per-token mean logprob of the reference arm's continuations under the arm (nats,
    every scored token weighted alike)."""
    out = []
    for key in dict.fromkeys(r["arm"] for r in rows):
        rs = [r for r in rows if r["arm"] == key]
        s: dict[str, Any] = {"arm": key, "clamp": rs[0]["clamp"], "weights": rs[0]["weights"], "requests": len(rs)}
        for col in ("code", "parses", "junk", "runs", "passed", "same_as_reference"):
            have = [r[col] for r in rs if r.get(col) is not None]
            if col != "code" and col != "same_as_reference" and not any(r.get("code") for r in rs):
                have = []
            if not have and col not in ("code", "same_as_reference"):
                continue
            k = sum(bool(v) for v in have)
            lo, hi = wilson_interval(k, len(have))
            s[col], s[f"{col}_n"], s[f"{col}_ci"] = k, len(have), [round(lo, 3), round(hi, 3)]
        scored = [(r["reference_logprob_mean"], r.get("reference_tokens") or 1) for r in rs
                  if r.get("reference_logprob_mean") is not None]
        tokens = sum(n for _, n in scored)
        s["reference_logprob_mean"] = round(sum(m * n for m, n in scored) / tokens, 4) if tokens else None
        s["reference_tokens"] = tokens
        out.append(s)
    return out


def run(stage: Stage, sandbox: Any = None) -> dict[str, Any]:
    """Assemble the arms' answers (:func:`assemble`; the one collector sent them), classify,
    summarise; writes ``data/trained_corruption_rows.json`` and
    ``data/trained_corruption_summary.json``. Returns ``{"data", "rows", "summary", "files",
    "standin"}`` (``standin``: :func:`.artifact.describe`)."""
    from ..core.files import write_json
    from .artifact import describe

    data = assemble(stage)
    rows = classify(data, sandbox=sandbox)
    summary = summarize(rows)
    files = {"raw": stage.paths.data("trained_corruption"), "rows": stage.paths.data("trained_corruption_rows"),
             "summary": stage.paths.data("trained_corruption_summary")}
    write_json(files["rows"], [{k: v for k, v in r.items() if k != "body"} for r in rows])
    write_json(files["summary"], summary)
    return {"data": data, "rows": rows, "summary": summary, "files": files, "standin": describe()}


def figure(summary: list[dict[str, Any]]) -> Any:
    """Two panels per arm: greedy continuations identical to the reference arm's (share, Wilson
    95 % interval) and the mean per-token logprob of the reference arm's continuations (nats)."""
    import matplotlib.pyplot as plt

    arms_ = [s for s in summary if s["arm"] != REFERENCE_KEY]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.2))
    names = [s["arm"] for s in arms_]
    share = [s["same_as_reference"] / s["requests"] for s in arms_]
    lo = [p - s["same_as_reference_ci"][0] for p, s in zip(share, arms_, strict=True)]
    hi = [s["same_as_reference_ci"][1] - p for p, s in zip(share, arms_, strict=True)]
    a.barh(names, share, xerr=[lo, hi], color="#4c72b0")
    a.set_xlim(0, 1)
    a.set_xlabel("greedy continuations identical to exact-bf16")
    ref = next(s["reference_logprob_mean"] for s in summary if s["arm"] == REFERENCE_KEY)
    b.barh(names, [s["reference_logprob_mean"] - ref for s in arms_], color="#dd8452")
    b.axvline(0, color="black", lw=0.8)
    b.set_xlabel("mean logprob of exact-bf16's tokens, minus exact-bf16's (nats)")
    fig.suptitle("Trained stand-in (toy scale, SGLang CPU engine): what each arm changes")
    fig.tight_layout()
    return fig

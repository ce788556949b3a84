"""Corruption before and after the fix, measured on the trained stand-in served by SGLang's real
engine on this CPU: one launch per arm (routed clamp form x expert weights), the same HumanEval
prompts, greedy.

Arms (:class:`Arm`): the routed clamp as SGLang 0.5.23's native MoE path ships it ("released":
dropped), in the pre-SiLU form SGLang's NVFP4 CUTLASS call computes ("approx") and in Ling's
post-SiLU form ("exact"), put on the run's overlay by the study's patch machinery per launch
(``ServerConfig.native``); weights as trained ("bf16") or with the routed experts rounded to NVFP4
by the study's own ``model_free_ptq`` output ("nvfp4", :func:`.artifact.nvfp4_copy`). The
reference arm is exact + bf16: the form the model was trained with.

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
from pathlib import Path
from typing import Any

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
    of the arm; the served folder by its label (``serving.launch_env.TRAINED_LABELS``)."""
    from ..serving.server import ServerConfig

    return ServerConfig(clamp=params.server.clamp_mode, spec_depth=depth, model_label=f"trained-{arm.weights}",
                        native=(("moe_clamp", arm.clamp),))


def prompts(params: Any, tokenizer_json: Path) -> list[dict[str, Any]]:
    """The first ``prompts`` HumanEval tasks: ``task_id``, ``prompt`` (with :data:`INDENT`) and its
    token ids under the stand-in's tokenizer."""
    from tokenizers import Tokenizer

    from ..codeeval.tasks import humaneval_tasks

    tok = Tokenizer.from_file(str(tokenizer_json))
    out = []
    for t in humaneval_tasks()[: params.server.cpu.trained.prompts]:
        text = t.prompt + INDENT
        out.append({"task_id": t.task_id, "prompt": text, "ids": tok.encode(text).ids})
    return out


def _ask_arm(url: str, stage: Stage, arm: Arm, reqs: list[dict[str, Any]],
             reference: dict[str, list[int]] | None) -> list[dict[str, Any]]:
    """The arm's greedy answers, each with the reference arm's tokens scored teacher-forced (the
    arm's own tokens when ``reference`` is None: the reference arm itself)."""
    from ..serving.client import generate

    t = stage.params.server.cpu.trained
    rows = []
    for r in reqs:
        g = generate(url, r["ids"], max_new_tokens=t.max_new_tokens, stop=STOP)
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


def _model_sha(stage: Stage) -> str:
    """sha256 of the trained weights served (the hash-checked copy's ``model.safetensors``)."""
    import hashlib

    from ..serving.launch_env import standin_path

    return hashlib.sha256((standin_path(stage, "trained-bf16") / "model.safetensors").read_bytes()).hexdigest()


def collect(stage: Stage, model_sha256: str | None = None) -> dict[str, Any]:
    """Serve every arm (:func:`arms`), the arms of one clamp form loading together
    (:func:`_groups`), and return ``{"arms", "rows", "launches", "prompts", ...}``; also written to
    ``data/trained_corruption.json``."""
    import contextlib

    from ..serving.launch_env import standin_path
    from ..serving.server import launched

    reqs = prompts(stage.params, standin_path(stage, "trained-bf16") / "tokenizer.json")
    rows: list[dict[str, Any]] = []
    launches = []
    reference: dict[str, list[int]] | None = None
    for group in _groups(arms(stage.params)):
        with contextlib.ExitStack() as stack:
            recs = [{} for _ in group]
            started = [stack.enter_context(launched(stage, server_config(stage.params, a), launch_record=r))
                       for a, r in zip(group, recs, strict=True)]
            for arm, st, rec in zip(group, started, recs, strict=True):
                url = st.wait_healthy()
                t0 = time.monotonic()
                got = _ask_arm(url, stage, arm, reqs, reference)
                rec["requests_s"] = round(time.monotonic() - t0, 2)
                if arm.is_reference:
                    reference = {r["task_id"]: r["output_ids"] for r in got}
                rows += got
        launches += [{"arm": a.key, **{k: r.get(k) for k in ("config_key", "load_s", "requests_s", "log",
                                                             "native_moe_audit", "model_path")}}
                     for a, r in zip(group, recs, strict=True)]
    out = {"arms": [asdict(a) | {"key": a.key} for a in arms(stage.params)], "prompts": len(reqs),
           "model_sha256": model_sha256 or _model_sha(stage),
           "rows": rows, "launches": launches, "stop": STOP, "indent": INDENT,
           "max_new_tokens": stage.params.server.cpu.trained.max_new_tokens}
    from ..core.files import write_json

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
    """Collect (or read the run's ``data/trained_corruption.json`` when it is complete for these
    arms and prompts), classify, summarise; writes ``data/trained_corruption_rows.json`` and
    ``data/trained_corruption_summary.json``. Returns ``{"data", "rows", "summary", "files",
    "standin"}`` (``standin``: :func:`.artifact.describe`)."""
    from ..core.files import write_json
    from .artifact import describe

    path = stage.paths.data("trained_corruption")
    model_sha = _model_sha(stage)  # hashed once: the reuse check and the record share it
    data = None
    if path.is_file():
        import json

        old = json.loads(path.read_text())
        if (old.get("arms"), old.get("prompts"), old.get("max_new_tokens"), old.get("model_sha256")) == (
                [asdict(a) | {"key": a.key} for a in arms(stage.params)], stage.params.server.cpu.trained.prompts,
                stage.params.server.cpu.trained.max_new_tokens, model_sha):
            data = old  # a continued run: the engine's answers for these arms and weights are recorded
    data = data or collect(stage, model_sha)
    rows = classify(data, sandbox=sandbox)
    summary = summarize(rows)
    files = {"raw": path, "rows": stage.paths.data("trained_corruption_rows"),
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

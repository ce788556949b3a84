"""The served corruption study's raw data: where it lives, its row schema, which tasks each claim uses.

**Files.** Every request of the served study (:mod:`nvfp4study.codeeval.served_collect`) is one
JSON line in ``data/corruption-raw-clamp=<mode>-sampling=<name>.jsonl``, appended and fsynced
as it arrives; the reasoning-parser probe writes
``data/corruption-probe-clamp=<mode>-parser=<parser>.jsonl``. The analysis reads only these
files, so ``-p replay_from=<run dir>`` (the one serving pipeline's replay,
:func:`nvfp4study.serving.measure.collect`, with the recorded run's own params,
:func:`nvfp4study.serving.measure.params_of`) re-analyses a recorded run and gives identical tables.

**Raw row schema** (``nvfp4study.codeeval.corruption-raw/1``, one JSON object per request): ``clamp``,
``sampling``, ``task_id``, ``source``, ``thinking``, ``temperature``, ``top_p``, ``top_k``,
``max_tokens``, ``stream``, ``reasoning_parser``, ``server`` (config key), ``status`` ("ok" or the
client's failure status), ``error``, ``content``, ``reasoning_content``, ``finish_reason``,
``completion_tokens``, ``end_s``, ``ttft_s``, ``t_wall``, ``request`` (the body sent),
``params_digest``.

**Claim sets.** A card claim with n tasks (``card.n`` in ``claims.yaml``: 15 for
``corruption.t0-off-15``, 10 for the others) uses the first n ids of
``corruption.claim_tasks``, by default the study's card-style tasks in order
(:data:`nvfp4study.codeeval.tasks.CARD_TASK_IDS`: binary_search, is_balanced, dedupe, merge_sorted,
two_sum, run_length_encode, evaluate_rpn, max_subarray_sum, flatten, word_frequencies,
first_unique_char, rotate_left, longest_common_prefix, remove_adjacent_duplicates,
fibonacci); with ``card_tasks: false`` the first n loaded tasks. The reasoning-parser probe
(:func:`probe_plan`) asks the first ``reasoning_probe_tasks`` of them with the first thinking-off
sampling configuration. The sweep itself asks, per sampling config, every loaded task
(``corruption.protocol: extended``) or only its claim's tasks (``card``: :func:`sweep_task_ids`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..core.errors import JsonlError, RawDataError, TaskSelectionError
from ..core.jsonl import append_jsonl, read_jsonl
from ..core.ledger import card_claims
from ..core.params import Params, SamplingConfig
from ..core.paths import RunPaths
from .tasks import CARD_TASK_IDS, load_tasks

RAW_STEM, PROBE_STEM = "corruption-raw", "corruption-probe"
ROW_SCHEMA = "nvfp4study.codeeval.corruption-raw/1"
SAMPLING_CLAIMS = ("corruption.t0-off-15", "corruption.t0-off-10", "corruption.t06-on",
                   "corruption.t06-off")
SERVED_CLAIMS = (*SAMPLING_CLAIMS, "corruption.executed", "serve.reasoning-parser")


# --- claim sets --------------------------------------------------------------------------------
def sampling_claims() -> list[dict[str, Any]]:
    """The card's four sampling claims from ``claims.yaml``: ``{id, sampling, n, card}``."""
    rows = {c["id"]: c for c in card_claims()}
    return [{"id": cid, "sampling": rows[cid]["card"]["sampling"], "n": int(rows[cid]["card"]["n"]),
             "card": rows[cid]["card"]} for cid in SAMPLING_CLAIMS if cid in rows]


def claim_task_ids(params: Params, n: int) -> list[str]:
    """The first ``n`` ids of the claim order (module docstring, "Claim sets").

    Raises:
        TaskSelectionError: ``corruption.claim_tasks`` names a task that is not loaded.
    """
    c = params.corruption
    loaded = [t.task_id for t in load_tasks(c.humaneval_count, c.card_tasks)]
    if c.claim_tasks:
        unknown = [t for t in c.claim_tasks if t not in set(loaded)]
        if unknown:
            raise TaskSelectionError(f"corruption.claim_tasks names tasks that are not loaded: {unknown}")
        order = list(c.claim_tasks)
    elif c.card_tasks:
        order = list(CARD_TASK_IDS)
    else:
        order = loaded
    return order[:n]


def claim_sets(params: Params) -> dict[str, list[str]]:
    """``{sampling name: task ids}`` of each card claim whose sampling config is in params."""
    names = {s.name for s in params.corruption.sampling}
    return {c["sampling"]: claim_task_ids(params, c["n"]) for c in sampling_claims()
            if c["sampling"] in names}


def sweep_task_ids(params: Params, sampling: SamplingConfig) -> list[str] | None:
    """The task ids the served sweep asks with ``sampling``, or None for every loaded task.

    ``corruption.protocol: card``: the tasks of the card claim that names this sampling config
    (:func:`claim_sets`: 15 for ``t0-off-a``, 10 for ``t0-off-b``, ``t06-on`` and ``t06-off``,
    the card's 45 requests per clamp mode); a config no claim names asks the largest claim set.
    ``extended``: None.

    Raises:
        TaskSelectionError: ``corruption.claim_tasks`` names a task that is not loaded.
    """
    if params.corruption.protocol == "extended":
        return None
    sets = claim_sets(params)
    if sampling.name in sets:
        return sets[sampling.name]
    return claim_task_ids(params, max((c["n"] for c in sampling_claims()), default=0))


# --- files -------------------------------------------------------------------------------------
def raw_path(paths: RunPaths, clamp: str, sampling: str) -> Path:
    """``data/corruption-raw-clamp=<clamp>-sampling=<sampling>.jsonl``."""
    return paths.data(RAW_STEM, "jsonl", clamp=clamp, sampling=sampling)


def probe_path(paths: RunPaths, clamp: str, parser: str) -> Path:
    """``data/corruption-probe-clamp=<clamp>-parser=<parser>.jsonl``."""
    return paths.data(PROBE_STEM, "jsonl", clamp=clamp, parser=parser)


def append_row(path: Path, row: dict[str, Any]) -> None:
    """Append one JSON line (non-ASCII kept as UTF-8) and fsync it; a last line cut by a crash
    is removed first (:func:`nvfp4study.core.jsonl.append_jsonl`)."""
    append_jsonl(path, row, ensure_ascii=False)


REQUIRED = ("clamp", "sampling", "task_id", "status")


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a raw JSONL file; a last line cut by a crash is dropped
    (:func:`nvfp4study.core.jsonl.read_jsonl`).

    Raises:
        RawDataError: a complete line that is not a JSON object, or a row without ``clamp``,
            ``sampling``, ``task_id`` and ``status``.
    """
    try:
        rows = read_jsonl(path)
    except JsonlError as exc:
        raise RawDataError(str(exc)) from None
    for i, row in enumerate(rows):
        if any(k not in row for k in REQUIRED):
            raise RawDataError(f"{path}: row {i + 1} is not a request row (needs {', '.join(REQUIRED)})")
    return rows


def latest(rows: list[dict[str, Any]], key=lambda r: r["task_id"]) -> dict[Any, dict[str, Any]]:
    """``{key: row}``: the last "ok" row of each key, or the last row when none is ok."""
    out: dict[Any, dict[str, Any]] = {}
    for row in rows:
        k = key(row)
        if k not in out or row.get("status") == "ok" or out[k].get("status") != "ok":
            out[k] = row
    return out


def probe_key(row: dict[str, Any]) -> tuple[str, bool]:
    """The key of a probe row for :func:`latest`: ``(task_id, stream)``."""
    return (row["task_id"], bool(row.get("stream")))


def probe_plan(params: Params) -> tuple[SamplingConfig, list[str]] | None:
    """(the thinking-off sampling config, task ids) of the reasoning-parser probe, or None when
    the probe is switched off or no sampling config has thinking off."""
    c = params.corruption
    if not c.reasoning_probe_parser or c.reasoning_probe_tasks <= 0:
        return None
    off = next((s for s in c.sampling if not s.thinking), None)
    if off is None:
        return None
    return off, claim_task_ids(params, c.reasoning_probe_tasks)


def expected_files(paths: RunPaths, params: Params) -> tuple[list[Path], Path | None]:
    """The raw files a complete study with ``params`` has, and its probe file (or None)."""
    c = params.corruption
    raws = [raw_path(paths, m, s.name) for m in c.clamp_modes for s in c.sampling]
    probe = probe_path(paths, c.after_mode, c.reasoning_probe_parser) if probe_plan(params) else None
    return raws, probe

"""Detector throughput on HumanEval's 164 canonical solutions (prompt + solution).

Prints snippets per second for: the whole detector on code (``detect_code``), the whole
detector on a chat completion (extraction + detection), pyflakes alone (parse + Checker), and
the detector on one junk variant per kind of every solution. Best of ``--repeat`` runs,
``time.perf_counter`` (monotonic); one process, one core.

    python benchmarks/bench_detect.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import ast
import time
from collections.abc import Callable

from pyflakes import checker

from nvfp4study.codeeval.detect import detect_code, detect_completion
from nvfp4study.codeeval.junk import make_variants, wrap_completion
from nvfp4study.codeeval.tasks import load_tasks


def best_rate(fn: Callable[[], int], repeat: int) -> tuple[float, int]:
    """(items per second of the fastest run, items per run)."""
    best, n = float("inf"), 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        n = fn()
        best = min(best, time.perf_counter() - t0)
    return n / best, n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    tasks = load_tasks(164, False)
    programs = [t.prompt + t.canonical_solution for t in tasks]
    completions = [(wrap_completion(p), t) for p, t in zip(programs, tasks, strict=True)]
    variants = [(v.completion, t) for t in tasks
                for v in make_variants(t.task_id, t.prompt, t.canonical_solution, per_kind=1, seed=0)]

    def code() -> int:
        return sum(1 for p in programs if detect_code(p) is not None)

    def completion() -> int:
        return sum(1 for c, t in completions
                   if detect_completion(c, prompt=t.prompt, entry_point=t.entry_point) is not None)

    def pyflakes_only() -> int:
        return sum(1 for p in programs if checker.Checker(ast.parse(p)) is not None)

    def junk() -> int:
        return sum(1 for c, t in variants
                   if detect_completion(c, prompt=t.prompt, entry_point=t.entry_point) is not None)

    print(f"{'what':<44} {'snippets/s':>11} {'ms/snippet':>11} {'n':>6}")
    for name, fn in [("detect_code, 164 canonical programs", code),
                     ("detect_completion, 164 wrapped programs", completion),
                     ("pyflakes alone (ast.parse + Checker)", pyflakes_only),
                     ("detect_completion, junk variants (7 kinds)", junk)]:
        rate, n = best_rate(fn, args.repeat)
        print(f"{name:<44} {rate:>11.0f} {1000 / rate:>11.2f} {n:>6}")


if __name__ == "__main__":
    main()

"""Detector throughput on HumanEval's 164 canonical solutions (prompt + solution).

Prints snippets per second for: the whole detector on code (``detect_code``), the whole
detector on a chat completion (extraction + detection), pyflakes alone (parse + Checker), and
the detector on one junk variant per kind of every solution. Best of ``--repeat`` runs,
``time.perf_counter`` (monotonic); one process, one core.

Then the hostile inputs of issue 14 (``detect_bytes`` on each, as ``nvfp4study detect`` reads a
file): the status it gives, the time (best of ``--repeat``) and the peak Python allocation
(``tracemalloc``, one extra run). Before the bounds of :mod:`nvfp4study.codeeval.bounds`, the
200k chains raised RecursionError and a 10 MB file ran over 120 s at 4.3 GB; the largest
input still judged (1 MB of HumanEval code) shows the cost the size bound allows.

    python benchmarks/bench_detect.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import ast
import time
import tracemalloc
from collections.abc import Callable

from pyflakes import checker

from nvfp4study.codeeval import recovery
from nvfp4study.codeeval.bounds import MAX_BYTES, MAX_LINES
from nvfp4study.codeeval.detect import detect_bytes, detect_code, detect_completion
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
    hostile(programs, args.repeat)


def hostile_inputs(programs: list[str]) -> dict[str, bytes]:
    """The hostile inputs: deep nesting, over-size files, and the largest inputs still judged."""
    corpus = "".join(programs)
    within = (corpus * (MAX_BYTES // len(corpus) + 1))[: MAX_BYTES - 1000]
    within = "\n".join(within.split("\n")[: MAX_LINES - 10])
    within = within[: within.rfind("\ndef ") + 1]  # whole functions only: clean code
    lines = within.split("\n")
    # as many broken lines as the recovery repairs, spread over the largest judged program
    step = len(lines) // (recovery.MAX_REPAIRS + 1)
    broken = "\n".join(ln + ")ulp(" if i % step == step - 1 and ln.strip() else ln
                       for i, ln in enumerate(lines))
    return {
        "200k '+1' chain": ("x = 1" + "+1" * 200_000 + "\n").encode(),
        "200k attribute chain a.a.a": ("x = a" + ".a" * 200_000 + "\n").encode(),
        "3,000 nested lambdas": ("f = " + "lambda: " * 3000 + "1\n").encode(),
        "19k-line '+1' chain in brackets": ("x = (1\n" + "+1\n" * 19_000 + ")\n").encode(),
        "100k '+1' chain in an f-string": ('x = f"{1' + "+1" * 100_000 + '}"\n').encode(),
        "500k '[' (deep JSON)": b"[" * 500_000,
        "10 MB file": b"x = 1\n" * 1_700_000,
        f"{len(within.encode()):,} B HumanEval code (judged)": within.encode(),
        f"same, {recovery.MAX_REPAIRS + 1} broken lines (judged)": broken.encode(),
    }


def hostile(programs: list[str], repeat: int) -> None:
    """Print status, best time and peak allocation of ``detect_bytes`` on each hostile input."""
    print(f"\n{'hostile input':<44} {'status':>10} {'s':>8} {'peak MB':>8}")
    for name, data in hostile_inputs(programs).items():
        best = float("inf")
        for _ in range(repeat):
            t0 = time.perf_counter()
            det = detect_bytes(data)
            best = min(best, time.perf_counter() - t0)
        tracemalloc.start()
        detect_bytes(data)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        print(f"{name:<44} {det.status:>10} {best:>8.3f} {peak / 2**20:>8.1f}")


if __name__ == "__main__":
    main()

"""Sandboxed executions per second over HumanEval's 164 canonical solutions.

Runs every canonical solution against its checks with :func:`nvfp4study.codeeval.sandbox.check_many`
under bubblewrap and under the plain-subprocess fallback (same runner, limits and watchdog),
with 1 and 2 workers, and prints executions/s (wall clock, ``time.perf_counter``) and the
median per-program duration the harness measured. Best of ``--repeat`` rounds.

    python benchmarks/bench_sandbox.py [--repeat 2] [--workers 1 2] [--count 164]
"""

from __future__ import annotations

import argparse
import statistics
import time

from nvfp4study.codeeval.isolation import sandbox_status
from nvfp4study.codeeval.sandbox import check_many
from nvfp4study.codeeval.tasks import humaneval_tasks
from nvfp4study.core.params import SandboxParams


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=2, help="rounds per setting (best is kept)")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--count", type=int, default=164, help="HumanEval problems (first N)")
    args = ap.parse_args()
    tasks = humaneval_tasks(args.count)
    items = [(t, t.canonical_solution) for t in tasks]
    print(f"{len(items)} canonical HumanEval solutions; bwrap: "
          f"{sandbox_status(SandboxParams())['bwrap_version'] or 'not installed'}")
    print(f"{'isolation':<11} {'workers':>7} {'exec/s':>8} {'median ms':>10} {'passed':>7}")
    for isolation in ("bwrap", "subprocess"):
        params = SandboxParams(isolation=isolation)
        try:
            status = sandbox_status(params)
        except Exception as exc:  # bwrap required but unusable here
            print(f"{isolation:<11} skipped: {exc}")
            continue
        for workers in args.workers:
            best, durations, passed = None, [], 0
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                results = check_many(items, params, workers=workers)
                dt = time.perf_counter() - t0
                if best is None or dt < best:
                    best = dt
                    durations = [r.duration_s for r in results]
                    passed = sum(r.passed for r in results)
            print(f"{status['isolation']:<11} {workers:>7} {len(items) / best:>8.1f} "
                  f"{1000 * statistics.median(durations):>10.1f} {passed:>4}/{len(items)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Time the SGLang clamp audit of each released tree, cold: one fresh process per release and run.

Each run imports the package and calls ``audit_release(version)`` (the wheel already unpacked in
``$NVFP4STUDY_CACHE``) in a new interpreter, so nothing parsed by an earlier run is reused, and
prints the wall time (``time.perf_counter``) and the CPU time of that call. Targets (issue 23):
at most 5 s for one release and 20 s for all five, on a 2-core machine; other load on the machine
shows in the wall times, so the minimum and the median over ``--repeat`` runs are printed.

    python benchmarks/bench_sglang_audit.py [--repeat 3] [--versions 0.5.19 0.5.23]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

from nvfp4study.sglang.releases import bailing_releases

_CHILD = """
import json, sys, time
from nvfp4study.sglang.audit import audit_release
t, c = time.perf_counter(), time.process_time()
audit_release(sys.argv[1])
print(json.dumps({"wall": time.perf_counter() - t, "cpu": time.process_time() - c}))
"""


def time_release(version: str) -> dict[str, float]:
    """``{"wall": s, "cpu": s}`` of one cold ``audit_release(version)`` in a new interpreter."""
    out = subprocess.run([sys.executable, "-c", _CHILD, version], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    """Print per release and in total the minimum and median wall (and CPU) seconds."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--versions", nargs="*", default=None, help="default: every release with BailingMoeV3 (the shipped discovery)")
    args = ap.parse_args(argv)
    versions = args.versions or bailing_releases()
    runs = {v: [] for v in versions}
    for _ in range(args.repeat):
        for v in versions:
            runs[v].append(time_release(v))
    for v, rs in runs.items():
        walls, cpus = [r["wall"] for r in rs], [r["cpu"] for r in rs]
        print(f"{v}: wall min {min(walls):.2f} s, median {statistics.median(walls):.2f} s; "
              f"cpu min {min(cpus):.2f} s")
    totals = [sum(runs[v][i]["wall"] for v in versions) for i in range(args.repeat)]
    print(f"all {len(versions)}: wall min {min(totals):.2f} s, median {statistics.median(totals):.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

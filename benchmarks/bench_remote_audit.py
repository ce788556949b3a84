"""Remote header audit of the full-size NVFP4 layout over a simulated link: requests, bytes, seconds.

Writes the full-size header-only layout (``nvfp4study make-checkpoint OUT --full-size
--header-only --layout nvfp4``: about 248k tensors in 64 shards, sparse weights, real [1] scales),
serves it with the test suite's fixture Hub server (``tests/hub_server.py``) adding ``--latency``
seconds per request and a shared ``--mbit`` link, and runs ``audit_checkpoint`` through a
``HubReader`` (headers by range, every global and input scale read: nothing sampled). The goal
in issue 15 is under 2 minutes at 100 Mbit/s and 50 ms.

    python benchmarks/bench_remote_audit.py [--latency 0.05] [--mbit 100] [--workers 64] [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from hub_server import HubServer, Repo  # noqa: E402
from nvfp4study.checkpoint.audit import audit_checkpoint  # noqa: E402
from nvfp4study.checkpoint.generate import write_checkpoint  # noqa: E402
from nvfp4study.checkpoint.remote import HubReader  # noqa: E402
from nvfp4study.core.hub import HubRef  # noqa: E402
from nvfp4study.core.params import LingShape  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--latency", type=float, default=0.05, help="seconds added to every request")
    ap.add_argument("--mbit", type=float, default=100.0, help="link speed shared by all responses")
    ap.add_argument("--workers", type=int, default=64, help="parallel range requests")
    ap.add_argument("--keep", help="use / keep the layout in this folder")
    args = ap.parse_args()
    tmp = None
    if args.keep and Path(args.keep).is_dir():
        root = Path(args.keep)
    else:
        tmp = None if args.keep else tempfile.mkdtemp(prefix="bench-remote-")
        root = Path(args.keep) if args.keep else Path(tmp) / "ckpt"
        t = time.perf_counter()
        write_checkpoint(LingShape(), root, shards=64, header_only=True, layout="nvfp4")
        print(f"layout written in {time.perf_counter() - t:.1f} s: {root}")
    total = sum(p.stat().st_size for p in root.iterdir())
    try:
        with HubServer([Repo("bench/ling-3.0-flash-nvfp4", root)], latency_s=args.latency,
                       bandwidth_bps=args.mbit * 1e6 / 8) as srv:
            os.environ["HF_ENDPOINT"] = srv.url
            t = time.perf_counter()
            reader = HubReader(HubRef("bench/ling-3.0-flash-nvfp4"), workers=args.workers)
            rep = audit_checkpoint(Path(reader.label), reader=reader)
            dt = time.perf_counter() - t
        m = rep.counts["measured"]
        print(f"link {args.mbit:g} Mbit/s, {1000 * args.latency:g} ms per request, {args.workers} parallel")
        print(f"tensors {m['total_tensors']} in {rep.size['shards']} shards; scales read: "
              f"{rep.input_scales.get('values_read')} ({reader.stats.ranges} ranges, none sampled)")
        print(f"requests {srv.requests}  bytes {srv.bytes} ({100 * srv.bytes / total:.4f} % of {total})  "
              f"seconds {dt:.1f}  (goal < 120)")
        print("audit timings: " + ", ".join(f"{k} {v:.1f} s" for k, v in rep.timings.items()))
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

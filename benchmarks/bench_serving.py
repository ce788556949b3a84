"""Time the serving harness itself (no GPU): launch -> healthy -> stop of a server process group,
and the client's streaming overhead, against the test fake of SGLang 0.5.23 (tests/fake_sglang.py).

Prints seconds per lifecycle and, for streamed requests, chunks/s and the client's share of the
wall time, so a regression in the harness is visible before it distorts a tok/s measurement.

    python benchmarks/bench_serving.py [--launches 3] [--requests 20] [--tokens 512]
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import fake_sglang  # noqa: E402
from nvfp4study.serving import client  # noqa: E402
from nvfp4study.serving.process import ServerProcess  # noqa: E402


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--launches", type=int, default=3)
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--tokens", type=int, default=512)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as td:
        exe = fake_sglang.make_interpreter(Path(td) / "env", step_s=0.0, prefill_s=0.0, starting_s=0.2)
        starts, stops = [], []
        for i in range(a.launches):
            port = _port()
            sp = ServerProcess([str(exe), "-c", "from sglang.cli.main import main", "serve", "--port", str(port),
                                "--host", "127.0.0.1", "--speculative-algorithm", "NEXTN",
                                "--speculative-num-steps", "2", "--speculative-num-draft-tokens", "3"],
                               Path(td) / f"{i}.log", "127.0.0.1", port, grace_s=5)
            t = time.monotonic()
            sp.start()
            sp.wait_healthy(30, 0.05)
            starts.append(time.monotonic() - t)
            if i == 0:
                walls, chunks = [], 0
                for _ in range(a.requests):
                    t = time.monotonic()
                    r = client.chat_completion(sp.base_url, [{"role": "user", "content": "bench"}], temperature=0,
                                               max_tokens=a.tokens, return_spec_tokens_details=True)
                    walls.append(time.monotonic() - t)
                    chunks += len(r["chunks"])
            t = time.monotonic()
            sp.stop()
            stops.append(time.monotonic() - t)
    print(f"launch -> healthy (fake, 0.2 s of 503): median {statistics.median(starts):.3f} s over {a.launches}")
    print(f"stop of the process group:              median {statistics.median(stops):.3f} s")
    print(f"streamed requests ({a.tokens} tokens, fake decode time 0): median {statistics.median(walls) * 1e3:.1f} ms, "
          f"{chunks / sum(walls):.0f} chunks/s through client + fake")
    return 0


if __name__ == "__main__":
    sys.exit(main())

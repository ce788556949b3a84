"""Drive llmcompressor's ``model_free_ptq``: its fused-map tables, a probe, a child interpreter.

The quantizer may live in another environment (``quantize.python``): :func:`run_ptq` then runs
:func:`ptq` there as ``python -m nvfp4study.checkpoint.ptq SPEC RESULT``.

2. Fused maps. llmcompressor 0.13.0 keeps two tables in
``llmcompressor/entrypoints/model_free/microscale.py``:

- ``DEFAULT_FUSED_MAPPINGS`` (microscale.py:27), read by ``build_microscale_inverse_weight_maps``
  (microscale.py:112): for every tensor matching a primary pattern, the partner tensors are
  loaded into the primary's shard job (and re-saved in that shard) — cross-shard pairing;
- ``_DEFAULT_FUSED_MAPPINGS_LIST`` (microscale.py:49), read by ``get_fused_names``
  (microscale.py:74), which ``validate_safetensors_index`` (validate.py:70) and
  ``process_file_microscale_scheme`` (process.py:171) call; the sets it finds get one
  ``FusionHandler`` (process.py:210), whose observers share one global scale computed from
  the largest absmax of the group (llmcompressor/observers/base.py:90-96), i.e. the
  smaller of the two global scales.

On the Ling layout the stock tables fail before quantizing anything, because an MLA layer has
``attention.q_proj`` without k/v. Which table trips first depends on the shard layout: when a
shard holds an MLA q_proj followed by a KDA q_proj, the list's q/k/v set matches q twice
("Matched a re:.*(attn|attention)\\.q_proj\\.weight$ twice before completing set"); otherwise
the dict asks for the MLA's missing partner ("Dependency weight model.layers.N.attention.v_proj.weight
not found in weight map"; k_proj or v_proj: set order). Ignoring MLA does not help: both
tables see every tensor name, ignored or not. The dict fails on every Ling layout; the list
only when a shard holds an MLA q_proj and a later q_proj (measured: the tiny default layout
trips it, the full-size header-only layout in 64 shards does not).
So both tables are emptied (the card's "fused expert maps emptied"). The stock expert names
(``mlp.experts.N.gate_proj``) never match the stock ``mlp\\.gate_proj`` rules anyway, so every
expert gets separate gate and up global scales. With ``share_gate_up_global_scale`` one rule
pairing ``mlp.experts.N.gate_proj`` with ``...up_proj`` goes into BOTH tables (the dict so a
pair split across shards is still fused, the list so the pair shares a FusionHandler).
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..core.errors import QuantizeFailed

LIB_DIR = Path(__file__).resolve().parents[2]


GATE_UP_PRIMARY = r"^(?P<prefix>.+?\.mlp\.experts\.\d+)\.gate_proj\.weight$"
GATE_UP_PARTNERS = ["{prefix}.up_proj.weight"]
GATE_UP_SET = [r"re:.*mlp\.experts\.\d+\.gate_proj\.weight$", r"re:.*mlp\.experts\.\d+\.up_proj\.weight$"]
FUSED_MODES = ("stock", "empty", "gate-up", "dict-emptied", "list-emptied")


@contextlib.contextmanager
def fused_tables(mode: str) -> Iterator[None]:
    """Set llmcompressor's two fused tables for the duration, restoring them after.

    Modes: ``stock`` (unchanged), ``empty`` (both emptied: the card's recipe), ``gate-up``
    (both emptied + the expert gate/up pairing rule), ``dict-emptied`` / ``list-emptied`` (only
    one emptied: probes showing both are needed). The tables are mutated in place because
    llmcompressor reads them as module globals at call time (microscale.py:74, :112).
    """
    if mode not in FUSED_MODES:
        raise ValueError(f"fused maps mode {mode!r}; valid: {', '.join(FUSED_MODES)}")
    from llmcompressor.entrypoints.model_free import microscale as ms

    saved_dict, saved_list = dict(ms.DEFAULT_FUSED_MAPPINGS), list(ms._DEFAULT_FUSED_MAPPINGS_LIST)
    try:
        if mode in ("empty", "gate-up", "dict-emptied"):
            ms.DEFAULT_FUSED_MAPPINGS.clear()
        if mode in ("empty", "gate-up", "list-emptied"):
            ms._DEFAULT_FUSED_MAPPINGS_LIST.clear()
        if mode == "gate-up":
            ms.DEFAULT_FUSED_MAPPINGS[GATE_UP_PRIMARY] = list(GATE_UP_PARTNERS)
            ms._DEFAULT_FUSED_MAPPINGS_LIST.append(list(GATE_UP_SET))
        yield
    finally:
        ms.DEFAULT_FUSED_MAPPINGS.clear()
        ms.DEFAULT_FUSED_MAPPINGS.update(saved_dict)
        ms._DEFAULT_FUSED_MAPPINGS_LIST[:] = saved_list


class _StopBeforeQuantizing(Exception):
    pass


def quantizing_calls(source: str) -> set[str]:
    """Names of the functions ``model_free_ptq``'s source calls with ``desc="Quantizing"``.

    llmcompressor 0.13.0 quantizes through ``exec_jobs(jobs, max_workers, desc="Quantizing")``
    (``entrypoints/model_free/__init__.py`` 101); 0.14.0 through
    ``exec_jobs_dynamic(..., desc="Quantizing")`` (same file, 111-117). The probe stops at
    whichever the installed release calls, read from its own source.
    """
    out = set()
    for node in ast.walk(ast.parse(textwrap.dedent(source))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and any(
                k.arg == "desc" and isinstance(k.value, ast.Constant) and k.value.value == "Quantizing"
                for k in node.keywords):
            out.add(node.func.id)
    return out


def ptq(src: str, out: str, *, scheme: str = "NVFP4A16", ignore: list[str], fused_maps: str = "gate-up",
        device: str = "cpu", max_workers: int = 1, probe: bool = False) -> dict[str, Any]:
    """Run ``llmcompressor.model_free_ptq`` in this process; never raises for its errors.

    ``probe=True`` stops after validation (before "Quantizing", found by :func:`quantizing_calls`):
    used to see whether a scheme / fused-table setting is accepted, at no quantization cost. A
    release whose quantizing step cannot be found gives ``ok: False`` rather than a full run.

    Returns:
        ``{"ok", "error_type", "error", "seconds" (wall, monotonic, of the call),
        "llmcompressor", "compressed_tensors", "fused_maps", "scheme", "probe"}``.
    """
    os.environ.setdefault("LLM_COMPRESSOR_LOG_LEVEL", "WARNING")  # read once, at llmcompressor's import
    import compressed_tensors
    import llmcompressor
    import llmcompressor.entrypoints.model_free as mf

    res: dict[str, Any] = {"ok": False, "error_type": None, "error": None, "seconds": None,
                           "llmcompressor": llmcompressor.__version__,
                           "compressed_tensors": compressed_tensors.__version__,
                           "fused_maps": fused_maps, "scheme": scheme, "probe": probe}
    stops = quantizing_calls(inspect.getsource(mf.model_free_ptq)) if probe else set()
    if probe and not all(callable(getattr(mf, n, None)) for n in stops) or probe and not stops:
        res["error_type"] = "ProbeUnsupported"
        res["error"] = (f"llmcompressor {llmcompressor.__version__}: no quantizing step found in model_free_ptq "
                        f"(calls with desc='Quantizing': {sorted(stops)}); refusing to run a full quantization as a probe")
        return res
    real = {n: getattr(mf, n) for n in stops}

    def stopper(fn: Any) -> Any:
        def stop(*a: Any, **k: Any) -> Any:
            if k.get("desc") == "Quantizing":
                raise _StopBeforeQuantizing
            return fn(*a, **k)
        return stop

    t0 = time.monotonic()
    try:
        jobs = [getattr(mf, n, None) for n in quantizing_calls(inspect.getsource(mf.model_free_ptq))]
        with fused_tables(fused_maps), notebook_progress(jobs):
            for n, fn in real.items():
                setattr(mf, n, stopper(fn))
            mf.model_free_ptq(src, out, scheme=scheme, ignore=list(ignore), max_workers=max_workers,
                              device=device)
        res["ok"] = True
    except _StopBeforeQuantizing:
        res["ok"] = True
    except Exception as exc:  # the tool's own error is the measurement
        res["error_type"], res["error"] = type(exc).__name__, str(exc)
    finally:
        for n, fn in real.items():
            setattr(mf, n, fn)
        res["seconds"] = time.monotonic() - t0
    return res


def _in_kernel() -> bool:
    """True inside a Jupyter kernel (where text progress bars print as red stderr lines)."""
    shell = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})


@contextlib.contextmanager
def notebook_progress(funcs: list[Any]) -> Iterator[None]:
    """Inside a Jupyter kernel, let the job runners of ``model_free_ptq`` draw their tqdm bars as
    widgets: compressed-tensors' ``exec_jobs`` (``entrypoints/convert/convert_checkpoint.py``
    10, 125, 131) looks up ``tqdm.tqdm`` in its module's globals at call time, so that name is
    pointed at ``tqdm.auto`` for the call and restored after. Outside a kernel: nothing changes."""
    import types

    if not _in_kernel():
        yield
        return
    import tqdm
    import tqdm.auto

    swapped = []
    for fn in funcs:
        g = getattr(fn, "__globals__", None)
        if g is None:
            continue
        old = g.get("tqdm")
        if old is tqdm:
            swapped.append((g, old))
            g["tqdm"] = types.SimpleNamespace(tqdm=tqdm.auto.tqdm)
        elif old is tqdm.tqdm:
            swapped.append((g, old))
            g["tqdm"] = tqdm.auto.tqdm
    try:
        yield
    finally:
        for g, old in swapped:
            g["tqdm"] = old


@contextlib.contextmanager
def terminate_as_exit() -> Iterator[None]:
    """Within the block, SIGTERM raises ``SystemExit(143)`` (in the main thread), so the cleanup
    that runs on SIGINT's KeyboardInterrupt (``finally`` / ``except BaseException``) runs too.

    The signal can land inside library code that turns the exception into its own error (torch's
    storage pickling raised ``ValueError: could not determine the shape of object type
    'torch.storage.UntypedStorage'``, which ``model_free_ptq``'s caller then reports as a failed
    quantization): once SIGTERM has arrived, whatever leaves the block leaves as ``SystemExit(143)``."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []

    def on_term(signum: int, frame: Any) -> None:
        received.append(signum)
        raise SystemExit(128 + signum)

    old = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    except BaseException:
        if received:
            raise SystemExit(128 + received[0]) from None
        raise
    finally:
        signal.signal(signal.SIGTERM, old)
    if received:  # the library swallowed it and carried on: still a terminated run
        raise SystemExit(128 + received[0])


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Send everything written to stdout (file descriptor 1 and ``sys.stdout``) to stderr for the
    block: llmcompressor's loguru sink is bound to the stdout stream object at its import
    (``llmcompressor/logger.py`` ``configure_logger``: ``logger.add(sys.stdout, ...)``), so
    ``redirect_stdout`` alone cannot move it; the descriptor-level ``dup2`` does."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def run_ptq(spec: dict[str, Any], python: str | None = None) -> dict[str, Any]:
    """:func:`ptq` here, or in the interpreter ``python`` (``python -m nvfp4study.checkpoint.ptq
    SPEC RESULT``) when the quantizer lives in another environment.

    Raises:
        QuantizeFailed: the child process died without a result.
    """
    if not python:
        return ptq(**spec)
    with tempfile.TemporaryDirectory(prefix="nvfp4study-ptq-") as td:
        sp, rp = Path(td) / "spec.json", Path(td) / "result.json"
        sp.write_text(json.dumps(spec))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(LIB_DIR), os.environ.get("PYTHONPATH")])))
        t0 = time.monotonic()
        tail: list[str] = []
        # the child's output (progress bars, warnings) is streamed to our stderr as it comes
        with subprocess.Popen([python, "-m", "nvfp4study.checkpoint.ptq", str(sp), str(rp)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
            assert proc.stdout is not None
            try:
                for line in proc.stdout:
                    sys.stderr.write(line)
                    tail = (tail + [line.rstrip()])[-5:]
            except BaseException:  # interrupted or terminated: the child goes with us
                proc.kill()
                raise
        if not rp.exists():
            raise QuantizeFailed(f"quantizer process {python} exited {proc.returncode} without a result: "
                                 f"{' | '.join(t for t in tail if t)}")
        res = json.loads(rp.read_text())
        res["python"], res["process_seconds"] = python, time.monotonic() - t0
        return res


def _child(spec_path: str, result_path: str) -> int:
    res = ptq(**json.loads(Path(spec_path).read_text()))
    Path(result_path).write_text(json.dumps(res))
    return 0



def main(argv: list[str]) -> int:
    """``python -m nvfp4study.checkpoint.ptq SPEC RESULT``: :func:`ptq` of a JSON spec (the child side
    of :func:`run_ptq`)."""
    return _child(argv[0], argv[1])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

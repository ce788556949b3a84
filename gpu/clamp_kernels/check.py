"""Which SwiGLU clamp form do FlashInfer 0.7.2's CUTLASS MoE and SGLang 0.5.23's Triton MoE compute?

Runs on a CUDA GPU (SM90 for the FlashInfer part) after ``build.py``; writes one JSON. Usage:

    python gpu/clamp_kernels/check.py --work gpu/clamp_kernels/.build --out result.json

Runs, each at limits 4, 5 and 7 and with no limit, on the probe inputs of ``probes.py``:
- FlashInfer ``cutlass_fused_moe`` (``flashinfer/fused_moe/core.py`` 1297) with activation
  ``Swiglu`` and alpha/beta/limit built by SGLang 0.5.23's ``materialize_swiglu_params_for_cutlass``
  (``layers/moe/moe_runner/flashinfer_cutlass.py`` 73-109) and ``_activation_type``
  (same file 184-205), as ``_run_flashinfer_cutlass`` passes them (371-392); the same with
  ``gemm1_alpha`` set; activation ``SwigluBias`` and ``SwigluStep`` with an explicit limit;
- SGLang ``fused_experts`` (``triton_utils/fused_moe.py`` 304) with ``gemm1_clamp_limit``, and
  with ``gemm1_alpha`` too (``gate_up_interleaved=False``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import probes  # noqa: E402

LIMITS = (4.0, 5.0, 7.0, None)
ALPHA = 1.702  # GPT-OSS's gemm1_alpha, only to exercise the alpha path
SEED_BASE = 1000
NUM_EXPERTS, TOKENS, INTER = 4, 256, 256


def _cmd(args: list[str]) -> str:
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError) as e:
        return f"unavailable: {e}"


def environment() -> dict:
    """GPU, driver, CUDA, torch, Triton and host facts of this machine."""
    import torch
    import triton

    smi = _cmd(["nvidia-smi", "--query-gpu=name,driver_version,compute_cap", "--format=csv,noheader"])
    return {
        "gpu": torch.cuda.get_device_name(0),
        "capability": ".".join(map(str, torch.cuda.get_device_capability(0))),
        "nvidia_smi": smi,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "triton": triton.__version__,
        "nvcc": _cmd(["nvcc", "--version"]).splitlines()[-1:],
        "python": platform.python_version(),
        "host": platform.node(),
        "cpus": os.cpu_count(),
    }


def _seed(i: int) -> int:
    return SEED_BASE + i


def _limit_key(limit: float | None) -> str:
    return "none" if limit is None else f"{limit:g}"


def run_triton(sglang_root: Path) -> dict:
    """SGLang 0.5.23's Triton MoE on the probes; per-run comparisons, or the error."""
    import sgl_env
    import torch

    sgl_env.install(str(sglang_root))
    fm = sgl_env.import_module("sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe")
    cfg = sgl_env.import_module(
        "sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe_triton_config")
    align = sgl_env.import_module(
        "sglang.srt.layers.moe.moe_runner.triton_utils.moe_align_block_size")
    base = sgl_env.import_module("sglang.srt.layers.moe.moe_runner.base")
    sgl_env.one_gpu_context(fm, cfg)
    align.sgl_moe_align_block_size = sgl_env.moe_align_block_size_torch
    sgl_env.RECORD["patched"].append(f"{align.__name__}.sgl_moe_align_block_size")
    out: dict = {"function": f"{fm.__name__}.fused_experts", "source_file": fm.__file__,
                 "runs": {}}
    for i, limit in enumerate(LIMITS):
        probe = probes.make_probe(7.0 if limit is None else limit, tokens=TOKENS, inter=INTER,
                                  num_experts=NUM_EXPERTS, seed=_seed(i))
        w1, w2 = probes.probe_weights(probe, gate_first=True)
        x = probe.x.cuda()
        w1, w2 = w1.cuda(), w2.cuda()
        topk = (probe.topk_weights.cuda(), probe.topk_ids.cuda(), None)
        variants = [("clamp", None)] + ([("clamp_alpha", ALPHA)] if limit is not None else [])
        for name, alpha in variants:
            key = f"{name}/L={_limit_key(limit)}"
            rc = base.MoeRunnerConfig(
                num_experts=NUM_EXPERTS, num_local_experts=NUM_EXPERTS, top_k=2,
                activation="silu", is_gated=True, inplace=False, gemm1_clamp_limit=limit,
                gemm1_alpha=alpha, gate_up_interleaved=False, params_dtype=torch.bfloat16)
            t0 = time.time()
            try:
                y = fm.fused_experts(x, w1, w2, topk, rc)
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001 - recorded in the JSON, the other runs go on
                out["runs"][key] = {"error": f"{type(e).__name__}: {e}"[:2000],
                                    "traceback": traceback.format_exc()[-3000:]}
                continue
            beta = 1.0 if alpha is not None else 0.0
            res = probes.compare(y, probe, limit, alpha=alpha or 1.0, beta=beta)
            res.update({"limit": limit, "gemm1_alpha": alpha, "seed": probe.seed,
                        "seconds": round(time.time() - t0, 2),
                        "form_params": {"alpha": alpha or 1.0, "beta": beta}})
            out["runs"][key] = res
    out["environment_answers"] = dict(sgl_env.RECORD)
    return out


def _sglang_cutlass_helpers(sglang_root: Path):
    """SGLang's own ``materialize_swiglu_params_for_cutlass`` and ``_activation_type`` if importable.

    Returns (materialize, activation_type, MoeRunnerConfig, how). When
    ``flashinfer_cutlass.py`` cannot be imported here, ``materialize`` is a copy of its logic
    (``layers/moe/moe_runner/flashinfer_cutlass.py`` 73-109: alpha = gemm1_alpha or 1.0,
    beta = gemm1_beta or (1.0 if gemm1_alpha else 0.0), limit = gemm1_clamp_limit or
    swiglu_limit, all None without a limit) and the activation is ``Swiglu``
    (``get_activation_type("silu", is_gated=True)``, flashinfer_cutlass.py 184-205).
    """
    import sgl_env

    sgl_env.install(str(sglang_root))
    base = sgl_env.import_module("sglang.srt.layers.moe.moe_runner.base")
    try:
        fc = sgl_env.import_module("sglang.srt.layers.moe.moe_runner.flashinfer_cutlass")
        return fc.materialize_swiglu_params_for_cutlass, fc._activation_type, \
            base.MoeRunnerConfig, f"called SGLang's own functions from {fc.__file__}"
    except Exception as e:  # noqa: BLE001 - fall back to the copied logic, say so
        import torch
        from flashinfer.tllm_enums import ActivationType

        def materialize(rc, n, device):
            lim = rc.gemm1_clamp_limit or rc.swiglu_limit
            if lim is None:
                return None, None, None
            a = rc.gemm1_alpha if rc.gemm1_alpha is not None else 1.0
            b = rc.gemm1_beta if rc.gemm1_beta is not None else (
                1.0 if rc.gemm1_alpha is not None else 0.0)
            return tuple(torch.full((n,), float(v), dtype=torch.float32, device=device)
                         for v in (a, b, lim))

        return materialize, (lambda rc: ActivationType.Swiglu), base.MoeRunnerConfig, \
            f"copied logic (flashinfer_cutlass.py 73-109, 184-205): import failed: {e}"[:600]


def run_flashinfer(sglang_root: Path) -> dict:
    """FlashInfer 0.7.2's CUTLASS fused MoE (BF16 subset) on the probes."""
    import fi_subset
    import torch

    fi_subset.install()
    import flashinfer
    from flashinfer.fused_moe import cutlass_fused_moe
    from flashinfer.tllm_enums import ActivationType

    materialize, act_type, RunnerConfig, how = _sglang_cutlass_helpers(sglang_root)
    out: dict = {"flashinfer_version": flashinfer.__version__, "sglang_helpers": how, "runs": {}}
    n = NUM_EXPERTS

    def call(probe, fc1, fc2, activation, alpha_t, beta_t, limit_t):
        y = cutlass_fused_moe(
            input=probe.x.cuda(), token_selected_experts=probe.topk_ids.cuda().to(torch.int),
            token_final_scales=probe.topk_weights.cuda(), fc1_expert_weights=fc1,
            fc2_expert_weights=fc2, output_dtype=torch.bfloat16, quant_scales=[],
            swiglu_alpha=alpha_t, swiglu_beta=beta_t, swiglu_limit=limit_t,
            activation_type=activation)
        if isinstance(y, (list, tuple)):
            y = y[0]
        torch.cuda.synchronize()
        return y

    # fc1 order: FlashInfer reads [up; gate]; check it on the no-limit run before the clamp runs.
    order_probe = probes.make_probe(7.0, tokens=TOKENS, inter=INTER, num_experts=n, seed=_seed(9))
    order = {}
    for gate_first in (False, True):
        fc1, fc2 = (w.cuda() for w in probes.probe_weights(order_probe, gate_first=gate_first))
        y = call(order_probe, fc1, fc2, ActivationType.Swiglu, None, None, None)
        r = probes.compare(y, order_probe, None)
        order["gate_first" if gate_first else "up_first"] = r["unclamped/once"]["max_abs"]
    gate_first = order["gate_first"] < order["up_first"]
    out["fc1_order"] = {"max_abs_vs_plain_swiglu": order,
                        "used": "[gate; up]" if gate_first else "[up; gate]",
                        "seed": order_probe.seed}
    dev = torch.device("cuda")
    for i, limit in enumerate(LIMITS):
        probe = probes.make_probe(7.0 if limit is None else limit, tokens=TOKENS, inter=INTER,
                                  num_experts=n, seed=_seed(i))
        fc1, fc2 = (w.cuda() for w in probes.probe_weights(probe, gate_first=gate_first))
        lim_t = None if limit is None else torch.full((n,), limit, dtype=torch.float32, device=dev)
        ones = torch.ones(n, dtype=torch.float32, device=dev)
        zeros = torch.zeros(n, dtype=torch.float32, device=dev)
        runs = []
        for alpha in ((None, ALPHA) if limit is not None else (None,)):
            rc = RunnerConfig(num_experts=n, num_local_experts=n, top_k=2, activation="silu",
                              is_gated=True, gemm1_clamp_limit=limit, gemm1_alpha=alpha)
            a_t, b_t, l_t = materialize(rc, n, dev)
            try:
                act = act_type(rc)
                act_how = "SGLang's _activation_type (flashinfer_cutlass.py 184-205)"
            except Exception as e:  # noqa: BLE001 - its lazy import needs a full SGLang install
                act = ActivationType.Swiglu
                act_how = (f"Swiglu, as get_activation_type('silu', is_gated=True) gives "
                           f"(flashinfer_cutlass.py 184-205); calling it failed: "
                           f"{type(e).__name__}: {e}")[:400]
            runs.append((
                "sglang_swiglu" if alpha is None else "sglang_swiglu_alpha", act, a_t, b_t, l_t,
                {"alpha": float(a_t[0]) if a_t is not None else 1.0,
                 "beta": float(b_t[0]) if b_t is not None else 0.0},
                {"gemm1_clamp_limit": limit, "gemm1_alpha": alpha, "activation_from": act_how,
                 "materialized": None if a_t is None else
                 [float(a_t[0]), float(b_t[0]), float(l_t[0])]}))
        runs.append(("swiglu_bias", ActivationType.SwigluBias, ones, zeros, lim_t,
                     {"alpha": 1.0, "beta": 0.0}, {}))
        runs.append(("swiglu_step", ActivationType.SwigluStep, None, None, lim_t,
                     {"alpha": 1.0, "beta": 0.0}, {}))
        for name, act, a_t, b_t, l_t, fp, extra in runs:
            key = f"{name}/L={_limit_key(limit)}"
            t0 = time.time()
            try:
                y = call(probe, fc1, fc2, act, a_t, b_t, l_t)
            except Exception as e:  # noqa: BLE001 - recorded, the other runs go on
                out["runs"][key] = {"error": f"{type(e).__name__}: {e}"[:2000]}
                continue
            res = probes.compare(y, probe, limit, alpha=fp["alpha"], beta=fp["beta"])
            if limit is None:
                res["at_limit_7"] = probes.compare(y, probe, 7.0, alpha=fp["alpha"],
                                                   beta=fp["beta"])
            res.update({"activation": act.name, "limit": limit, "seed": probe.seed,
                        "form_params": fp, "seconds": round(time.time() - t0, 2), **extra})
            out["runs"][key] = res
    out["subset"] = {k: v for k, v in fi_subset.install().items() if k != "installed"}
    return out


def relativize(obj, root: str):
    """``obj`` with every string's ``root/`` prefix (the repository root) removed, recursively."""
    if isinstance(obj, str):
        return obj.replace(root.rstrip("/") + "/", "")
    if isinstance(obj, dict):
        return {k: relativize(v, root) for k, v in obj.items()}
    if isinstance(obj, list):
        return [relativize(v, root) for v in obj]
    return obj


def main(argv: list[str] | None = None) -> int:
    """Run both parts, write the JSON; exit 0 when at least one part ran."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=HERE / ".build", help="build.py's folder")
    ap.add_argument("--out", type=Path, required=True, help="JSON to write")
    ap.add_argument("--skip-flashinfer", action="store_true")
    ap.add_argument("--skip-triton", action="store_true")
    a = ap.parse_args(argv)
    a.work = a.work.resolve()
    sys.path.insert(0, str(a.work / "site"))
    os.environ.setdefault("FLASHINFER_WORKSPACE_BASE", str(a.work / "ws"))
    sglang_root = a.work / "sglang"
    started = time.time()
    doc: dict = {"what": "SwiGLU clamp forms of FlashInfer's CUTLASS MoE and SGLang's Triton MoE, "
                         "measured on probe inputs (gpu/clamp_kernels)",
                 "date_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                 "environment": environment(),
                 "probe": {"tokens": TOKENS, "inter": INTER, "hidden": 2 * INTER,
                           "experts": NUM_EXPERTS, "top_k": 2, "router_weights": [0.5, 0.5],
                           "limits": list(LIMITS), "alpha_runs": ALPHA,
                           "seeds": {(_limit_key(li)): _seed(i) for i, li in enumerate(LIMITS)},
                           "dtype": "bfloat16"}}
    build_json = a.work / "build.json"
    doc["build"] = json.loads(build_json.read_text()) if build_json.exists() else None
    sv = next(iter(sorted((a.work / "sglang").glob("sglang-*.dist-info"))), None)
    doc["sglang_version"] = sv.name.removesuffix(".dist-info").split("-")[1] if sv else None
    for part, fn, skip in (("sglang_triton", run_triton, a.skip_triton),
                           ("flashinfer_cutlass", run_flashinfer, a.skip_flashinfer)):
        if skip:
            doc[part] = {"skipped": True}
            continue
        try:
            doc[part] = fn(sglang_root)
        except Exception as e:  # noqa: BLE001 - recorded; the other part still runs
            doc[part] = {"error": f"{type(e).__name__}: {e}"[:3000],
                         "traceback": traceback.format_exc()[-4000:]}
        print(f"[clamp-check] {part}: " + ("error: " + doc[part]["error"][:300]
                                          if "error" in doc[part] else "ran"), flush=True)
    doc["seconds"] = round(time.time() - started, 1)
    doc = relativize(doc, str(HERE.parent.parent))
    doc["paths"] = "relative to the repository root"
    a.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = a.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=False) + "\n")
    tmp.replace(a.out)
    print(f"[clamp-check] wrote {a.out}", flush=True)
    ok = any("runs" in doc.get(p, {}) for p in ("sglang_triton", "flashinfer_cutlass"))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""The CPU engine's native MoE patches (``native-clamp-exact`` / ``native-clamp-approx``,
``native-routed-scaling``; ``nvfp4study.sglang.patch.NATIVE_AXES``): the patched
``moe_forward_native`` and ``UnquantizedFusedMoEMethod.forward_cpu`` run by SGLang's own
environment against an independent torch computation (each SwiGLU form; the routed scaling factor
once), the audit's reading of the patched tree, the byte-for-byte revert, and the switch the
CPU-engine launcher uses."""

from __future__ import annotations

import contextlib
import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nvfp4study.core.errors import PatchConflict, UnknownPatchMode
from nvfp4study.sglang import patch as sp
from nvfp4study.sglang.audit import audit_tree
from sglang_fixtures import copy23_shared_fixture, mini_tree, released  # noqa: F401  (the copy23_shared fixture)

NATIVE = "sglang/srt/layers/moe/fused_moe_native.py"
UNQUANT = "sglang/srt/layers/quantization/unquant.py"
FACTOR = 2.5  # Ling's routed_scaling_factor
LIMIT = 1.0
#: experts, hidden, intermediate, tokens, top-k: small enough for a one-second run
E, H, N, T, K = 4, 16, 8, 6, 2

#: runs in .venv-sglang: loads each patched copy of fused_moe_native.py as its own module and runs
#: moe_forward_native on the saved inputs with Ling's config (silu, limit set, no alpha)
RUNNER = """
import importlib.util, sys, types, torch
from sglang.srt.layers.moe.moe_runner import MoeRunnerConfig
inp = torch.load(sys.argv[1])
out = {}
for name, path in zip(sys.argv[3::2], sys.argv[4::2]):
    spec = importlib.util.spec_from_file_location("native_" + name.replace("-", "_"), path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    layer = types.SimpleNamespace(num_experts=inp["w13"].shape[0], w13_weight=inp["w13"], w2_weight=inp["w2"])
    cfg = MoeRunnerConfig(activation="silu", gemm1_clamp_limit=inp["limit"])
    out[name] = mod.moe_forward_native(layer, inp["x"], (inp["weights"], inp["ids"], None), cfg)
torch.save(out, sys.argv[2])
"""

#: runs in .venv-sglang: UnquantizedFusedMoEMethod.forward_cpu of each copy of unquant.py on the
#: native (non-AMX) branch, with top-k weights as released top-k gives them ("plain") and as a
#: top-k that folds the factor in gives them ("fused": weights x factor and the layer says so)
SCALE_RUNNER = """
import importlib.util, sys, types, torch
from sglang.srt.layers.moe.moe_runner import MoeRunnerConfig
inp = torch.load(sys.argv[1])
out = {}
for name, path in zip(sys.argv[3::2], sys.argv[4::2]):
    spec = importlib.util.spec_from_file_location("unquant_" + name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for fused in (False, True):
        layer = types.SimpleNamespace(num_experts=inp["w13"].shape[0], w13_weight=inp["w13"], w2_weight=inp["w2"],
                                      should_fuse_routed_scaling_factor_in_topk=fused)
        method = types.SimpleNamespace(moe_runner_config=MoeRunnerConfig(
            activation="silu", routed_scaling_factor=inp["factor"]))
        weights = inp["weights"] * inp["factor"] if fused else inp["weights"]
        d = types.SimpleNamespace(hidden_states=inp["x"], topk_output=(weights, inp["ids"], None))
        res = mod.UnquantizedFusedMoEMethod.forward_cpu(method, layer, d)
        out[name + ("-fused" if fused else "-plain")] = res.hidden_states
torch.save(out, sys.argv[2])
"""


def _inputs() -> dict:
    """Float64 inputs whose gate pre-activations reach well above the limit (std about 3), so the
    post-SiLU, pre-SiLU and unclamped forms give different outputs."""
    g = torch.Generator().manual_seed(7)
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)]).to(torch.int32)
    w = torch.rand(T, K, generator=g, dtype=torch.float64) + 0.1
    return {"x": torch.randn(T, H, generator=g, dtype=torch.float64),
            "w13": torch.randn(E, 2 * N, H, generator=g, dtype=torch.float64) * 0.75,
            "w2": torch.randn(E, H, N, generator=g, dtype=torch.float64) * 0.3,
            "weights": w / w.sum(1, keepdim=True), "ids": ids, "limit": LIMIT, "factor": FACTOR}


def _reference(inp: dict, form: str) -> torch.Tensor:
    """The routed MoE output token by token, expert by expert, written out here: gate = the first
    half of w13 @ x, up = the second; post: min(silu(g), L) * clamp(u, -L, L) (Ling's form);
    pre: silu(min(g, L)) * clamp(u, -L, L) (GPT-OSS); none: silu(g) * u."""
    out = torch.zeros(T, H, dtype=torch.float64)
    for t in range(T):
        for k in range(K):
            e = int(inp["ids"][t, k])
            h = inp["w13"][e] @ inp["x"][t]
            gate, up = h[:N], h[N:]
            if form == "none":
                act = torch.nn.functional.silu(gate) * up
            else:
                gate = torch.nn.functional.silu(gate).clamp(max=LIMIT) if form == "post" else \
                    torch.nn.functional.silu(gate.clamp(max=LIMIT))
                act = gate * up.clamp(-LIMIT, LIMIT)
            out[t] += inp["weights"][t, k] * (inp["w2"][e] @ act)
    return out


def _patched_copies(tree, tmp_path: Path) -> dict[str, Path]:
    """``fused_moe_native.py`` as released and under each native clamp mode (each applied to the
    tree, copied out and reverted)."""
    files = {"released": tmp_path / "released.py"}
    files["released"].write_bytes(tree.file(NATIVE).read_bytes())
    for value, mode in sp.NATIVE_AXES["moe_clamp"].items():
        sp.apply(tree, mode)
        files[value] = tmp_path / f"{value}.py"
        files[value].write_bytes(tree.file(NATIVE).read_bytes())
        sp.revert(tree, mode)
    return files


def _run_native(files: dict[str, Path], tmp_path: Path, runner: str = RUNNER) -> dict[str, torch.Tensor]:
    from cpu_engine_fixtures import require_sglang_env
    from nvfp4study.serving.cpu_engine import engine_env

    python = require_sglang_env()
    inp, out = tmp_path / "in.pt", tmp_path / "out.pt"
    torch.save(_inputs(), inp)
    args = [a for name, f in files.items() for a in (name, str(f))]
    env = {k: v for k, v in __import__("os").environ.items() if k != "PYTHONPATH"} | engine_env()
    run = subprocess.run(["nice", str(python), "-c", runner, str(inp), str(out), *args], env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return torch.load(out)


def test_patched_native_moe_computes_each_form(copy23_shared, tmp_path):
    """SGLang's own moe_forward_native, as released and under each patch, against the reference:
    released = the clamp dropped, exact = Ling's post-SiLU form, approx = the pre-SiLU form. The
    inputs separate the three forms, so a swapped body (exact computing pre) fails here."""
    inp = _inputs()
    ref = {f: _reference(inp, f) for f in ("none", "pre", "post")}
    assert (ref["post"] - ref["pre"]).abs().max() > 1e-2  # the inputs separate the forms
    assert (ref["post"] - ref["none"]).abs().max() > 1e-2
    got = _run_native(_patched_copies(copy23_shared, tmp_path), tmp_path)
    for value, form in (("released", "none"), ("exact", "post"), ("approx", "pre")):
        torch.testing.assert_close(got[value], ref[form], rtol=1e-10, atol=1e-10, msg=value)
        others = [f for f in ref if f != form]
        assert all((got[value] - ref[o]).abs().max() > 1e-3 for o in others), value


def _bytes(tree) -> dict[str, str]:
    return {str(p.relative_to(tree.root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(tree.package.rglob("*.py"))}


def _native_verdict(tree) -> str:
    (row,) = audit_tree(tree, ["fused-moe-native"])
    return row.verdict.value


def test_native_modes_audit_and_revert_byte_for_byte(copy23_shared):
    """Released the audit reads the native path DROPPED; under native-clamp-exact EXACT, under
    native-clamp-approx APPROX (read from the patched function's body); the two exclude each other;
    revert restores every byte; the NVFP4 clamp mode is untouched throughout."""
    before = _bytes(copy23_shared)
    assert _native_verdict(copy23_shared) == "DROPPED"
    for value, verdict in (("exact", "EXACT"), ("approx", "APPROX")):
        mode = sp.NATIVE_AXES["moe_clamp"][value]
        assert sp.apply(copy23_shared, mode) and sp.apply(copy23_shared, mode) == []
        st = sp.status(copy23_shared)
        assert (st["clamp_mode"], st["native"], sp.verify(copy23_shared, mode)["ok"]) == \
            ("stock", {"moe_clamp": value, "routed_scaling": "released"}, True)
        assert _native_verdict(copy23_shared) == verdict
        other = next(m for v, m in sp.NATIVE_AXES["moe_clamp"].items() if v != value)
        patched = copy23_shared.file(NATIVE).read_bytes()
        with pytest.raises(PatchConflict):
            sp.apply(copy23_shared, other)
        assert copy23_shared.file(NATIVE).read_bytes() == patched
        assert sp.revert(copy23_shared, mode)
    assert _bytes(copy23_shared) == before
    assert sp.status(copy23_shared)["native"] == {"moe_clamp": "released", "routed_scaling": "released"}


def test_routed_scaling_applied_exactly_once(copy23_shared, tmp_path):
    """forward_cpu's native branch, released and under native-routed-scaling, against the MoE sum
    written out here: released drops the factor (1 x); the patch applies it once (2.5 x, not
    6.25 x), and not again when top-k already folded it into the weights."""
    before = _bytes(copy23_shared)
    files = {"released": tmp_path / "released.py", "applied": tmp_path / "applied.py"}
    files["released"].write_bytes(copy23_shared.file(UNQUANT).read_bytes())
    assert sp.apply(copy23_shared, "native-routed-scaling") and sp.apply(copy23_shared, "native-routed-scaling") == []
    assert sp.status(copy23_shared)["native"] == {"moe_clamp": "released", "routed_scaling": "applied"}
    files["applied"].write_bytes(copy23_shared.file(UNQUANT).read_bytes())
    assert sp.revert(copy23_shared, "native-routed-scaling")
    assert _bytes(copy23_shared) == before
    ref = _reference(_inputs(), "none")  # no limit is passed: the plain SwiGLU
    got = _run_native(files, tmp_path, SCALE_RUNNER)
    want = {"released-plain": ref, "released-fused": FACTOR * ref,
            "applied-plain": FACTOR * ref, "applied-fused": FACTOR * ref}
    for name, w in want.items():
        torch.testing.assert_close(got[name], w, rtol=1e-10, atol=1e-10, msg=name)
    for name in ("applied-plain", "applied-fused"):  # applied twice would be FACTOR**2
        assert (got[name] - FACTOR ** 2 * ref).abs().max() > 1e-3


def test_audit_reads_a_swapped_body(copy23_shared):
    """The exact patch with the approx body pasted in reads APPROX: the audit looks at the code,
    not at the mode's name."""
    sp.apply(copy23_shared, "native-clamp-exact")
    f = copy23_shared.file(NATIVE)
    text = f.read_text()
    try:
        post = "    gate = F.silu(gate_up[..., :d]).clamp(max=limit)\n"
        assert text.count(post) == 1
        f.write_text(text.replace(post, "    gate = gate_up[..., :d].clamp(max=limit)\n    gate = F.silu(gate)\n"))
        assert _native_verdict(copy23_shared) == "APPROX"
    finally:
        f.write_text(text)
        sp.revert(copy23_shared, "native-clamp-exact")


@pytest.fixture
def mini23(tmp_path):
    return mini_tree(tmp_path / "t", "0.5.23", copy_from=released("0.5.23"),
                     copy_files=(NATIVE, UNQUANT, "sglang/srt/layers/moe/moe_runner/flashinfer_cutlass.py",
                                 "sglang/srt/layers/quantization/compressed_tensors/schemes/"
                                 "compressed_tensors_w4a4_nvfp4_moe.py"))


def test_switch_and_serving_mode_set_and_restore_the_native_axis(mini23, tmp_path):
    """``native=`` beside a clamp mode: set, switched from one value to the other, restored by
    serving_mode on an error; an unknown value is refused with nothing written."""
    before = _bytes(mini23)
    st = sp.switch_mode(mini23, "exact", native={"moe_clamp": "approx", "routed_scaling": "applied"})
    assert (st["clamp_mode"], st["native"]) == ("exact", {"moe_clamp": "approx", "routed_scaling": "applied"})
    st = sp.switch_mode(mini23, "exact", native={"moe_clamp": "exact"})  # routed_scaling left as it is
    assert st["native"] == {"moe_clamp": "exact", "routed_scaling": "applied"}
    st = sp.switch_mode(mini23, "stock", native={"moe_clamp": "released", "routed_scaling": "released"})
    assert _bytes(mini23) == before
    with pytest.raises(UnknownPatchMode):
        sp.switch_mode(mini23, "exact", native={"moe_clamp": "post"})
    assert _bytes(mini23) == before
    state = tmp_path / "s.json"
    with pytest.raises(RuntimeError, match="died"):
        with sp.serving_mode(mini23, "stock", state_file=state, native={"moe_clamp": "exact"}) as st:
            assert st["native"] == {"moe_clamp": "exact", "routed_scaling": "released"}
            raise RuntimeError("server died")
    assert _bytes(mini23) == before
    assert sp.load_state(state)["native"] == {"moe_clamp": "released", "routed_scaling": "released"}


def test_cpu_launcher_puts_the_overlay_in_the_params_mode(tmp_path):
    """``server.cpu.moe_clamp: exact``, ``routed_scaling: applied``: the CPU-engine launcher's
    install step puts the run's overlay in both patches for the launch and back to the released
    files after it."""
    from nvfp4study.serving.launchers import CpuEngineLauncher
    from nvfp4study.serving.server import ServerConfig
    from real_engine_fixtures import engine_stage

    stage = engine_stage(tmp_path / "run", 0, "server.cpu.moe_clamp=exact", "server.cpu.routed_scaling=applied")
    launcher = CpuEngineLauncher()
    tree = launcher.install_tree(stage)
    released_bytes = tree.file(NATIVE).read_bytes(), tree.file(UNQUANT).read_bytes()
    config = ServerConfig(clamp="stock", spec_depth=None, model_path="unused", model_label="study")
    with contextlib.ExitStack() as stack:
        note = launcher.install_mode(stack, stage, config)
        assert "native MoE {'moe_clamp': 'exact', 'routed_scaling': 'applied'}" in note
        assert sp.status(tree)["native"] == {"moe_clamp": "exact", "routed_scaling": "applied"}
        assert _native_verdict(tree) == "EXACT"
    assert (tree.file(NATIVE).read_bytes(), tree.file(UNQUANT).read_bytes()) == released_bytes


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))

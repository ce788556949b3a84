"""Error classes of the clamp audit found by the held-out fourth sample (issue 36), each fixed by
a rule, not by a path's name, and tested here on the released trees with values read from the
source by this file (``ast``), not through the audit.

1. A backend with no fused func and no runner core that the method never builds a MoeRunner
   for: 0.5.19 ``Fp8MoEMethod.create_moe_runner`` builds one only for deep_gemm / triton / aiter /
   flashinfer_trtllm(_routed) / hpc_ops (layers/quantization/fp8.py 2383-2393), and ``apply``
   calls ``cutlass_fused_experts_fp8`` itself for cutlass (fp8.py 2512-2546) without the limit.
   Its trail is not lost at ``MoeRunner.__init__`` (runner.py:163): the method's own branches
   decide. ``Fp8MoEMethod.__init__`` asserts ``cutlass_fp8_supported()`` for cutlass (fp8.py
   1100-1103), false off CUDA (fp8_utils.py 272-274): the XPU branch of ``apply`` (fp8.py 2473,
   sgl_kernel ``fused_experts``) is not Ling's on that path.
2. A method constructor that reads its config object as a dict: 0.5.20 ``compressed_tensors.py``
   890/896 build ``NPUCompressedTensorsW4A8Int8DynamicMoE(self)`` in ``CompressedTensorsConfig``
   (112; base ``QuantizationConfig(ABC)``, base_config.py 140), whose ``__init__`` calls
   ``quantization_config.get("config_groups", {})`` (compressed_tensors_w4a8_int8_moe.py 36-40):
   AttributeError while the layer is built, whatever the limit (UNUSABLE), on every release.
3. A method whose weights only a loader that refuses Ling can prepare (moe_params.yaml
   ``shared.loader_requires``): ``BitsAndBytesMoEMethod.apply`` reads ``bnb_quant_state``
   (bitsandbytes.py 589/593 in 0.5.20), attached only in model_loader/loader.py (3113) by
   ``BitsAndBytesModelLoader``, whose ``_load_weights`` raises without
   ``bitsandbytes_stacked_params_mapping`` (3009-3013); ``BailingMoeV3ForCausalLM`` defines none.
   (The first sample's 0.5.23 reading, EXACT, did not follow the loader: the source says UNUSABLE.)
4. A runner step follows the quant info the method hands it: 0.5.19
   ``CompressedTensorsW8A8Fp8MoE`` sets ``use_flashinfer_trtllm = is_flashinfer_trtllm()``
   (compressed_tensors_w8a8_fp8_moe.py:56), false for flashinfer_trtllm_routed (layers/moe/utils.py
   128), builds that backend's MoeRunner (362) and hands it a ``TritonMoeQuantInfo`` (422-432);
   the routed fused func accepts only the FlashInfer TRT-LLM quant infos and raises TypeError
   otherwise (moe_runner/flashinfer_trtllm.py 1395-1414): UNUSABLE, not the kernels of payloads
   the method never builds.
5. A runner-level entry's callers include a catalogued method path pinned to one device, run on
   every device: ``mxfp4-sm100-trtllm`` audits Mxfp4MoEMethod/flashinfer_mxfp4 on SM100 only;
   on SM120 the method sets ``layer.swiglu_limit = Parameter(torch.full((E,), 7.0))`` (0.5.20
   mxfp4.py 1392-1395) and hands it to cutlass_fused_moe through the quant info (1506-1529): a
   literal where Ling's limit should be, so fused:none/flashinfer_mxfp4 is DROPPED (its worst
   caller), not the EXACT of Mxfp4FlashinferCutlassMoEMethod alone. (The fourth sample's 0.5.23
   reading, EXACT, excludes Mxfp4MoEMethod through ``FusedMoE.weight_loader_fused``; Ling's
   per-expert weights go through ``weight_loader``, whose static-MXFP4 branch needs
   ``expert_id is None``, layer.py 1173-1177 in 0.5.23.)
"""

from __future__ import annotations

import ast

from nvfp4study.sglang.audit import audit_tree
from nvfp4study.sglang.platforms import true_on
from sglang_fixtures import VERSIONS, released


def _method(tree: ast.Module, cls: str, name: str) -> ast.FunctionDef:
    c = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    return next(f for f in c.body if isinstance(f, ast.FunctionDef) and f.name == name)


def test_a_backend_the_method_never_builds_a_runner_for_is_judged_on_the_method():
    for v in VERSIONS:
        srt = released(v).srt
        mod = ast.parse((srt / "layers/quantization/fp8.py").read_text())
        builds = ast.unparse(_method(mod, "Fp8MoEMethod", "create_moe_runner"))
        assert "MoeRunner(" in builds and "is_cutlass" not in builds, v  # no runner for cutlass
        calls = [c for c in ast.walk(_method(mod, "Fp8MoEMethod", "apply")) if isinstance(c, ast.Call)
                 and ast.unparse(c.func) == "cutlass_fused_experts_fp8"]
        assert calls and all("gemm1_clamp_limit" not in {k.arg for k in c.keywords} for c in calls), v
        (r,) = audit_tree(released(v), ["Fp8MoEMethod/cutlass"])
        assert r.verdict.value == "DROPPED", (v, r.rule)
        assert "trail lost" not in r.rule and any("never runs a MoeRunner" in f for f in r.found_by), v


def test_an_assert_on_a_platform_limited_helper_limits_the_path():
    src = ("_is_cuda = is_cuda()\n"
           "def f():\n    if not _is_cuda:\n        return False\n    return g() >= 9\n"
           "def h():\n    return _is_cuda\n")
    tree = ast.parse(src)
    fns = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert true_on(tree, fns["f"]) == {"CUDA"}
    # a return whose value is not the constant False is kept wherever it is reached
    assert true_on(tree, fns["h"]) == {"CUDA", "ROCm", "XPU", "NPU", "CPU"}
    u = ast.parse((released("0.5.19").srt / "layers/quantization/fp8_utils.py").read_text())
    sup = next(n for n in u.body if isinstance(n, ast.FunctionDef) and n.name == "cutlass_fp8_supported")
    assert true_on(u, sup) == {"CUDA"}


def _class(tree: ast.Module, name: str) -> ast.ClassDef:
    return next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name)


def test_a_constructor_reading_its_config_object_as_a_dict_is_unusable():
    scheme = "NPUCompressedTensorsW4A8Int8DynamicMoE"
    for v in VERSIONS:
        srt = released(v).srt
        ct = ast.parse((srt / "layers/quantization/compressed_tensors/compressed_tensors.py").read_text())
        cfg = _class(ct, "CompressedTensorsConfig")
        built = [c for c in ast.walk(cfg) if isinstance(c, ast.Call) and ast.unparse(c) == f"{scheme}(self)"]
        everywhere = [c for c in ast.walk(ct) if isinstance(c, ast.Call) and ast.unparse(c.func) == scheme]
        assert built and len(built) == len(everywhere), v  # always built with the config object itself
        base = ast.parse((srt / "layers/quantization/base_config.py").read_text())
        for c in (cfg, _class(base, "QuantizationConfig")):
            names = {f.name for f in c.body if isinstance(f, ast.FunctionDef)}
            assert not names & {"get", "__getattr__", "__getitem__"}, (v, c.name)
        assert [ast.unparse(b) for b in _class(base, "QuantizationConfig").bases] == ["ABC"]
        sm = ast.parse((srt / "layers/quantization/compressed_tensors/schemes/compressed_tensors_w4a8_int8_moe.py")
                       .read_text())
        init = _method(sm, scheme, "__init__")
        line = next(n.lineno for st in init.body for n in ast.walk(st) if isinstance(n, ast.Call)
                    and ast.unparse(n.func) == "quantization_config.get")
        (r,) = audit_tree(released(v), [f"{scheme}/ascend"])
        assert (r.verdict.value, r.line) == ("UNUSABLE", line), (v, r.rule)
        assert r.file.endswith("compressed_tensors_w4a8_int8_moe.py") and "AttributeError" in r.rule


def test_a_method_whose_weights_only_a_refusing_loader_prepares_is_unusable():
    for v in VERSIONS:
        srt = released(v).srt
        loader = (srt / "model_loader/loader.py").read_text().splitlines()
        guard = [i + 1 for i, ln in enumerate(loader)
                 if ln.strip() == 'if not hasattr(model, "bitsandbytes_stacked_params_mapping"):']
        assert len(guard) == 1 and loader[guard[0]].strip() == "raise AttributeError(", v
        assert "bitsandbytes_stacked_params_mapping" not in (srt / "models/bailing_moe_v3.py").read_text()
        setters = [p for p in srt.rglob("*.py") if p.name != "loader.py"
                   and any(ln.split("=")[0].strip().endswith(".bnb_quant_state") and " = " in ln
                           for ln in p.read_text(errors="replace").splitlines())]
        assert setters == [], v  # only the loader attaches it
        bnb = ast.parse((srt / "layers/quantization/bitsandbytes.py").read_text())
        assert "bnb_quant_state" in ast.unparse(_class(bnb, "BitsAndBytesMoEMethod"))  # its dequant reads it
        (r,) = audit_tree(released(v), ["BitsAndBytesMoEMethod/direct"])
        assert (r.verdict.value, r.file, r.line) == ("UNUSABLE", "model_loader/loader.py", guard[0] + 1), (v, r.rule)


def test_a_runner_step_follows_the_quant_info_the_method_hands_it():
    for v in VERSIONS:
        srt = released(v).srt
        mod = ast.parse((srt / "layers/quantization/compressed_tensors/schemes/compressed_tensors_w8a8_fp8_moe.py")
                        .read_text())
        init = ast.unparse(_method(mod, "CompressedTensorsW8A8Fp8MoE", "__init__"))
        assert "self.use_flashinfer_trtllm = get_moe_runner_backend().is_flashinfer_trtllm()" in init, v
        utils = ast.parse((srt / "layers/moe/utils.py").read_text())
        pred = ast.unparse(_method(utils, _owner(utils, "is_flashinfer_trtllm"), "is_flashinfer_trtllm"))
        assert "FLASHINFER_TRTLLM" in pred and "FLASHINFER_TRTLLM_ROUTED" not in pred, v
        fi = ast.parse((srt / "layers/moe/moe_runner/flashinfer_trtllm.py").read_text())
        fused = next(n for n in fi.body if isinstance(n, ast.FunctionDef)
                     and n.name == "fused_experts_none_to_flashinfer_trtllm_routed")
        tested = {ast.unparse(c.args[1]) for c in ast.walk(fused) if isinstance(c, ast.Call)
                  and ast.unparse(c.func) == "isinstance"}
        assert "TritonMoeQuantInfo" not in tested and isinstance(fused.body[-1], ast.Raise), v
        raise_line = fused.body[-1].lineno
        (r,) = audit_tree(released(v), ["CompressedTensorsW8A8Fp8MoE/flashinfer_trtllm_routed"])
        assert (r.verdict.value, r.line) == ("UNUSABLE", raise_line), (v, r.rule)


def _owner(tree: ast.Module, method: str) -> str:
    """The class of ``tree`` defining ``method`` (``_MoeRunnerBackendPredicates`` or the enum)."""
    return next(c.name for c in tree.body if isinstance(c, ast.ClassDef)
                and any(isinstance(f, ast.FunctionDef) and f.name == method for f in c.body))


def test_a_device_pinned_method_path_is_a_caller_on_every_device():
    for v in VERSIONS:
        srt = released(v).srt
        mod = ast.parse((srt / "layers/quantization/mxfp4.py").read_text())
        lits = [c for c in ast.walk(_class(mod, "Mxfp4MoEMethod")) if isinstance(c, ast.Assign)
                and ast.unparse(c.targets[0]) == "layer.swiglu_limit" and "torch.full((E,), 7.0" in ast.unparse(c.value)]
        assert lits, v  # the SM120 branch's hard-coded GPT-OSS limit
        rows = audit_tree(released(v), ["fused:none/flashinfer_mxfp4", "mxfp4-sm100-trtllm", "mxfp4-cutlass"])
        (r,) = [x for x in rows if x.path == "fused:none/flashinfer_mxfp4"]
        assert r.verdict.value == "DROPPED" and "Mxfp4MoEMethod/flashinfer_mxfp4 DROPPED" in r.rule, (v, r.rule)
        assert "tensor of the literal 7" in r.rule, v


def test_a_literal_filled_tensor_is_no_limit():
    from nvfp4study.sglang.clamp_exprs import ExprEval
    from nvfp4study.sglang.clamp_values import Filled

    def filled(src: str):
        node = ast.parse(src).body[0].value
        return ExprEval.filled(node.func, node, [Filled(7.0)] if "Parameter" in src else [])

    assert filled("torch.full((E,), 7.0, dtype=torch.float32)") == Filled(7.0)
    assert filled("torch.ones(E)") == Filled(1.0) and filled("nn.Parameter(x)") == Filled(7.0)
    assert filled("torch.full((E,), limit)") is None and filled("torch.empty(E)") is None

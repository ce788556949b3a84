"""Error classes of the clamp audit fixed in issue 36, each on a path read by hand.

1. A fused function registered only when an environment variable is set: 0.5.23
   ``lora/trtllm_lora_temp/sgl_backend.py:15`` registers ("none", "experimental_sgl_trtllm") when
   imported; ``layers/moe/moe_runner/flashinfer_trtllm.py`` 1958-1959 imports it only under
   ``if _SGLANG_EXPERIMENTAL_LORA_OPTI`` (line 43: ``envs.SGLANG_EXPERIMENTAL_LORA_OPTI.get()``,
   ``EnvBool(False)`` at ``environ.py:1257``). ``MoeUtils``' ``is_flashinfer_trtllm()`` is true for
   the backend (MoeRunnerBackend, layers/moe/utils.py 133-139), so ``MoeRunner.__init__`` builds no runner core and,
   with no fused func registered, raises NotImplementedError at runner.py:178: whatever the limit
   (UNUSABLE by the verdict definitions of data/hand_readings.yaml), not DROPPED. Three stored hand
   readings read these paths with the flag set, so the shipped policy is "note" (the gate in the trail);
   "unusable" (moe_params.yaml shared.env_gated_fused_func) gives the default launch's verdict.
2. An assert Ling fails whatever the limit: 0.5.23 compressed_tensors_w4a4_nvfp4_moe.py:324 asserts
   layer.routing_method_type is not None; BailingMoeV3 passes none (FusedMoE default None,
   base_config.py 126-130 returns it): UNUSABLE at 324 (tests/test_sglang_audit.py EXPECTED).
"""

from __future__ import annotations

import ast

from nvfp4study.sglang import moe_params
from nvfp4study.sglang.audit import audit_tree
from nvfp4study.sglang.import_gates import _imports_of
from sglang_fixtures import VERSIONS, copy23_fixture, released  # noqa: F401 - the copy23 fixture

#: MoeRunner.__init__'s raise for a backend with neither runner core nor fused func (read by hand)
RUNNER_RAISE = {"0.5.19": 163, "0.5.20": 170, "0.5.21": 178, "0.5.22": 178, "0.5.23": 178}


GATED = ("fused:none/experimental_sgl_trtllm", "ModelOptNvFp4FusedMoEMethod/experimental_sgl_trtllm")


def test_env_gated_fused_func_is_unusable_under_the_shipped_policy():
    # moe_params.yaml shared.env_gated_fused_func: unusable (what a default launch does)
    assert moe_params.shared()["env_gated_fused_func"] == "unusable"
    for v in VERSIONS:
        rows = {r.path: r for r in audit_tree(released(v), list(GATED))}
        for key in GATED:
            r = rows[key]
            assert r.verdict.value == "UNUSABLE", (v, key, r.rule)
            assert (r.file, r.line) == ("layers/moe/moe_runner/runner.py", RUNNER_RAISE[v]), (v, key)
            assert "SGLANG_EXPERIMENTAL_LORA_OPTI is set (off by default" in r.rule
            assert "layers/moe/moe_runner/flashinfer_trtllm.py:" in r.rule


def test_env_gated_fused_func_is_named_under_the_note_policy(monkeypatch):
    # the other policy ("note"): judged as if the flag were set, the gate in the trail. The shipped one is
    # "unusable" (issue 36 judges the default environment)
    assert moe_params.shared()["env_gated_fused_func"] == "unusable"
    shared = {**moe_params.shared(), "env_gated_fused_func": "note"}
    monkeypatch.setattr(moe_params, "shared", lambda: shared)
    rows = {r.path: r for r in audit_tree(released("0.5.23"), list(GATED))}
    assert {k: r.verdict.value for k, r in rows.items()} == {GATED[0]: "DROPPED", GATED[1]: "APPROX"}
    for r in rows.values():
        assert any(f.startswith("not built by default: layers/moe/moe_runner/runner.py:178 MoeRunner raises for "
                                "'experimental_sgl_trtllm' by default") for f in r.found_by)


def test_imports_under_an_env_flag_are_told_from_plain_ones():
    src = ("from sglang.srt.environ import envs\n_ON = envs.SGLANG_X.get()\n"
           "if _ON:\n    from pkg.sub import mod\n"
           "if envs.SGLANG_Y.get():\n    import pkg.sub.mod\nelse:\n    from pkg.sub import mod\n"
           "if other:\n    from pkg.sub.mod import f\n")
    assert _imports_of(ast.parse(src), "pkg.sub.mod") == [(4, "SGLANG_X"), (6, "SGLANG_Y"), (8, None), (10, None)]


def test_the_marlin_lora_backend_stays_registered():
    # lora/marlin_lora_temp/sgl_backend.py is imported unconditionally (moe_runner/marlin.py:222 in 0.5.23)
    (r,) = audit_tree(released("0.5.23"), ["fused:none/experimental_sgl_marlin"])
    assert r.verdict.value != "UNUSABLE" or "SGLANG_EXPERIMENTAL_LORA_OPTI" not in r.rule


#: Fp8MoEMethod.apply's ``raise NotImplementedError("Unsupported runner backend: ...")``, read by hand
#: (layers/quantization/fp8.py; 2658-2660 in 0.5.19): by default ``_use_aiter = envs.SGLANG_USE_AITER.get()
#: and _is_hip`` (fp8.py:130 in 0.5.19, ``SGLANG_USE_AITER = EnvBool(False)`` environ.py:805) is False, so
#: ``maybe_get_hip_aiter_quant_info`` returns None and no branch of ``apply`` takes the aiter runner
FP8_UNSUPPORTED = {"0.5.19": 2658, "0.5.20": 2883, "0.5.21": 3145, "0.5.22": 3219, "0.5.23": 3357}


def test_env_reads_take_their_defaults():
    from nvfp4study.sglang.import_gates import env_default_in, env_read

    environ = ast.parse("class Envs:\n    SGLANG_A = EnvBool(False)\n    SGLANG_B = EnvBool(True)\n")
    call = lambda s: ast.parse(s, mode="eval").body  # noqa: E731
    default = lambda f: env_default_in(environ, f)  # noqa: E731
    assert env_read(call("envs.SGLANG_A.get()"), default) is False
    assert env_read(call("envs.SGLANG_B.get()"), default) is True
    assert env_read(call("envs.SGLANG_C.get()"), default) is None  # not declared: left open
    assert env_read(call('get_bool_env_var("X")'), default) is False
    assert env_read(call('get_bool_env_var("X", "true")'), default) is True
    assert env_read(call('get_bool_env_var("X", default=d)'), default) is None
    assert env_read(call("is_hip()"), default) is None


def test_an_aiter_branch_behind_an_off_by_default_variable_is_not_taken():
    # moe_params.yaml shared.env_flags: default. Before, _use_aiter was unknown on ROCm and the audit
    # followed the aiter quant info into AiterRunnerCore (DROPPED); the default launch raises in apply
    assert moe_params.shared()["env_flags"] == "default"
    for v in VERSIONS:
        (r,) = audit_tree(released(v), ["Fp8MoEMethod/aiter"])
        assert r.verdict.value == "UNUSABLE", (v, r.rule)
        assert (r.file, r.line) == ("layers/quantization/fp8.py", FP8_UNSUPPORTED[v]), (v, r.rule)
        assert "Unsupported runner backend" in r.rule


def test_env_reads_are_left_open_under_another_policy(monkeypatch):
    shared = {**moe_params.shared(), "env_flags": "open"}
    monkeypatch.setattr(moe_params, "shared", lambda: shared)
    (r,) = audit_tree(released("0.5.19"), ["Fp8MoEMethod/aiter"])
    assert r.verdict.value == "DROPPED"  # the aiter runner's fused_moe, as before the rule


#: ``return AiterRunnerInput(..., quant_type=quant_info.quant_type)`` of pre_permute_standard_to_aiter
#: (moe_runner/aiter.py, read by hand: the return statement's first line)
AITER_PRE_PERMUTE_RETURN = {"0.5.19": 345, "0.5.20": 345, "0.5.21": 420, "0.5.22": 350, "0.5.23": 367}


def test_a_payload_field_its_class_lacks_raises_in_the_pre_permute():
    # Mxfp4MoEMethod.create_moe_runner builds MoeRunner(aiter) for --moe-runner-backend aiter; with
    # SGLANG_USE_AITER off, apply hands it a TritonMoeQuantInfo (0.5.21 mxfp4.py 1439, 1723-1729), and
    # MoeRunner.run's pre-permute reads quant_info.quant_type, which TritonMoeQuantInfo (triton.py 52-72)
    # does not declare: AttributeError. Before, the audit skipped the pre-permute (UNDECIDED).
    for v in VERSIONS:
        (r,) = audit_tree(released(v), ["Mxfp4MoEMethod/aiter"])
        assert r.verdict.value == "UNUSABLE", (v, r.rule)
        assert (r.file, r.function, r.line) == (
            "layers/moe/moe_runner/aiter.py", "pre_permute_standard_to_aiter", AITER_PRE_PERMUTE_RETURN[v]), v
        assert "quant_info.quant_type (TritonMoeQuantInfo declares no quant_type)" in r.rule


def test_a_method_that_builds_another_runner_skips_the_keys_pre_permute():
    # UnquantizedFusedMoEMethod.create_moe_runner builds MoeRunner(MoeRunnerBackend.TRITON) when no other
    # branch is taken (0.5.21 unquant.py 1002-1003); its aiter runner needs SGLANG_USE_AITER. The
    # TritonMoeQuantInfo it hands goes to the Triton runner: no AttributeError from the aiter pre-permute
    for v in VERSIONS:
        (r,) = audit_tree(released(v), ["UnquantizedFusedMoEMethod/aiter"])
        assert r.function != "pre_permute_standard_to_aiter" and "declares no" not in r.rule, (v, r.rule)


def test_only_the_operands_python_always_evaluates_are_read():
    from nvfp4study.sglang.clamp_values import Payload
    from nvfp4study.sglang.code_index import always_evaluated as _always_evaluated

    expr = ast.parse("a.x and not q.f or (b.y if c.z else d.w) + e.v", mode="eval").body
    reads = {(n.value.id, n.attr) for n in _always_evaluated(expr) if isinstance(n, ast.Attribute)}
    assert reads == {("a", "x")}  # `or`'s first operand is the `and`, whose first is a.x
    expr = ast.parse("g(q.f, (b.y if c.z else d.w), [t.u for t in s])", mode="eval").body
    reads = {(n.value.id, n.attr) for n in _always_evaluated(expr) if isinstance(n, ast.Attribute)}
    assert reads == {("q", "f"), ("c", "z")}
    p = Payload("P", (("w", 1),), (), frozenset({"w", "run"}))
    assert p.lacks("quant_type") and not p.lacks("w") and not p.lacks("run") and not p.lacks("__class__")
    assert not Payload("P", (("w", 1),)).lacks("quant_type")  # a class not found: nothing is known lacking


#: ``if (self.is_fp4_experts and is_npu_arch35() and self.is_dsv4_fp4_experts)`` before
#: ``return NPUW4A8MXFP4FusedMoEMethod(prefix=prefix)`` in Fp8Config.get_quant_method (fp8.py, by hand)
DSV4_ONLY = {"0.5.21": 420, "0.5.22": 425, "0.5.23": 431}


def test_a_method_selected_only_for_another_model_is_not_lings_path():
    # model_loader/loader.py 222 (0.5.21): quant_config.is_dsv4_fp4_experts = is_deepseek_v4(hf_config), an
    # architecture test without BailingMoeV3ForCausalLM (configs/model_config.py 275-280). Before: DROPPED
    for v, line in DSV4_ONLY.items():
        (r,) = audit_tree(released(v), ["NPUW4A8MXFP4FusedMoEMethod/ascend"])
        assert r.verdict.value == "UNUSABLE", (v, r.rule)
        assert (r.file, r.line) == ("layers/quantization/fp8.py", line), v
        assert "selected only when self.is_dsv4_fp4_experts" in r.rule and "is_deepseek_v4(hf_config)" in r.rule
    (r,) = audit_tree(released("0.5.20"), ["NPUW4A4Fp4MoEMethod/direct"])  # the same guard, fp8.py 414-426
    assert (r.verdict.value, r.line) == ("UNUSABLE", 414), r.rule


def test_a_model_test_that_admits_ling_selects_nothing_away(copy23):
    f = copy23.root / "sglang/srt/configs/model_config.py"
    f.write_text(f.read_text().replace('"DeepseekV4ForCausalLM",', '"DeepseekV4ForCausalLM", "BailingMoeV3ForCausalLM",', 1))
    (r,) = audit_tree(copy23, ["NPUW4A8MXFP4FusedMoEMethod/ascend"])
    assert r.verdict.value != "UNUSABLE" and "not Ling's path" not in r.rule, r.rule


def test_a_core_built_only_under_lora_is_absent_for_the_cards_launch():
    # runner.py 119-125 (0.5.23): the marlin branch builds MarlinLoraRunnerCore only `if lora_enabled`, else
    # None ("Marlin only supports fused path"); the only MoeRunner(lora_enabled=True) is FusedMoEWithLoRA's
    # (lora/layers.py 1124-1129), built for the LoRA manager under --enable-lora. Before: DROPPED
    assert "lora_enabled" in moe_params.shared()["launch_off_flags"]
    for v in VERSIONS:
        rows = {r.path: r for r in audit_tree(released(v), ["core:marlin"])}
        r = rows["core:marlin"]
        assert r.verdict.value == "ABSENT", (v, r.rule)
        assert "lora/layers.py:" in r.rule and "launch never sets" in r.rule, (v, r.rule)


def test_the_runner_a_method_builds_runs_not_the_one_its_key_names():
    # SGLANG_USE_AITER off: QuarkW8A8FP8MoE.create_moe_runner builds MoeRunner(MoeRunnerBackend.AITER if
    # use_aiter_runner else MoeRunnerBackend.TRITON) with use_aiter_runner false (0.5.23
    # quark_w8a8_fp8_moe.py 269-278), UnquantizedFusedMoEMethod MoeRunner(MoeRunnerBackend.TRITON) (unquant.py):
    # --moe-runner-backend aiter runs the Triton runner (fused_experts: post-SiLU clamp, EXACT; the top-k sum
    # times the factor). Before: the aiter core's (DROPPED / UNDECIDED; the factor DROPPED).
    # The factor is then the Triton runner's: the unquantized aiter key runs on ROCm only, where its
    # kernel sum applies it; the Quark FP8 method also runs on CUDA, whose Triton tail hands it to the
    # compiled sgl_kernel moe_sum_reduce (fused_moe.py 1020), unread (KP.md): UNDECIDED, as for /triton
    from nvfp4study.sglang.param_audit import audit_param

    for v, keys in (("0.5.19", ["UnquantizedFusedMoEMethod/aiter"]),
                    ("0.5.23", ["QuarkW8A8FP8MoE/aiter", "UnquantizedFusedMoEMethod/aiter"])):
        rows = {r.path: r for r in audit_tree(released(v), keys)}
        for key in keys:
            r = rows[key]
            assert r.verdict.value == "EXACT", (v, key, r.rule)
            assert r.file.startswith("layers/moe/moe_runner/triton"), (v, key, r.file)
            assert "triton: alpha None -> post-SiLU clamp" in r.rule, (v, key, r.rule)
            (p,) = audit_param(released(v), "routed_scaling_factor", [key])
            assert any(e.startswith("layers/moe/moe_runner/triton") for e in p.evidence), (v, key, p.evidence)
            if key.startswith("Quark"):
                assert p.verdict.value == "UNDECIDED" and p.parts["runner"] is None, (v, key, p.rule)
                assert "sgl_kernel moe_sum_reduce" in p.rule and "KP.md" in p.rule, p.rule
            else:
                assert p.verdict.value == "APPLIED" and p.parts["runner"] == 1, (v, key, p.rule)


def test_a_file_that_does_not_parse_leaves_the_model_guard_rule_to_the_others(copy23):
    # a hostile tree: a source file that mentions the DeepSeek-V4 flag and does not parse (and a loader
    # that does not parse, below) is read as selecting nothing; the audit goes on (it raised SyntaxError)
    bad = copy23.root / "sglang/srt/layers/quantization/zz_broken.py"
    bad.write_text("if self.is_dsv4_fp4_experts:\n    x = (\n")
    (r,) = audit_tree(copy23, ["NPUW4A8MXFP4FusedMoEMethod/ascend"])
    assert r.verdict.value == "UNUSABLE" and "is_dsv4_fp4_experts" in r.rule  # the parsable files still decide
    loader = copy23.root / "sglang/srt/model_loader/loader.py"
    loader.write_text(loader.read_text() + "\ndef broken(:\n")
    (r,) = audit_tree(copy23, ["NPUW4A8MXFP4FusedMoEMethod/ascend"])
    assert "not Ling's path" not in r.rule  # no flag is known: the path keeps its own verdict

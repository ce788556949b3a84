"""Issue 36, round 12: a layer attribute that only another model's code sets is unset for Ling.

0.5.23 ``MiniMaxM3Nvfp4MoE._process_trtllm_weights`` tests ``layer._minimax_activation``
(layers/quantization/minimax_m3_nvfp4.py 257), which only models/minimax_m3.py 440 sets: Ling's
weight processing raises AttributeError on the key's (flashinfer_trtllm_routed) branch, so the path
is UNUSABLE for the clamp and every routing parameter. The line numbers are found in the released
source here, not copied.
"""

from __future__ import annotations

from pathlib import Path

from nvfp4study.sglang import audit as sa
from nvfp4study.sglang.audit_sinks import ClampVerdict
from nvfp4study.sglang.code_index import tree_stamp
from nvfp4study.sglang.model_attrs import ling_model_files, other_model_setters
from nvfp4study.sglang.param_audit import ParamVerdict, audit_param
from sglang_fixtures import copy23_fixture, edit_once, released  # noqa: F401 - copy23 is a fixture

MM3 = "sglang/srt/layers/quantization/minimax_m3_nvfp4.py"
KEY = "MiniMaxM3Nvfp4MoE/flashinfer_trtllm_routed"
READ = 'if layer._minimax_activation == "swigluoai":'


def _line(tree, rel: str, text: str) -> int:
    lines = tree.file(rel).read_text().splitlines()
    (n,) = [i for i, ln in enumerate(lines, 1) if text in ln]
    return n


def test_setters_are_found_only_where_every_binding_is_another_models():
    tree = released("0.5.23")
    stamp = hash(tree_stamp(tree.root))
    setter = _line(tree, "sglang/srt/models/minimax_m3.py", "self.experts._minimax_activation = (")
    assert other_model_setters(tree.root, "_minimax_activation", stamp) == (f"models/minimax_m3.py:{setter}",)
    assert other_model_setters(tree.root, "w13_weight", stamp) == ()  # layer code registers it
    ling = ling_model_files(tree.root, stamp)
    assert "sglang/srt/models/bailing_moe_v3.py" in ling and "sglang/srt/models/deepseek_v2.py" in ling
    assert "sglang/srt/models/minimax_m3.py" not in ling


def test_minimax_trtllm_routed_is_unusable_for_ling():
    tree = released("0.5.23")
    read = _line(tree, MM3, READ)
    (row,) = sa.audit_tree(tree, [KEY])
    assert row.verdict == ClampVerdict.UNUSABLE, row.rule
    assert (row.file, row.line) == ("layers/quantization/minimax_m3_nvfp4.py", read)
    assert "models/minimax_m3.py:" in row.rule and "AttributeError" in row.rule
    for param in ("routed_scaling_factor", "norm_topk_prob", "correction_bias", "grouped_topk"):
        (p,) = audit_param(tree, param, [KEY], clamp_rows=[row])
        assert p.verdict == ParamVerdict.UNUSABLE, (param, p.rule)
    (marlin,) = sa.audit_tree(tree, ["MiniMaxM3Nvfp4MoE/marlin"])  # its branch never reads it
    assert marlin.verdict != ClampVerdict.UNUSABLE, marlin.rule


def test_a_getattr_default_is_no_failure(copy23):
    edit_once(copy23, MM3, READ, 'if getattr(layer, "_minimax_activation", "silu") == "swigluoai":')
    text = Path(copy23.file(MM3)).read_text()
    # the MegaMoE branch's read (no default) is off the key's branch: it does not decide this path
    assert "activation=layer._minimax_activation" in text
    (row,) = sa.audit_tree(copy23, [KEY])
    assert row.verdict != ClampVerdict.UNUSABLE and "AttributeError" not in row.rule, row.rule


def test_ling_setting_it_is_no_failure(copy23):
    """Ling's model file setting the attribute (as MiniMax's does) takes the rule off."""
    model = "sglang/srt/models/bailing_moe_v3.py"
    text = copy23.file(model).read_text()
    assert "_minimax_activation" not in text
    copy23.file(model).write_text(text + "\n\ndef _mark(experts):\n    experts._minimax_activation = 'silu'\n")
    (row,) = sa.audit_tree(copy23, [KEY])
    assert row.verdict != ClampVerdict.UNUSABLE, row.rule


def test_the_layers_torch_module_methods_are_no_other_models_attribute():
    """``layer.register_parameter`` (called by every ``create_weights``, a setup step since round 12) is
    torch.nn.Module's own method: 0.5.23 models/transformers.py monkeypatches it on modules, which made
    every path read UNUSABLE when the two round-12 rules met. The list is torch's own."""
    import torch

    from nvfp4study.sglang.model_attrs import TORCH_MODULE_ATTRS

    assert TORCH_MODULE_ATTRS == {n for n in dir(torch.nn.Module) if not n.startswith("_")} | {"training"}
    rows = {r.path: r for r in sa.audit_tree(released("0.5.23"), ["nvfp4-w4a4-cutlass", "UnquantizedFusedMoEMethod/triton"])}
    # the card's path on 0.5.23 hands the limit to FlashInfer CUTLASS as swiglu_limit: SwigluBias, pre-SiLU (K.md)
    assert rows["nvfp4-w4a4-cutlass"].verdict.value == "APPROX", rows["nvfp4-w4a4-cutlass"].rule
    assert rows["UnquantizedFusedMoEMethod/triton"].verdict.value == "EXACT", rows["UnquantizedFusedMoEMethod/triton"].rule


def test_each_store_of_a_file_is_numbered_on_its_own_line():
    # the per-file scan counts lines on from the previous store; each must land on the line that holds it
    from nvfp4study.sglang.model_attrs import _file_stores

    text = ('"""doc\n\nstring"""\nself.a = 1\nx = 2\n\n\nlayer.b: int = 3\nself.a += 4\n'
            'setattr(layer, "c", 5)\nif self.d == 6:\n    self.e = (7,\n        8)\n')
    want = [(name, f"models/m.py:{i}") for i, ln in enumerate(text.splitlines(), 1)
            for name in ("a", "b", "c", "d", "e") if (f".{name}" in ln and "==" not in ln) or f'"{name}"' in ln]
    assert list(_file_stores("models/m.py", text)) == want
    assert [w for _, w in want] == ["models/m.py:4", "models/m.py:8", "models/m.py:9", "models/m.py:10",
                                    "models/m.py:12"]

"""Issue 36: a catalogue ``entry`` may list the layouts of different releases; the MoE LoRA runner
is judged on every release that has one (0.5.19-0.5.22: the LoRA wrapper's Triton runner)."""

from __future__ import annotations

from nvfp4study.sglang import audit as sa
from nvfp4study.sglang.audit_run import entry_steps
from sglang_fixtures import mini_tree, released

NEW = ["lora/moe/runner.py::MoeLoraRunner._admit"]
OLD = ["lora/layers.py::FusedMoEWithLoRA.__init__", "lora/layers.py::FusedMoEWithLoRA._forward_with_lora"]


def test_entry_takes_the_first_layout_the_tree_defines(tmp_path):
    old = mini_tree(tmp_path / "a", "0.5.19", {"sglang/srt/lora/layers.py": "class FusedMoEWithLoRA:\n    pass\n"})
    assert entry_steps(old.root, [NEW, OLD]) == OLD
    both = mini_tree(tmp_path / "b", "0.5.23", {"sglang/srt/lora/layers.py": "class FusedMoEWithLoRA:\n    pass\n",
                                                "sglang/srt/lora/moe/runner.py": "class MoeLoraRunner:\n    pass\n"})
    assert entry_steps(both.root, [NEW, OLD]) == NEW
    none = mini_tree(tmp_path / "c", "0.5.19")
    assert entry_steps(none.root, [NEW, OLD]) == NEW  # its run finds it absent
    assert entry_steps(none.root, OLD) == OLD  # a plain list of steps: unchanged


def test_lora_moe_runs_the_older_layout_0519():
    (r,) = sa.audit_tree(released("0.5.19"), ["lora-moe"])
    # the Triton core with LoRA hooks passes gemm1_limit (triton.py 166 in 0.5.19) to the post-SiLU
    # clamp (triton_utils/fused_moe.py 373); 0.5.19 has no lora/moe/runner.py
    assert (r.verdict.value, r.file, r.function) == ("EXACT", "layers/moe/moe_runner/triton.py", "TritonRunnerCore.run")
    assert "fused_moe.py:373" in r.rule
    (r23,) = sa.audit_tree(released("0.5.23"), ["lora-moe"])
    assert (r23.verdict.value, r23.function) == ("REFUSED", "MoeLoraRunner._admit")

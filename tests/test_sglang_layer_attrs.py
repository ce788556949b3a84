"""layer_attrs.create_weights_only on small hand-written trees: each case's answer is read off the
source by hand (a weight registered only by some create_weights is one; any other store, a method of
that name, or a file that does not parse is not)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nvfp4study.sglang.layer_attrs import create_weights_only

REGISTERS = '''
class A:
    def create_weights(self, layer, n):
        layer.register_parameter("w13_weight_offset", None)
        setattr(layer, "w2_weight_offset", None)
        self.own_flag = True
'''


def _tree(tmp_path: Path, *files: str) -> Path:
    root = tmp_path / "t"
    srt = root / "sglang" / "srt"
    srt.mkdir(parents=True)
    for i, text in enumerate(files):
        (srt / f"m{i}.py").write_text(text)
    return root


@pytest.mark.parametrize(("other", "name", "expected"), [
    ("", "w13_weight_offset", True),                       # register_parameter in create_weights only
    ("", "w2_weight_offset", True),                        # setattr in create_weights only
    ("", "own_flag", False),                               # only the method's own self.own_flag
    ("", "never_named", False),                            # set nowhere: not a create_weights weight
    ("def f(layer):\n    layer.w13_weight_offset = 1\n", "w13_weight_offset", False),  # a store elsewhere
    ("def f(m):\n    m.register_buffer('w13_weight_offset', 1)\n", "w13_weight_offset", False),
    ("class B:\n    def w13_weight_offset(self):\n        pass\n", "w13_weight_offset", False),  # a method
    ("x = 'w13_weight_offset'\n", "w13_weight_offset", True),  # named in a string, not stored
    ("def f(:\n  w13_weight_offset\n", "w13_weight_offset", False),  # unreadable and names it
    ("def f(:\n", "w13_weight_offset", True),              # unreadable, never names it
    ("class C:\n    def create_weights(self, layer):\n        self.w2_weight_offset = 0\n", "w2_weight_offset", True),
])
def test_a_weight_only_create_weights_registers(tmp_path, other, name, expected):
    root = _tree(tmp_path, REGISTERS, other)
    assert create_weights_only(root, name) is expected


def test_the_answer_follows_one_file_among_many_names(tmp_path):
    # the per-file reading is shared by every name asked: asking one name first changes no other answer
    root = _tree(tmp_path, REGISTERS, "def g(layer):\n    setattr(layer, 'w2_weight_offset', 2)\n")
    assert create_weights_only(root, "w13_weight_offset") is True
    assert create_weights_only(root, "w2_weight_offset") is False
    assert create_weights_only(root, "own_flag") is False

"""The dispatch-following audit on copies of SGLang 0.5.23 written differently or damaged: the
same verdicts when the code only moves, UNDECIDED with a place (never ABSENT, never a traceback,
never a hang) when it cannot follow, and the input tree untouched."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from nvfp4study.core.errors import AuditError
from nvfp4study.sglang import audit as sa
from nvfp4study.sglang.source import copy_tree
from sglang_fixtures import released

SRT = "sglang/srt/"
TRITON = "layers/moe/moe_runner/triton.py"
W4A4 = "layers/quantization/compressed_tensors/schemes/compressed_tensors_w4a4_nvfp4_moe.py"
IDS = ["nvfp4-w4a4-cutlass", "nvfp4-w4a4-trtllm", "triton", "deep-gemm", "mxfp4-cutlass"]


@pytest.fixture(scope="module")
def baseline() -> dict[str, str]:
    return {r.path: r.verdict.value for r in sa.audit_tree(released("0.5.23"), IDS)}


@pytest.fixture
def t(tmp_path):
    return copy_tree(released("0.5.23"), tmp_path / "t")


def _sub(tree, rel: str, pattern: str, repl: str, count: int = 1) -> None:
    p = tree.file(SRT + rel)
    text, n = re.subn(pattern, repl, p.read_text(), count=count, flags=re.M)
    assert n, pattern
    p.write_text(text)


def _verdicts(tree) -> dict[str, str]:
    return {r.path: r.verdict.value for r in sa.audit_tree(tree, IDS)}


# --- the code moves, the verdicts stay ----------------------------------------------------------
@pytest.mark.parametrize("form", [
    '@register_fused_func(a2a_backend_name="none", runner_backend_name="triton")',
    "_A2A = 'none'\n@register_fused_func(_A2A, 'triton')",
])
def test_registration_spelled_otherwise(t, baseline, form):
    _sub(t, TRITON, r'^@register_fused_func\("none", "triton"\)', form)
    assert _verdicts(t) == baseline


def test_registration_by_call(t, baseline):
    _sub(t, TRITON, r'^@register_fused_func\("none", "triton"\)\n', "")
    p = t.file(SRT + TRITON)
    p.write_text(p.read_text() + '\nregister_fused_func("none", "triton")(fused_experts_none_to_triton)\n')
    assert _verdicts(t) == baseline


def test_enum_moved_with_a_reexport(t, baseline):
    utils = t.file(SRT + "layers/moe/utils.py")
    text = utils.read_text()
    start = text.index("class _MoeRunnerBackendPredicates")
    end = text.index("\n@dataclass(frozen=True)\nclass RegisteredMoeRunnerBackend")
    moved = "from __future__ import annotations\nfrom enum import Enum\n\n" + text[start:end] + "\n"
    (utils.parent / "runner_backends.py").write_text(moved)
    utils.write_text(text[:start] + "from sglang.srt.layers.moe.runner_backends import "
                     "MoeRunnerBackend, _MoeRunnerBackendPredicates\n" + text[end:])
    assert _verdicts(t) == baseline


def test_core_renamed(t, baseline):
    for rel in ("layers/moe/moe_runner/deep_gemm.py", "layers/moe/moe_runner/runner.py"):
        p = t.file(SRT + rel)
        p.write_text(p.read_text().replace("DeepGemmRunnerCore", "DeepGemmEngine"))
    assert _verdicts(t) == baseline


def test_class_renamed_with_an_alias(t, baseline):
    _sub(t, W4A4, r"^class CompressedTensorsW4A4Nvfp4MoE\(", "class W4A4Nvfp4Scheme(")
    p = t.file(SRT + W4A4)
    p.write_text(p.read_text().replace("CompressedTensorsW4A4Nvfp4MoE.", "W4A4Nvfp4Scheme.")
                 + "\nCompressedTensorsW4A4Nvfp4MoE = W4A4Nvfp4Scheme\n")
    assert _verdicts(t) == baseline


def test_runner_built_through_a_module(t, baseline):
    p = t.file(SRT + W4A4)
    text = p.read_text().replace("self.runner = MoeRunner(\n", "self.runner = mod.MoeRunner(\n")
    p.write_text(text.replace("from sglang.srt.layers.moe", "import sglang.srt.layers.moe.moe_runner as mod\n"
                              "from sglang.srt.layers.moe", 1))
    assert _verdicts(t) == baseline


def test_runner_built_with_keywords(t, baseline):
    p = t.file(SRT + W4A4)
    text = p.read_text()
    for b in ("FLASHINFER_TRTLLM", "FLASHINFER_CUTLASS"):
        text = text.replace(f"MoeRunnerBackend.{b}, moe_runner_config",
                            f"runner_backend=MoeRunnerBackend.{b}, config=moe_runner_config")
    p.write_text(text)
    assert _verdicts(t) == baseline


def test_registry_update_is_followed(t):
    p = t.file(SRT + "layers/quantization/__init__.py")
    text = p.read_text()
    assert '    "compressed-tensors": CompressedTensorsConfig,\n' in text
    p.write_text(text.replace('    "compressed-tensors": CompressedTensorsConfig,\n', "")
                 + '\nBASE_QUANTIZATION_METHODS.update({"compressed-tensors": CompressedTensorsConfig})\n')
    assert _verdicts(t)["nvfp4-w4a4-cutlass"] == "APPROX"


# --- it cannot follow: UNDECIDED with a place ---------------------------------------------------
def test_two_registrations_for_one_key(t):
    stub = t.file(SRT + "layers/moe/moe_runner/aaa_stub.py")
    stub.write_text("from .base import register_fused_func\n\n@register_fused_func('none', 'triton')\n"
                    "def other(dispatch_output, quant_info, runner_config):\n    return None\n")
    r = sa.audit_tree(t, ["triton"])[0]
    assert r.verdict.value == "UNDECIDED" and "2 functions registered for ('none', 'triton')" in r.rule
    assert "import order" in r.rule


def test_unreadable_registry_entry_is_reported(t):
    p = t.file(SRT + "layers/quantization/__init__.py")
    p.write_text(p.read_text().replace('    "fp8": Fp8Config,\n', '    "fp8": Fp8Config,\n    "ghost": GhostConfig,\n'))
    rows = {r.path: r for r in sa.audit_tree(t)}
    assert rows["quantization:ghost"].verdict.value == "UNDECIDED"
    assert "'ghost' names GhostConfig, not found" in rows["quantization:ghost"].rule


def test_a_broken_unrelated_file_costs_only_its_paths(t, baseline):
    (t.file(SRT + "layers/quantization/petit.py")).write_text("def broken(:\n")
    rows = {r.path: r for r in sa.audit_tree(t)}
    assert {k: rows[k].verdict.value for k in IDS} == baseline
    bad = rows["unreadable:layers/quantization/petit.py"]
    assert bad.verdict.value == "UNDECIDED" and "petit.py:1" in bad.rule


def test_non_utf8_file_on_a_path(t):
    p = t.file(SRT + TRITON)
    p.write_bytes(p.read_bytes().replace(b"# ", "# \xe9 ".encode("latin-1"), 1))
    r = sa.audit_tree(t, ["triton"])[0]
    assert r.verdict.value == "UNDECIDED" and "triton.py" in r.rule and "cannot" in r.rule


def test_deep_expression_on_a_path(t):
    p = t.file(SRT + TRITON)
    deep = "x = " + "+".join(["1"] * 4000) + "\n"
    p.write_text(p.read_text() + "\ndef _deep():\n    " + deep)
    r = sa.audit_tree(t, ["triton"])[0]  # the parser gives up: a named, per-path result
    assert r.verdict.value == "UNDECIDED"


def test_model_file_unreadable_is_a_named_error(t):
    p = t.file(SRT + "models/bailing_moe_v3.py")
    p.write_bytes(b"\xff\xfe" + p.read_bytes())
    with pytest.raises(AuditError, match="bailing_moe_v3.py"):
        sa.audit_tree(t, ["triton"])


def test_fifo_and_bad_links_do_not_hang_or_crash(t, baseline):
    d = t.file(SRT + "layers/moe")
    os.mkfifo(d / "pipe.py")
    (d / "dangling.py").symlink_to(d / "nowhere.py")
    (d / "loop.py").symlink_to(d / "loop.py")
    code = ("import sys; sys.path.insert(0, 'lib'); from nvfp4study.sglang.source import open_tree; "
            "from nvfp4study.sglang.audit import audit_tree; "
            f"print({{r.path: r.verdict.value for r in audit_tree(open_tree({str(t.root)!r}), {IDS!r})}})")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=Path(sa.__file__).parents[3])
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == str(baseline)


def test_the_input_tree_is_not_modified(t):
    def digest(root: Path) -> str:
        h = hashlib.sha256()
        for p in sorted(root.rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts:
                h.update(p.as_posix().encode() + p.read_bytes())
        return h.hexdigest()

    before = digest(t.root)
    sa.audit_tree(t)
    assert digest(t.root) == before


# --- second round: the same code in other statements -------------------------------------------
def _wrap_body(tree, rel: str, func: str, head: list[str], depth: int, tail: list[str] = ()) -> None:
    """Re-indent ``func``'s body ``depth`` levels under the ``head`` lines (and ``tail`` after)."""
    import ast

    p = tree.file(SRT + rel)
    lines = p.read_text().splitlines()
    fn = next(n for n in ast.walk(ast.parse("\n".join(lines))) if isinstance(n, ast.FunctionDef) and n.name == func)
    first, last = fn.body[0].lineno - 1, fn.end_lineno
    if isinstance(fn.body[0], ast.Expr) and isinstance(fn.body[0].value, ast.Constant):  # keep the docstring
        first = fn.body[0].end_lineno
    ind = " " * (fn.body[0].col_offset)
    body = [(" " * 4 * depth + ln) if ln.strip() else ln for ln in lines[first:last]]
    new = [ind + h for h in head] + body + [ind + t for t in tail]
    p.write_text("\n".join(lines[:first] + new + lines[last:]) + "\n")


@pytest.mark.parametrize("head,depth,tail", [
    (["match 0:", "    case _:"], 2, []),
    (["try:", "    pass", "except ImportError:", "    raise", "else:"], 1, []),
    (["for _ in ():", "    pass", "else:"], 1, []),
    (["def _inner():"], 1, ["return _inner()"]),
], ids=["match", "try-else", "for-else", "nested-def"])
def test_body_under_other_statements(t, baseline, head, depth, tail):
    _wrap_body(t, TRITON, "fused_experts_none_to_triton", head, depth, tail)
    assert _verdicts(t)["triton"] == baseline["triton"]


def test_too_long_to_follow_is_undecided(t):
    from nvfp4study.sglang.clamp_flow import Interp

    _wrap_body(t, TRITON, "fused_experts_none_to_triton", ["_pad = 0"] * (Interp.MAX_STEPS + 1), 0)
    r = sa.audit_tree(t, ["triton"])[0]
    assert r.verdict.value == "UNDECIDED" and "too long to follow" in r.rule


def test_method_bound_by_name(t, baseline):
    _sub(t, W4A4, r"^    def apply_weights\(", "    def _apply_weights_impl(")
    p = t.file(SRT + W4A4)
    text = p.read_text()
    i = text.index("    def _apply_weights_impl(")
    j = text.index("\n    def ", i + 10) if "\n    def " in text[i + 10:] else len(text)
    p.write_text(text[:j] + "\n\n    apply_weights = _apply_weights_impl\n" + text[j:])
    assert _verdicts(t) == baseline


def test_limit_bound_by_partial(t, baseline):
    rel = "layers/moe/moe_runner/flashinfer_cutlass.py"
    p = t.file(SRT + rel)
    text = p.read_text()
    assert "swiglu_limit=quant_info.swiglu_limit," in text and "= flashinfer_cutlass_fused_moe(" in text
    text = text.replace("swiglu_limit=quant_info.swiglu_limit,", "", 1)
    text = text.replace("= flashinfer_cutlass_fused_moe(", "= functools.partial(flashinfer_cutlass_fused_moe, "
                        "swiglu_limit=quant_info.swiglu_limit)(", 1)
    p.write_text("import functools\n" + text)
    assert _verdicts(t)["nvfp4-w4a4-cutlass"] == baseline["nvfp4-w4a4-cutlass"]


def test_class_under_a_top_level_if(t, baseline):
    p = t.file(SRT + W4A4)
    lines = p.read_text().splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("class CompressedTensorsW4A4Nvfp4MoE"))
    lines[start:] = ["if True:"] + [("    " + ln) if ln.strip() else ln for ln in lines[start:]]
    p.write_text("\n".join(lines) + "\n")
    assert _verdicts(t) == baseline


def test_linked_package_folder(t, baseline, tmp_path):
    d = t.file(SRT + "layers/moe/moe_runner")
    moved = tmp_path / "moved_moe_runner"
    d.rename(moved)
    d.symlink_to(moved, target_is_directory=True)
    assert _verdicts(t) == baseline


def test_registry_filled_otherwise(t, baseline):
    p = t.file(SRT + "layers/quantization/__init__.py")
    text = p.read_text()
    line = '    "compressed-tensors": CompressedTensorsConfig,\n'
    p.write_text(text.replace(line, "") + '\nif True:\n    BASE_QUANTIZATION_METHODS |= {"compressed-tensors": '
                 "CompressedTensorsConfig}\n")
    assert _verdicts(t)["nvfp4-w4a4-cutlass"] == baseline["nvfp4-w4a4-cutlass"]


def test_registrar_aliased_or_built_ahead(t, baseline):
    _sub(t, TRITON, r'^@register_fused_func\("none", "triton"\)',
         '_triton = register_fused_func("none", "triton")\n@_triton')
    assert _verdicts(t)["triton"] == baseline["triton"]


def test_missing_registry_is_named(t):
    t.file(SRT + "layers/quantization/__init__.py").unlink()
    rows = {r.path: r for r in sa.audit_tree(t)}
    assert "quantization/__init__.py is missing" in rows["quantization:registry"].rule


@pytest.mark.parametrize("version", ["", "1" * 5000, "0.5.23 "])
def test_bad_release_number_is_a_named_error(version):
    from nvfp4study.core.errors import SGLangSourceError
    from nvfp4study.sglang import audit_report
    with pytest.raises(SGLangSourceError, match="is not an SGLang release number"):
        audit_report.main(["--version", version])


def test_unrecognised_registration_names_its_file(t):
    _sub(t, TRITON, r'^@register_fused_func\("none", "triton"\)\n', "")
    p = t.file(SRT + TRITON)
    p.write_text(p.read_text() + '\n_r = getattr(__import__("builtins"), "register_fused_func", None)\n'
                 'REG = {"register_fused_func": ("none", "triton")}\n')
    r = sa.audit_tree(t, ["triton"])[0]
    assert r.verdict.value == "UNDECIDED" and r.rule.startswith(f"trail lost: {TRITON} names 'triton'")


def test_the_text_of_at_most_two_trees_is_kept(tmp_path):
    """``attribute_never_set`` reads every file of a tree; each audited tree (a test's edited copy)
    once kept its text for good (50 MB a release): the suite's process grew by that per copy."""
    from nvfp4study.sglang import code_index as ci
    from nvfp4study.sglang import tree_files

    roots = []
    for i in range(4):
        src = tmp_path / f"t{i}" / "sglang" / "srt"
        src.mkdir(parents=True)
        (src / "m.py").write_text(f"class A:\n    x = {i}\n" + ("    def y(self):\n        pass\n" if i % 2 else ""))
        roots.append(src.parents[1])
    import gc

    got = [ci.attribute_never_set(roots[0], "y")]
    first = ci.source_files(roots[0])[0][1]  # the first tree's text, as the reader holds it
    got += [ci.attribute_never_set(r, "y") for r in roots[1:]]
    assert got == [True, False, True, False]  # ``def y(`` in the odd trees only
    tree_files._read_sources.cache_clear()
    gc.collect()
    # nothing else keeps the first tree's text: only this test's own name for it
    assert not [r for r in gc.get_referrers(first) if isinstance(r, (list, tuple, dict))]

"""The audit's in-process memos (issue 33, ``make test`` within 10 minutes) give what the plain
computation gives: the tree stamp lists files in pathlib's order, a node's kept unparsed text is
dropped by a renamed copy, the interpreter's per-module parts follow a file edited in place, and
the import guards read once come back as fresh lists, and what is kept once per tree state (path
specs, the server arguments' fusion overrides, the class index behind ``config_names``) is computed
again after an edit or a swapped table, and handed out as copies."""

from __future__ import annotations

import ast
import os
from pathlib import Path

from nvfp4study.sglang import code_index as ci
from nvfp4study.sglang import import_gates as ig
from nvfp4study.sglang.clamp_flow import Interp
from nvfp4study.sglang.clamp_values import unparse


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = tmp_path / "sglang" / "srt" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return tmp_path


def test_tree_stamp_rows_and_order_are_pathlibs(tmp_path):
    # "a-c" < "a/" as strings but "a" < "a-c" as path parts: the stamp keeps the parts' order
    root = _tree(tmp_path, {"a/b.py": "x = 1\n", "a-c/x.py": "y = 22\n", "a.py": "", "a_b/y.py": "z = 3\n",
                            "a/n.txt": "not python\n"})
    (root / "sglang/srt/a/dangling.py").symlink_to(root / "sglang/srt/a/nowhere.py")
    paths = sorted(p for p in (root / "sglang/srt").rglob("*.py"))
    expected = tuple((p.as_posix(), *((p.stat().st_size, p.stat().st_mtime_ns) if p.exists() else (-1, -1)))
                     for p in paths)
    assert ci.tree_stamp(root) == expected
    assert [p.as_posix() for p in ci.py_files(root)] == [p.as_posix() for p in paths]
    assert [r[0].rsplit("/sglang/srt/", 1)[1] for r in expected] == \
        ["a/b.py", "a/dangling.py", "a-c/x.py", "a.py", "a_b/y.py"]
    assert ci.tree_stamp(Path(os.path.relpath(root))) == tuple(
        (Path(os.path.relpath(p)).as_posix(), *r[1:]) for p, r in zip(paths, expected, strict=True))


def test_a_renamed_copy_does_not_keep_the_old_text():
    cls = ast.parse("class A:\n    def f(self):\n        return 1\n    g = f\n").body[0]
    f = cls.body[0]
    assert unparse(f) == ast.unparse(f) and unparse(f).startswith("def f(")
    renamed = {fn.name: fn for fn in ci.funcs(cls)}["g"]
    assert unparse(renamed) == ast.unparse(renamed) and unparse(renamed).startswith("def g(")
    assert unparse(f).startswith("def f(")  # the original keeps its own


def test_interpreter_modules_follow_a_file_edited_in_place(tmp_path):
    rel = "sglang/srt/m.py"
    root = _tree(tmp_path, {"m.py": "from os import path\n\ndef f():\n    return 1\n"})
    one = Interp(root, set()).module(rel)
    assert set(one.functions) == {"f"} and one.imports == {"path": ("os", "path")}
    (root / rel).write_text("from os import sep\n\nclass C:\n    def g(self):\n        return 2\n\ndef h():\n    pass\n")
    two = Interp(root, set()).module(rel)
    assert set(two.functions) == {"h"} and set(two.classes) == {"C"} and two.imports == {"sep": ("os", "sep")}
    assert Interp(root, set()).module("sglang/srt/absent.py") is None


def test_import_guards_read_once_are_fresh_lists():
    mod = ast.parse("import os\nif os.environ.get('X'):\n    from a.b import c\nelse:\n    import a.b.c\n")
    first = ig._imports_of(mod, "a.b.c")
    assert first == ig._read_imports_of(mod, "a.b.c") == [(3, None), (5, None)]
    first.append((99, "mutated"))
    assert ig._imports_of(mod, "a.b.c") == [(3, None), (5, None)]


def test_once_per_state_recomputes_on_an_edit_or_a_swapped_table_and_hands_out_copies(tmp_path):
    from nvfp4study.sglang.source import SGLangTree
    from nvfp4study.sglang.tree_files import once_per_state

    root = _tree(tmp_path, {"a.py": "x = 1\n"})
    tree = SGLangTree(root=root, version="0.0.0")
    calls, table = [], {"rows": 1}

    @once_per_state(depends=lambda: (table,))
    def rows(t):
        calls.append(t)
        text = (t.root / "sglang/srt/a.py").read_text()
        return [{"text": text, "n": table["rows"]}]

    first = rows(tree)
    first[0]["text"] = "changed by a caller"
    assert rows(tree) == [{"text": "x = 1\n", "n": 1}] and len(calls) == 1  # a copy each time, computed once
    (root / "sglang/srt/a.py").write_text("x = 22\n")  # another size: another state
    assert rows(tree) == [{"text": "x = 22\n", "n": 1}] and len(calls) == 2
    table = {"rows": 2}  # another table object (what a caller swapping the catalogue does): computed again
    assert rows(tree) == [{"text": "x = 22\n", "n": 2}] and len(calls) == 3
    rows.cache_clear()
    assert rows(tree) == [{"text": "x = 22\n", "n": 2}] and len(calls) == 4


def test_custom_op_signatures_follow_a_file_edited_in_place(tmp_path):
    # the registered custom ops are read once per state of the tree, not once per root: a tree patched
    # in place (stage 03 switches an install's modes) is read again
    from nvfp4study.sglang.param_runner import _custom_ops
    from nvfp4study.sglang.tree_files import tree_stamp

    op = "@register_custom_op\ndef {n}(x: int, k: Optional[int] = None) -> int:\n    return x\n"
    root = _tree(tmp_path, {"ops.py": "from typing import Optional\n" + op.format(n="first")})
    assert set(_custom_ops(root, tree_stamp(root))) == {"first"}
    (root / "sglang/srt/ops.py").write_text("from typing import Optional\n" + op.format(n="first") + "\n\n"
                                            + op.format(n="second"))
    ops = _custom_ops(root, tree_stamp(root))  # line 8: the second op's `def` (after two blank lines)
    assert ops["second"] == ("sglang/srt/ops.py", 8, (("x", "int"), ("k", "Optional[int]")))


def _config_names_by_scan(root: Path, cls: str) -> frozenset[str]:
    # the plain reading, independent of the index: every file in order, the first with the class
    # and its get_name
    for path in sorted((root / "sglang" / "srt").rglob("*.py")):
        text = path.read_text()
        if f"class {cls}" not in text:
            continue
        node = next((n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.ClassDef) and n.name == cls), None)
        fn = next((n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "get_name"), None) if node else None
        if fn is not None:
            return frozenset(c.value for r in ast.walk(fn) if isinstance(r, ast.Return) for c in ast.walk(r)
                             if isinstance(c, ast.Constant) and isinstance(c.value, str))
    return frozenset()


def test_config_names_from_the_class_index_are_the_plain_scans(tmp_path):
    from nvfp4study.sglang.shared_fusion import config_names

    root = _tree(tmp_path, {
        "a.py": "# a subclass of FooConfig, and class class FooConfig in a comment\nclass FooConfigX:\n"
                "    def get_name(self):\n        return 'x'\n",
        "b.py": "class FooConfig:\n    pass\n",  # no get_name: the next file's is taken
        "c/d.py": "def f():\n    class FooConfig:\n        def get_name(self):\n            return 'nested'\n"
                  "class Bar:\n    def get_name(self):\n        return 'bar' if x else 'baz'\n",
        "e.py": "class FooConfig:\n    def get_name(self):\n        return 'late'\n",
        # a name the old text test finds only through another word's spelling: "class FooBar" in a
        # comment, the class itself after a tab
        "f.py": "# class FooBar\nclass\tFoo:\n    def get_name(self):\n        return 'tab'\n",
        # identifiers with characters \\w does not match (a combining accent, a middle dot)
        "g.py": "class Q\u0301Cfg:\n    def get_name(self):\n        return 'accent'\n"
                "class R\u00b7Cfg:\n    def get_name(self):\n        return 'dot'\n"
                "# class "})  # "class " at the very end of a text
    for cls in ("FooConfig", "FooConfigX", "Bar", "Foo", "Absent", "class", "", "Q\u0301Cfg", "R\u00b7Cfg",
                "Q\u0301", "FooConfigXYZ1234"):
        assert config_names(root, cls) == set(_config_names_by_scan(root, cls)), cls
    assert config_names(root, "FooConfig") == {"nested"} and config_names(root, "Bar") == {"bar", "baz"}
    assert config_names(root, "Foo") == {"tab"} and config_names(root, "R\u00b7Cfg") == {"dot"}
    assert config_names(root, "Q\u0301Cfg") == {"accent"}
    (root / "sglang/srt/c/d.py").write_text("x = 1\n")  # edited in place: read again
    assert config_names(root, "FooConfig") == {"late"} == set(_config_names_by_scan(root, "FooConfig"))


def test_config_names_on_a_release_are_the_plain_scans():
    from nvfp4study.sglang.shared_fusion import config_names
    from sglang_fixtures import released

    root = released("0.5.23").root
    for cls in ("Fp8Config", "CompressedTensorsConfig", "ModelOptFp4Config", "W4AFp8Config", "Mxfp4Config"):
        assert config_names(root, cls) == set(_config_names_by_scan(root, cls)), cls
    assert config_names(root, "Fp8Config") == {"fp8", "mxfp8"}


def test_forced_off_is_decided_again_after_an_edit_and_handed_out_as_a_new_list(tmp_path):
    from nvfp4study.sglang.fusion_overrides import forced_off

    fields = "moe_runner_backend: str = 'auto'\nmoe_a2a_backend: str = 'none'\nload_format: str = 'auto'\n"
    root = _tree(tmp_path, {"arg_groups/fields/moe.py": fields, "arg_groups/overrides.py":
                            "def _off(view):\n    if view.moe_runner_backend == 'x' and view.load_format == 'auto':\n"
                            "        view.disable_shared_experts_fusion = True\n"})
    one = forced_off(root, "x", "none")
    assert [(o.where, o.test) for o in one] == [
        ("arg_groups/overrides.py:3", "view.moe_runner_backend == 'x' and view.load_format == 'auto'")]
    assert forced_off(root, "y", "none") == [] and forced_off(root, None, "none") == []
    # a field the checkpoint sets is unknown: the test over it decides nothing, so no write is counted
    assert forced_off(root, "x", "none", ("load_format",)) == [] and len(forced_off(root, "x", "none")) == 1
    one.clear()  # a caller's list is its own
    assert len(forced_off(root, "x", "none")) == 1
    (root / "sglang/srt/arg_groups/overrides.py").write_text(
        "def _off(view):\n    if view.moe_runner_backend == 'yy':\n        view.disable_shared_experts_fusion = True\n")
    assert forced_off(root, "x", "none") == [] and len(forced_off(root, "yy", "none")) == 1

def test_fused_registrations_kept_per_parsed_module_are_named_by_each_file(tmp_path):
    from nvfp4study.sglang import dispatch as dp

    reg = "from x import register_fused_func\n\n@register_fused_func('none', 'r1')\ndef f():\n    pass\n"
    root = _tree(tmp_path, {"a/m.py": reg, "b/m.py": reg})  # one parsed module for both texts
    assert dp.fused_registry(ci.CodeIndex(root)) == {
        ("none", "r1"): [("sglang/srt/a/m.py", "f", 3), ("sglang/srt/b/m.py", "f", 3)]}
    (root / "sglang/srt/b/m.py").write_text(reg.replace("'r1'", "'r22'").replace("def f", "def g"))
    assert dp.fused_registry(ci.CodeIndex(root)) == {("none", "r1"): [("sglang/srt/a/m.py", "f", 3)],
                                                     ("none", "r22"): [("sglang/srt/b/m.py", "g", 3)]}

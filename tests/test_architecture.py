"""The library's architecture as tests: notebooks -> stages -> wings -> core, no import circles.

The import graph is built from the source with ``ast`` (every ``import`` and ``from ... import``,
including those inside functions), so a lazy import cannot hide a circle.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
from pathlib import Path

import pytest

from nvfp4study.core.params import REPO_ROOT

LIB = REPO_ROOT / "lib"
PKG = LIB / "nvfp4study"
WINGS = ("checkpoint", "sglang", "serving", "codeeval", "workstation", "report", "trained")
NOTEBOOKS = sorted((REPO_ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def module_name(path: Path) -> str:
    parts = path.relative_to(LIB).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PKG.rglob("*.py")}


def imports_of(path: Path, known: set[str]) -> set[str]:
    """nvfp4study modules that ``path`` imports (a ``from pkg import name`` of a submodule counts
    as an import of that submodule)."""
    name = module_name(path)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == "nvfp4study"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.split(".")[0] != "nvfp4study":
                continue
            for a in node.names:
                sub = f"{mod}.{a.name}"
                out.add(sub if sub in known else mod)
    return {m for m in out if m in known and m != name}


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports_of(path, set(mods)) for name, path in mods.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle as a path ``[a, b, ..., a]``, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(u: str) -> list[str] | None:
        state[u] = 1
        stack.append(u)
        for w in sorted(graph.get(u, ())):
            if state.get(w) == 1:
                return stack[stack.index(w):] + [w]
            if w not in state and (c := visit(w)):
                return c
        stack.pop()
        state[u] = 2
        return None

    for u in sorted(graph):
        if u not in state and (c := visit(u)):
            return c
    return None


def test_cycle_finder_finds_a_planted_circle():
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(g) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_graph_sees_lazy_and_relative_imports(tmp_path):
    known = {"nvfp4study.core.params", "nvfp4study.core.paths", "nvfp4study.core"}
    src = PKG / "core" / "paths.py"
    assert "nvfp4study.core.params" in imports_of(src, known | {"nvfp4study.core.paths"})


def test_no_import_circles_anywhere():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def wing_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


RULES_PKG = "nvfp4study.stages.claim_rules"


def is_rules(module: str) -> bool:
    """The stages' claim rules (``stages/claim_rules/``): a stage may import them, they import no stage."""
    return module == RULES_PKG or module.startswith(RULES_PKG + ".")


def test_core_imports_no_wing_and_wings_import_no_stage():
    bad = []
    for mod, deps in import_graph().items():
        w = wing_of(mod)
        for d in deps:
            dw = wing_of(d)
            if w == "core" and dw != "core":
                bad.append(f"{mod} (core) imports {d}")
            if w in WINGS and dw in ("stages", "cli"):
                bad.append(f"{mod} (wing {w}) imports {d}")
            if w == "stages" and dw == "stages" and not (is_rules(d) and not is_rules(mod)):
                bad.append(f"{mod} (a stage or its rules) imports another stage {d}")
    assert not bad, "\n".join(bad)


def notebook_code(path: Path) -> str:
    return "\n".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"]
                     if c["cell_type"] == "code")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_imports_only_its_stage_module(path):
    tree = ast.parse(notebook_code(path))
    ours = [(n.module, a.name, a.asname) for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
            for a in n.names if (n.module or "").split(".")[0] == "nvfp4study"]
    ours += [(a.name, "", a.asname) for n in ast.walk(tree) if isinstance(n, ast.Import)
             for a in n.names if a.name.split(".")[0] == "nvfp4study"]
    assert len(ours) == 1, f"{path.name} imports {ours}"
    module, name, alias = ours[0]
    assert module == "nvfp4study.stages" and re.fullmatch(rf"s{path.stem[:2]}_\w+", name), ours
    import importlib

    stage_module = importlib.import_module(f"nvfp4study.stages.{name}")
    assert stage_module.NOTEBOOK == path.stem
    assert f"{alias or name}.open_stage(params_file, run_dir)" in notebook_code(path)


def own_names(path: Path) -> set[str]:
    """Top-level names a module defines itself (``def``, ``class``, assignment), imports left out."""
    out: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            out |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return out


def foreign_attributes(code: str, alias: str, module) -> list[str]:
    """The ``alias.<name>`` of ``code`` that are not the stage module's own function or constant:
    a module, a name it imports, or a function of another module bound to a name there."""
    import inspect
    import types

    own = own_names(Path(module.__file__))
    bad = []
    for name in sorted({n.attr for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Attribute)
                        and isinstance(n.value, ast.Name) and n.value.id == alias}):
        value = getattr(module, name, None)
        if name not in own or isinstance(value, types.ModuleType):
            bad.append(f"{alias}.{name} (not defined in {module.__name__})")
        elif (inspect.isfunction(value) or inspect.isclass(value)) and value.__module__ != module.__name__:
            bad.append(f"{alias}.{name} (is {value.__module__}.{value.__name__})")
    return bad


def test_foreign_attribute_finder_finds_planted_ones():
    from nvfp4study.stages import s02_inspect, s05_corruption

    code = "s5.served.figure(x)\ns5.run_served_study(stage)\ns5.load_tasks()\ns5.NOTEBOOK\n"
    assert foreign_attributes(code, "s5", s05_corruption) == [
        "s5.load_tasks (not defined in nvfp4study.stages.s05_corruption)",
        "s5.served (not defined in nvfp4study.stages.s05_corruption)"]
    # an assignment that binds another module's function is caught by what it holds
    assert foreign_attributes("ins.real_config()", "ins", s02_inspect) == [
        "ins.real_config (is nvfp4study.checkpoint.compare.real_config)"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_calls_only_its_stage_modules_own_names(path):
    """A stage is its notebook's whole API: ``sN.<name>`` is a function or constant defined in
    the stage module, never a wing module or a name the stage imports from elsewhere."""
    import importlib

    tree = ast.parse(notebook_code(path))
    (alias, name), = [(a.asname or a.name, a.name) for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                      and n.module == "nvfp4study.stages" for a in n.names]
    bad = foreign_attributes(notebook_code(path), alias, importlib.import_module(f"nvfp4study.stages.{name}"))
    assert not bad, f"{path.name} reaches past its stage: {bad}"


def test_every_notebook_has_one_stage_module_and_back():
    stages = {p.stem for p in (PKG / "stages").glob("s[0-9][0-9]_*.py")}
    assert {f"s{p.stem[:2]}" for p in NOTEBOOKS} == {s[:3] for s in stages}


def test_no_two_classes_in_the_library_share_a_name():
    """A class name says what it is on its own (``AuditFinding``, ``DetectorFinding``, ``CodeIndex``):
    two classes of one name in different wings read the same in a signature and a traceback."""
    where: dict[str, list[str]] = {}
    for path in sorted(PKG.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                where.setdefault(node.name, []).append(f"{path.relative_to(LIB)}:{node.lineno}")
    shared = {name: places for name, places in where.items() if len(places) > 1}
    assert not shared, f"class names defined more than once: {shared}"


def long_module_reasons() -> dict[str, str]:
    """``path: reason`` lines of CONTRIBUTING.md's "Modules over 500 lines" list."""
    text = (REPO_ROOT / "CONTRIBUTING.md").read_text()
    section = text.split("### Modules over 500 lines", 1)[1].split("\n#", 1)[0] if \
        "### Modules over 500 lines" in text else ""
    return dict(re.findall(r"^- `(lib/[^`]+\.py)`: (.+)$", section, flags=re.M))


def test_modules_stay_near_500_lines_or_say_why():
    reasons = long_module_reasons()
    long = {p.relative_to(REPO_ROOT).as_posix(): len(p.read_text().splitlines())
            for p in PKG.rglob("*.py")}
    unexplained = {p: n for p, n in long.items() if n > 500 and p not in reasons}
    assert not unexplained, f"over 500 lines with no reason in CONTRIBUTING.md: {unexplained}"
    stale = [p for p in reasons if long.get(p, 0) <= 500]
    assert not stale, f"CONTRIBUTING.md explains modules that are no longer long: {stale}"


#: longest function (``def`` line to last line, docstring included) without a reason in CONTRIBUTING.md
FUNCTION_LINES = 80


def long_function_reasons() -> dict[str, str]:
    """``path:qualname: reason`` lines of CONTRIBUTING.md's "Functions over 80 lines" list."""
    text = (REPO_ROOT / "CONTRIBUTING.md").read_text()
    section = text.split("### Functions over 80 lines", 1)[1].split("\n#", 1)[0] if \
        "### Functions over 80 lines" in text else ""
    return dict(re.findall(r"^- `(lib/[^`]+\.py:[\w.]+)`: (.+)$", section, flags=re.M))


def function_lengths(path: Path) -> dict[str, int]:
    """``qualname -> lines`` of every function and method of a module (nested ones included)."""
    out: dict[str, int] = {}

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + child.name
                if not isinstance(child, ast.ClassDef):
                    out[name] = child.end_lineno - child.lineno + 1
                walk(child, name + ".")
            else:
                walk(child, prefix)

    walk(ast.parse(path.read_text()), "")
    return out


def test_function_lengths_are_measured_with_their_class():
    lengths = function_lengths(PKG / "core" / "stage.py")
    assert lengths["Stage.record"] == 3 and "open_stage_named" in lengths


def test_functions_stay_near_80_lines_or_say_why():
    reasons = long_function_reasons()
    lengths = {f"{p.relative_to(REPO_ROOT).as_posix()}:{q}": n
               for p in PKG.rglob("*.py") for q, n in function_lengths(p).items()}
    unexplained = {k: n for k, n in lengths.items() if n > FUNCTION_LINES and k not in reasons}
    assert not unexplained, f"over {FUNCTION_LINES} lines with no reason in CONTRIBUTING.md: {unexplained}"
    stale = [k for k in reasons if lengths.get(k, 0) <= FUNCTION_LINES]
    assert not stale, f"CONTRIBUTING.md explains functions that are no longer long (or gone): {stale}"


@pytest.mark.parametrize("pkg", ["core", *WINGS, "stages"])
def test_each_wing_says_what_it_is_for_and_lists_its_names(pkg):
    init = PKG / pkg / "__init__.py"
    tree = ast.parse(init.read_text())
    doc = ast.get_docstring(tree)
    assert doc and len(doc.strip().splitlines()) >= 2, f"{init}: a docstring of two lines or more"
    names = [n for n in tree.body if isinstance(n, ast.Assign)
             and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets)]
    assert names, f"{init}: no __all__"
    listed = ast.literal_eval(names[0].value)
    on_disk = {p.stem for p in (PKG / pkg).glob("*.py") if p.stem != "__init__"}
    on_disk |= {p.parent.name for p in (PKG / pkg).glob("*/__init__.py")}  # subpackages
    assert set(listed) == on_disk, f"{init}: __all__ {sorted(listed)} != modules {sorted(on_disk)}"


#: a pointer into the workplace's shared folder beside the repository (``../`` + ``shared/...``, or its
#: ``reference`` / ``seed`` folders named bare); spelled in parts so this file does not match itself.
#: Not prose such as a reader's "shared/routed intermediate sizes".
OUTSIDE = re.compile(r"\.\./" + "shared" + r"/|(?<![\w.-])" + "shared" + r"/(?:reference|seed)\b")


def test_the_outside_pattern_tells_pointers_from_prose():
    s = "shared" + "/"
    assert OUTSIDE.search(f"see ../{s}reference/style.md") and OUTSIDE.search(f"in {s}seed/model-card.md")
    assert not OUTSIDE.search(f"when {s}routed intermediate sizes match") and not OUTSIDE.search(f"my_{s}reference")


def test_nothing_tracked_points_outside_the_repository():
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO_ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    hits = []
    for rel in tracked:
        p = REPO_ROOT / rel
        if rel == "tests/test_architecture.py" or not p.is_file() or p.suffix in (".png", ".parquet"):
            continue
        text = p.read_text(errors="replace")
        for i, line in enumerate(text.splitlines(), 1):
            if OUTSIDE.search(line):
                hits.append(f"{rel}:{i}: {line.strip()[:100]}")
    assert not hits, "\n".join(hits)


def test_every_data_file_is_package_data():
    """A non-editable install ships only what ``[tool.setuptools.package-data]`` names: every data
    file the library reads (claims, prompts, clamp paths, patches) must match a pattern there."""
    import fnmatch
    import tomllib

    patterns = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    tracked = subprocess.run(["git", "ls-files", "lib/nvfp4study"], cwd=REPO_ROOT, capture_output=True,
                             text=True, check=True).stdout.split()
    missing = []
    for rel in tracked:
        if rel.endswith(".py"):
            continue
        path = Path(rel).relative_to("lib")
        ok = False
        for pkg, globs in patterns.items():
            base = Path(*pkg.split("."))
            if base in path.parents:
                sub = path.relative_to(base).as_posix()
                ok |= any(fnmatch.fnmatch(sub, g) or fnmatch.fnmatch(sub, g.replace("**/", "*/"))
                          for g in globs)
        if not ok:
            missing.append(rel)
    assert not missing, f"not in package-data: {missing}"


#: modules allowed to test the engine, the launcher or a stage's name: the serving strategies
#: (what each (engine, launcher) pair does differently) and the kinds themselves.
BRANCH_OWNERS = {"nvfp4study/serving/strategies.py", "nvfp4study/core/kinds.py"}
#: known leftovers, each with why it is not yet moved (issue 33); empty this, never grow it.
BRANCH_LEFT = {
}
BRANCH_TEST = re.compile(r"""\b(?:engine|launcher)\s*[!=]=|[!=]=\s*(?:Engine|LauncherKind)\.|"""
                         r"""\bstage\.name\s*[!=]=|\.name\s*[!=]=\s*["']\d\d_""")


def branch_tests(text: str) -> list[str]:
    """The lines of ``text`` that test an engine, a launcher or a stage's name (comments too:
    a branch described is usually a branch made)."""
    return [ln.strip() for ln in text.splitlines() if BRANCH_TEST.search(ln)]


def test_branch_finder_finds_planted_ones():
    planted = ('if params.server.engine == "cpu":\n    x = 1\nif p.launcher != "docker": pass\n'
               'ok = stage.name == "04_launch_server"\nif s.engine is Engine.CPU: pass\n'
               'if kind == Engine.CPU: pass\nif st.name == "06_mtp_sweep": pass\n'
               'engine_summary = "x"  # not a test\nlauncher_for(params)\n')
    assert branch_tests(planted) == ['if params.server.engine == "cpu":', 'if p.launcher != "docker": pass',
                                     'ok = stage.name == "04_launch_server"', "if kind == Engine.CPU: pass",
                                     'if st.name == "06_mtp_sweep": pass']


def test_no_engine_launcher_or_stage_name_branches_outside_their_owners():
    found = {}
    for p in PKG.rglob("*.py"):
        rel = p.relative_to(LIB).as_posix()
        if rel not in BRANCH_OWNERS and (hits := branch_tests(p.read_text())):
            found[rel] = hits
    unexplained = {k: v for k, v in found.items() if k not in BRANCH_LEFT}
    assert not unexplained, f"engine/launcher/stage-name tests outside serving/strategies.py: {unexplained}"
    stale = sorted(set(BRANCH_LEFT) - set(found))
    assert not stale, f"BRANCH_LEFT names modules that no longer branch (remove them): {stale}"


#: what only the one reader of SGLang's log (serving/sglang_log.py) may look for in it
LOG_MARKERS = ("Decode batch", "Load weight end", "swiglu-clamp-patch", "Traceback", "Error|", "Error)")


def log_readers(tree: ast.AST) -> list[str]:
    """Regex patterns (``re.compile/search/match/...`` with a literal) and ``"..." in x`` tests
    in ``tree`` that look for a line of SGLang's log (:data:`LOG_MARKERS`)."""
    out = []
    for n in ast.walk(tree):
        lit = None
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name) \
                and n.func.value.id == "re" and n.args and isinstance(n.args[0], ast.Constant):
            lit = n.args[0].value
        elif isinstance(n, ast.Compare) and isinstance(n.left, ast.Constant) and any(
                isinstance(op, (ast.In, ast.NotIn)) for op in n.ops):
            lit = n.left.value
        if isinstance(lit, str) and any(m in lit for m in LOG_MARKERS):
            out.append(lit)
    return out


def test_log_reader_finder_finds_planted_ones():
    planted = ('import re\nA = re.compile(r"Decode batch, (.*)")\nif "Load weight end" in line: pass\n'
               'msg = "no Load weight end line"\nB = re.compile(r"\\d+")\n')
    assert log_readers(ast.parse(planted)) == ["Decode batch, (.*)", "Load weight end"]


def test_sglang_log_is_read_in_one_module():
    owner = PKG / "serving" / "sglang_log.py"
    assert log_readers(ast.parse(owner.read_text()))  # the reader is where the test looks
    found = {str(p.relative_to(LIB)): hits for p in PKG.rglob("*.py")
             if p != owner and (hits := log_readers(ast.parse(p.read_text())))}
    assert not found, f"SGLang's log read outside serving/sglang_log.py: {found}"


def code_strings(tree: ast.AST) -> list[str]:
    """The string literals of ``tree`` that are not docstrings."""
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in docs]


def test_only_the_serving_plans_reach_the_stages_at_run_time():
    # a wing never imports a stage; serving/plans.py asks each serving stage for its plan by name
    # (a plugin lookup, documented there); nothing else below the stages names their package in
    # code (core/bytecode.py lists it for byte-compiling only; cli.py is above the stages)
    allowed = {"nvfp4study/serving/plans.py", "nvfp4study/core/bytecode.py", "nvfp4study/cli.py"}
    named = sorted(rel for p in PKG.rglob("*.py")
                   if (rel := str(p.relative_to(LIB))) not in allowed and not rel.startswith("nvfp4study/stages/")
                   and any(v.startswith("nvfp4study.stages") for v in code_strings(ast.parse(p.read_text()))))
    assert not named, f"modules below the stages that name the stages package: {named}"

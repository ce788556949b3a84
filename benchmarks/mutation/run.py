"""Mutation benchmark: mutmut over the modules whose mistakes change a verdict or a user's safety.

``make mutation`` (or ``python benchmarks/mutation/run.py [--only NAME ...]``) runs mutmut
(pinned in pyproject's ``dev`` extras) once per module of :data:`MODULES`, each with only the test
files that cover it, under ``nice -n 10`` with two workers, and writes ``benchmarks/mutation/REPORT.md``:
the time taken, per module the killed / survived / equivalent counts, and every surviving mutant with
its reason from :data:`equivalent.EQUIVALENT` (or "UNEXPLAINED", which the run reports as a failure).

mutmut 3 names a mutant's module after its path with a leading ``src/`` dropped, and puts the mutated
copy first on ``sys.path`` only for a ``src`` layout; our package is under ``lib/``. So each module
runs in a scratch project ``.cache/mutation/<name>/`` whose ``src`` is a copy of ``lib``, ``tests`` a
link to ``tests`` and whose ``pyproject.toml`` holds that module's ``[tool.mutmut]`` section; mutmut
copies them into ``mutants/`` there and never writes in the repository. mutmut 3 leaves decorated
functions alone, which would leave every claim rule (``@claim_rule`` / ``@finding_rule``) and every
property unmutated: in the copy, the module under test has its decorators written as the plain
calls they stand for (:func:`undecorate`), so those bodies are mutated too.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from equivalent import EQUIVALENT  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
SCRATCH = REPO / ".cache" / "mutation"
REPORT = Path(__file__).resolve().parent / "REPORT.md"
#: mutmut through this interpreter: the venv's ``bin/mutmut`` script names, in its first line, the
#: interpreter of the venv as first created, which a moved or linked venv no longer has
MUTMUT = [sys.executable, "-m", "mutmut"]

#: functions not mutated, with the reason (mutmut's ``do_not_mutate_patterns`` on their ``def`` line)
PLOT = "draws a figure from the table; decides nothing"
SKIP: dict[str, dict[str, str]] = {
    "checkpoint/roundtrip.py": {"figure": PLOT},
    "sglang/clamp_numerics.py": {"figure": PLOT},
    "codeeval/isolation.py": {f: ("functools-cached (lru_cache), left decorated so mutmut does not mutate it: a result "
                                  "cached before mutmut forks a mutant's run would hide the mutant; "
                                  "tests/test_sandbox.py's fake bwrap scripts test the probe from both sides")
                              for f in ("python_roots", "_bwrap_probe", "_bwrap_version")},
    "codeeval/detect.py": {"_parser": ("`nvfp4study detect`'s option names and help text; main's tests "
                                       "(tests/test_detect_fields.py) call every option by name")},
    "serving/decode_log.py": {"main": ("`nvfp4study decode-log`'s printout of a log for a reader; its numbers come "
                                       "from parse_log and aggregates, which are mutated")},
}
#: modules of which only these functions are mutated (what the issue names in them)
ONLY: dict[str, tuple[str, ...]] = {
    "core/params.py": ("Params.digest",),
    "core/runner.py": ("_previous_manifest",),
    "codeeval/sandbox.py": ("check_program", "_classify", "_death", "_code_line", "_signal_of", "check_many",
                            "_discard", "_make_cap", "ExecResult.passed", "ExecResult.to_dict"),
}
#: name -> (module under lib/nvfp4study, the pytest selection that covers it), in the order run
MODULES: dict[str, tuple[str, list[str]]] = {
    "roundtrip": ("checkpoint/roundtrip.py", ["tests/test_roundtrip.py"]),
    "patch_journal": ("sglang/patch_journal.py", ["tests/test_patch_journal.py"]),
    "isolation": ("codeeval/isolation.py", ["tests/test_sandbox.py"]),
    "r06_mtp": ("stages/claim_rules/r06_mtp.py", ["tests/test_claim_rules_r06.py", "tests/test_mtp.py"]),
    "acceptance": ("serving/acceptance.py", ["tests/test_mtp.py"]),
    "decode_log": ("serving/decode_log.py", ["tests/test_decode_log.py"]),
    "params_digest": ("core/params.py", ["tests/test_params.py"]),
    "resume": ("core/runner.py", ["tests/test_runner.py::test_previous_manifest_resumes_only_with_the_same_params",
                                  "tests/test_params_digest.py"]),
    "check_scale_values": ("checkpoint/check_scale_values.py", ["tests/test_scale_values.py"]),
    "detect": ("codeeval/detect.py", ["tests/test_detect.py", "tests/test_detect_fields.py",
                                      "tests/test_detect_bounds.py", "tests/test_detector_validation.py"]),
    # compare() on small grids (test_compare_small_grid_by_hand); the 201 x 201 table test and the figure left out
    "clamp_numerics": ("sglang/clamp_numerics.py", ["tests/test_clamp_numerics.py", "-k",
                                                    "not test_compare_table and not test_figure"]),
    # tiny checkpoints (milliseconds each); tests/test_checkpoint_audit.py's Marlin-size ones left out
    "check_scales": ("checkpoint/check_scales.py", ["tests/test_check_scales.py"]),
    "r01_quantize": ("stages/claim_rules/r01_quantize.py", ["tests/test_claim_rules_r01.py"]),
    "r07_determinism": ("stages/claim_rules/r07_determinism.py", ["tests/test_claim_rules_r07.py",
                                                                  "tests/test_determinism.py"]),
    "r04_launch": ("stages/claim_rules/r04_launch.py", ["tests/test_claim_rules_r04.py", "tests/test_launch_checks.py"]),
    "r02_inspect": ("stages/claim_rules/r02_inspect.py", ["tests/test_claim_rules_r02.py"]),
    "r03_sglang": ("stages/claim_rules/r03_sglang.py", ["tests/test_claim_rules_r03.py"]),
    "r05_corruption": ("stages/claim_rules/r05_corruption.py", ["tests/test_claim_rules_r05.py"]),
    # the deciding functions by hand (test_sandbox_classify.py), then every hostile program; the 164
    # canonical HumanEval solutions (PASS only, 9 s a run) left out
    "sandbox": ("codeeval/sandbox.py", ["tests/test_sandbox_classify.py", "tests/test_sandbox.py", "-k",
                                        "not test_canonical_humaneval_solutions_pass_in_sandbox"]),
}
#: named by issue 37 and not run by this benchmark yet: name -> module (README says why)
NOT_RUN = {
    "core/params.py, all but Params.digest": "params loading and validation: not among the modules the issue names",
    "core/runner.py, all but _previous_manifest": "the notebook runner: its tests start Jupyter kernels",
}
#: why a module is mutated only in :data:`ONLY`'s functions (the report's "Functions not mutated")
ONLY_WHY = {
    "core/params.py": "what the issue names in it (the params digest)",
    "core/runner.py": "what the issue names in it (the resume check)",
    "codeeval/sandbox.py": ("the functions that turn a run's end into an outcome and undo a failed start; the "
                            "process handling (_spawn, _pump, _read_until_done, _watch, _teardown) is not mutated: "
                            "each of its ~420 mutants reruns the hostile programs of tests/test_sandbox.py (over an "
                            "hour on this shared machine; a first try was stopped), which test it by running them"),
}
KILLED = {"killed", "timeout", "segfault", "caught by type check"}
#: tests added in issue 37 for the survivors of the first runs (test -> the mutants it kills)
ADDED_TESTS = {
    "tests/test_patch_journal.py (new file)": "recover() and write_all(): a tampered, truncated or missing pending "
        "file, the journal's steps in order and its format and mode, the roll-back, the messages (188 mutants; 35 "
        "survived the file's first version)",
    "tests/test_sandbox.py::test_bwrap_command_line_inside": "bwrap_args: hostname, uid/gid, capabilities, the "
        "system links, the loader cache, the /tmp size and the environment as the program sees them",
    "tests/test_sandbox.py::test_rlimits_by_hand, test_sandbox_status_*, test_sandbox_unavailable_message_*":
        "rlimits' values and the status dict and refusal message of both modes",
    "tests/test_roundtrip.py::test_roundtrip_values_by_hand, test_within_bound_is_ratio_at_most_one, "
    "test_roundtrip_flags_a_tensor_outside_the_bound, test_roundtrip_skips_a_module_that_is_not_quantized, "
    "test_roundtrip_rows_name_*, test_roundtrip_of_no_expert_*, test_sample_experts, test_load_tensors_*":
        "the table's ratio (it was `err * bound` unnoticed), rel_error, shapes, within_bound at ratio 1 and 1.5, "
        "the skipped module, the columns, the sampling of 1-3 experts, the messages",
    "tests/test_mtp.py::test_depth_row_in_full, test_deciding_by_hand": "every field of the mtp.k* rows (98 "
        "survivors of r06_mtp)",
    "tests/test_mtp.py::test_estimator_rows_in_full, test_broken_draft_*, test_session_delta_by_hand, "
    "test_log_summary_by_hand, test_fmt2_and_round4": "acceptance.py (162 survivors, 73 of them in functions no "
        "test called)",
    "tests/test_decode_log.py::test_study_lines_*, test_estimator_row_by_hand, test_parse_edges": "decode_log.py's "
        "window edges, trailing comma, missing fields, the per-launch logs",
    "tests/test_params.py::test_digest_by_hand, tests/test_runner.py::test_previous_manifest_*": "the params digest "
        "and the resume check",
    "tests/test_scale_values.py::test_copied_*, test_bad_values_*": "check_scale_values' copy thresholds (4 experts "
        "and half the layer), the across-layer rule, the messages and the tensor list cap (24 survivors)",
    # the second run (detect, clamp numerics, check_scales, sandbox, claim rules r01 / r07 / r04)
    "tests/test_detect_fields.py (new file)": "every Detection field of detect_code / detect_completion / "
        "detect_bytes, the size bound's edges (1,000,000 bytes exactly and one more), prompt, entry point and "
        "decoding findings passed on each input path, what counts as a body, the CLI's exit status, output and "
        "options (141 of the first 314 detect.py mutants had survived)",
    "tests/test_clamp_numerics.py::test_compare_small_grid_by_hand, test_compare_relative_gap_counts_small_outputs, "
    "test_compare_defaults_*, test_grid_spans_*, test_formula_sources_*": "compare()'s every column on 9 x 9 and "
        "7 x 7 grids against a loop over the points, its defaults, outputs below 1 in size, formula_sources",
    "tests/test_check_scales.py (new file)": "check_scales on tiny checkpoints: the summary, the gate/up rows and "
        "summary, each finding's severity, message, tensors and layers (F01 missing / non-finite, W4A16 input "
        "scales, weight scales, mismatch within and past allclose, copied scales, layout); it found that a "
        "mismatch with no finite error raised TypeError (fixed)",
    "tests/test_sandbox_classify.py (new file)": "the sandbox's outcome rules by hand (_classify, _death, "
        "_signal_of, _code_line), a start that fails leaves no pipe, folder or cgroup, check_many's two paths",
    "tests/test_claim_rules_r01.py, test_claim_rules_r04.py, test_claim_rules_r07.py (new files)": "stages 01, 04 "
        "and 07's rules row by row, every field, each verdict's edges on both sides, each refusal word for word "
        "(r04's card rows, its CPU launch finding and clamp-log rule had no direct test)",
    "tests/test_claim_rules_r06.py (new file)": "r06's best-depth row in full with two estimators and two depths, the "
        "speed-only off row, k3 reading depth 3 (its rule bodies, decorated, were never mutated before)",
    "tests/test_params_digest.py::test_refusal_message_in_full, test_a_key_on_one_side_only_is_a_change": "the "
        "resume check's refusal word for word and a result key on one side only (the resume module now runs with "
        "tests/test_params_digest.py too)",
    # the third run (the claim rules of 02, 03 and 05; r06's CPU-engine and trained findings)
    "tests/test_claim_rules_r02.py, test_claim_rules_r03.py, test_claim_rules_r05.py (new files)": "stages 02, 03 "
        "and 05's rules on hand-made audit reports, SGLang audit rows and checks, validation summaries, served rows "
        "and trained arms, row by row: every field, each verdict's edges on both sides (the disk size's GB / GiB "
        "rounding, the routing limit, the gap tolerances, the Wilson intervals' separation, the null control's "
        "logprob tolerance), each refusal word for word (a second pass killed r02's real-size input-scale count, "
        "its MTP layer without F32 tensors, the not-run clamp lists' shared list, r03's list of failing limits)",
    "tests/test_claim_rules_r06.py::test_known_acceptance_*, test_broken_draft_signature_*, test_cpu_estimators_rows, "
    "test_trained_acceptance_*, test_bandwidth_ceiling_*, test_broken_draft_passes_*": "r06's CPU-engine and "
        "trained findings and mtp.broken-draft's wrapper (skipped before: no fast test called them): the first four "
        "mismatches listed, the 1.00 / 0.00 print edges, the strict fall of the accept rate, the ceiling at 1",
}


def _functions(tree) -> list:
    """(qualified name, node) of the module's functions and its classes' methods."""
    import ast

    out = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            out.append((node.name, node))
        elif isinstance(node, ast.ClassDef):
            out += [(f"{node.name}.{m.name}", m) for m in node.body if isinstance(m, ast.FunctionDef)]
    return out


def _skip_patterns(path: Path, functions: dict[str, str], only: tuple[str, ...] = ()) -> list[str]:
    """mutmut's ``do_not_mutate_patterns`` (regexes matched against each source line; a matching
    line is not mutated) for every line of the ``functions`` in ``path`` (or, with ``only``, of
    every function but those): each line exactly, anchored. A line that also occurs outside those
    functions is left out (it would stop mutation there too); its mutants then run like any other."""
    import ast
    import re

    lines = path.read_text().splitlines()
    inside: set[int] = set()
    for name, node in _functions(ast.parse("\n".join(lines))):
        if name in functions or (only and name not in only):
            inside |= set(range(node.lineno - 1, node.end_lineno))
    outside = {lines[i] for i in range(len(lines)) if i not in inside}
    return sorted({"^" + re.escape(lines[i]) + "$" for i in inside if lines[i].strip() and lines[i] not in outside})


def undecorate(src: str) -> str:
    """``src`` with each decorated function (module level or in a class; ``@staticmethod`` /
    ``@classmethod`` alone kept) written without decorator syntax: the ``@`` lines removed and
    ``name = (deco_1)((deco_2)(name))`` put after the function, which is what the ``@`` form means.
    mutmut 3 does not mutate a decorated function (file_mutation.py: its decorators run at
    definition time), and the claim rules (``@claim_rule`` / ``@finding_rule``) and properties are
    what decides verdicts; so their bodies are mutated in this form, with the same behaviour. A
    ``functools`` cache stays decorated (unmutated, as mutmut leaves it): its result, cached before
    mutmut forks a mutant's run, would keep the mutant from ever being called."""
    import ast

    lines = src.splitlines(keepends=True)
    tree = ast.parse(src)
    nodes = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    nodes += [m for c in tree.body if isinstance(c, ast.ClassDef) for m in c.body if isinstance(m, ast.FunctionDef)]
    plain = {"staticmethod", "classmethod"}
    for node in sorted(nodes, key=lambda n: n.lineno, reverse=True):  # bottom up: earlier lines keep their numbers
        decos = node.decorator_list
        if not decos or (len(decos) == 1 and isinstance(decos[0], ast.Name) and decos[0].id in plain):
            continue
        if any("cache" in ast.get_source_segment(src, d) for d in decos):
            continue  # a functools cache warmed before mutmut forks would hide the mutant: left decorated
        indent = " " * node.col_offset
        applied = node.name
        for deco in reversed(decos):  # the last decorator is applied first
            applied = f"({ast.get_source_segment(src, deco)})({applied})"
        end = node.end_lineno
        lines[end:end] = [f"{indent}{node.name} = {applied}\n"]
        del lines[decos[0].lineno - 1:node.lineno - 1]
    return "".join(lines)


def _scratch(name: str, module: str, tests: list[str]) -> Path:
    """The scratch project of one module (module docstring); a fresh ``mutants/`` every run."""
    d = SCRATCH / name
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    shutil.copytree(REPO / "lib", d / "src", ignore=shutil.ignore_patterns("__pycache__"))
    target = d / "src" / "nvfp4study" / module
    target.write_text(undecorate(target.read_text()))
    (d / "tests").symlink_to(REPO / "tests")
    (d / "params").symlink_to(REPO / "params")
    sel = ", ".join(json.dumps(t) for t in tests)
    skip = ", ".join(json.dumps(p) for p in _skip_patterns(REPO / "lib" / "nvfp4study" / module,
                                                           SKIP.get(module, {}), ONLY.get(module, ())))
    (d / "pyproject.toml").write_text(
        "[tool.mutmut]\n"
        'source_paths = ["src"]\n'
        f'only_mutate = ["src/nvfp4study/{module}"]\n'
        f"pytest_add_cli_args_test_selection = [{sel}]\n"
        'pytest_add_cli_args = ["-p", "no:cacheprovider", "-q", "-W", "ignore"]\n'
        'also_copy = ["params"]\n'
        f"do_not_mutate_patterns = [{skip}]\n")
    return d


def _results(d: Path, module: str) -> dict[str, str]:
    """mutant name -> status, from the ``.meta`` file mutmut writes beside the mutated module."""
    from mutmut.stats import status_by_exit_code

    meta = json.loads((d / "mutants" / "src" / "nvfp4study" / (module + ".meta")).read_text())
    return {k: status_by_exit_code[v] for k, v in meta["exit_code_by_key"].items()}


def _diff(d: Path, mutant: str) -> str:
    """The mutant's changed lines (``mutmut show``), ``-``/``+`` lines only."""
    out = subprocess.run([*MUTMUT, "show", mutant], cwd=d, capture_output=True, text=True,
                         timeout=120).stdout
    return " / ".join(line.strip() for line in out.splitlines()
                      if line[:1] in "+-" and not line.startswith(("+++", "---")))


def run_module(name: str, recheck: dict | None = None) -> dict:
    """Run mutmut over one module; returns its counts, survivors (name, diff, reason) and seconds.

    ``recheck``: the module's last result, whose scratch project is still there: only its
    unexplained survivors are run again (mutmut collects the tests added since and keeps every
    other mutant's result), and the seconds are added to the last run's."""
    module, tests = MODULES[name]
    names: list[str] = []
    if recheck is None:
        d = _scratch(name, module, tests)
    else:
        d = SCRATCH / name
        if recheck.get("tests") != tests or not (d / "mutants").is_dir():
            raise RuntimeError(f"{name}: no scratch project of the same test selection to recheck; run it in full")
        names = [s["mutant"] for s in recheck["survivors"] if s["mutant"] not in EQUIVALENT]
        if not names:
            return recheck
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # mutmut puts mutants/src first
    t0 = time.monotonic()
    r = subprocess.run(["nice", "-n", "10", *MUTMUT, "run", "--max-children", "2", *names], cwd=d,
                       env=env, capture_output=True, text=True)
    secs = time.monotonic() - t0 + (recheck["seconds"] if recheck else 0.0)
    if r.returncode != 0:
        tail = r.stdout.replace("\r", "\n").splitlines()[-15:] + r.stderr.splitlines()[-15:]
        raise RuntimeError(f"mutmut failed on {module} (exit {r.returncode}):\n" + "\n".join(tail))
    status = _results(d, module)
    survivors = []
    for mutant, st in sorted(status.items()):
        if st in KILLED:
            continue
        survivors.append({"mutant": mutant, "status": st, "diff": _diff(d, mutant),
                          "reason": EQUIVALENT.get(mutant, "UNEXPLAINED")})
    return {"module": module, "tests": tests, "seconds": round(secs, 1), "mutants": len(status),
            "killed": sum(st in KILLED for st in status.values()),
            "equivalent": sum(s["mutant"] in EQUIVALENT for s in survivors),
            "survived": sum(s["mutant"] not in EQUIVALENT for s in survivors), "survivors": survivors}


def _explain(r: dict) -> dict:
    """A module's result with the survivors' reasons and counts from :data:`EQUIVALENT` as it is
    now (a result kept from an earlier run gets the reasons added since)."""
    survivors = [{**s, "reason": EQUIVALENT.get(s["mutant"], "UNEXPLAINED")} for s in r["survivors"]]
    equiv = sum(s["mutant"] in EQUIVALENT for s in survivors)
    return {**r, "survivors": survivors, "equivalent": equiv, "survived": len(survivors) - equiv}


def write_report(results: dict[str, dict], total_s: float, failed: dict[str, str] | None = None,
                 time_note: str = "one run") -> str:
    """REPORT.md: the machine and time, the per-module table, every survivor with its reason."""
    killed = sum(r["killed"] for r in results.values())
    equiv = sum(r["equivalent"] for r in results.values())
    total = sum(r["mutants"] for r in results.values())
    score = killed / (total - equiv) if total > equiv else 0.0
    lines = ["# Mutation benchmark report", "",
             "Generated by `make mutation` (`benchmarks/mutation/run.py`, mutmut "
             f"{_mutmut_version()}); do not edit by hand.", "",
             f"- machine: {os.cpu_count()} cores, {platform.python_implementation()} {platform.python_version()}, "
             "shared with other work, mutmut under `nice -n 10` with 2 workers",
             f"- time: {total_s / 60:.1f} min for {len(results)} modules ({time_note})",
             f"- mutants: {total}; killed {killed}; equivalent {equiv}; survived (not equivalent) "
             f"{total - killed - equiv}",
             f"- score: {score:.1%} of the non-equivalent mutants killed", "",
             "| module | tests | mutants | killed | equivalent | survived | seconds |",
             "|---|---|---|---|---|---|---|"]
    for r in results.values():
        lines.append(f"| `{r['module']}` | {', '.join(f'`{t}`' for t in r['tests'])} | {r['mutants']} | "
                     f"{r['killed']} | {r['equivalent']} | {r['survived']} | {r['seconds']} |")
    lines += ["", "## Functions not mutated", ""]
    lines += [f"- `{m}` `{f}`: {why}" for m, fs in SKIP.items() for f, why in fs.items()
              if any(r["module"] == m for r in results.values())]
    lines += [f"- `{m}`: only {', '.join(f'`{f}`' for f in fs)} mutated: {ONLY_WHY[m]}" for m, fs in ONLY.items()
              if any(r["module"] == m for r in results.values())]
    lines += ["", "## Not run", ""]
    lines += [f"- `{m}`: {why}" for m, why in NOT_RUN.items()]
    lines += [f"- `{MODULES[n][0]}`: this run failed ({why})" for n, why in (failed or {}).items()]
    lines += ["", "## Tests added for the survivors of earlier runs", ""]
    lines += [f"- `{t}`: {what}" for t, what in ADDED_TESTS.items()]
    lines += ["", "## Survivors", "", "Every mutant no test killed, with its reason (an equivalent mutant, "
              "or UNEXPLAINED: a missing test).", ""]
    for r in results.values():
        for s in r["survivors"]:
            lines.append(f"- `{s['mutant']}` ({s['status']}): `{s['diff'][:220]}`; {s['reason']}")
    text = "\n".join(lines) + "\n"
    REPORT.write_text(text)
    return text


def _mutmut_version() -> str:
    from importlib.metadata import version

    return version("mutmut")


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark over :data:`MODULES` (or ``--only`` names) and write the report; exit 1
    when a survivor has no reason."""
    ap = argparse.ArgumentParser(prog="benchmarks/mutation/run.py",
                                 description="mutmut over the verdict- and safety-carrying modules")
    ap.add_argument("--only", nargs="*", choices=sorted(MODULES), help="run these modules only")
    ap.add_argument("--report", action="store_true", help="only rewrite the report from the last results")
    ap.add_argument("--recheck", action="store_true",
                    help="with --only: run again only the last run's unexplained survivors (after adding tests)")
    args = ap.parse_args(argv)
    cache = SCRATCH / "results.json"
    results = json.loads(cache.read_text()) if cache.is_file() and (args.only or args.report) else {}
    if args.report:
        args.only = []
    t0 = time.monotonic()
    failed: dict[str, str] = {}
    for name in MODULES if args.only is None else args.only:
        print(f"== {name}: {MODULES[name][0]}", flush=True)
        try:
            results[name] = run_module(name, results.get(name) if args.recheck else None)
        except RuntimeError as exc:  # e.g. a test failing on the released code: the others still run
            print(exc, flush=True)
            failed[name] = str(exc).splitlines()[0]
            continue
        r = results[name]
        print(f"   {r['mutants']} mutants, {r['killed']} killed, {r['equivalent']} equivalent, "
              f"{r['survived']} survived, {r['seconds']} s", flush=True)
        kept = json.loads(cache.read_text()) if cache.is_file() else {}  # another --only run may have written
        cache.write_text(json.dumps({**kept, name: r}, indent=1))
    partial = args.only is not None
    if partial and cache.is_file():  # with the modules other --only runs wrote meanwhile
        results = {**json.loads(cache.read_text()), **{n: results[n] for n in args.only if n in results}}
    total_s = sum(r["seconds"] for r in results.values()) if partial else time.monotonic() - t0
    results = {n: _explain(results[n]) for n in MODULES if n in results}
    write_report(results, total_s, failed,
                 "the sum of each module's latest run" if partial else "one run of them all")
    unexplained = [s["mutant"] for r in results.values() for s in r["survivors"] if s["reason"] == "UNEXPLAINED"]
    print(f"report: {REPORT.relative_to(REPO)}; unexplained survivors: {len(unexplained)}")
    return 1 if unexplained or failed else 0


if __name__ == "__main__":
    sys.exit(main())

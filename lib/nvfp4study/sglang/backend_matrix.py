"""The answer a Ling user needs: per SGLang release, checkpoint format x device class, which
``--moe-runner-backend`` values reach a MoE path, what ``auto`` picks, and each path's clamp verdict.

Rows (:data:`FORMATS`) are checkpoint formats; each is mapped to the MoE method class SGLang
builds for a routed-expert layer on a device:

- compressed-tensors formats by *running* the tree's ``CompressedTensorsConfig.get_moe_scheme``
  on the format's ``config_groups`` entry with the device's compute capability
  (:func:`nvfp4study.sglang.checks.moe_scheme_for`; 0.5.23 ``compressed_tensors.py`` 864-1004:
  W4A4 NVFP4 below capability 100 is served weight-only by ``CompressedTensorsW4A16Nvfp4MoE``, 962-975);
- the others by the class their config's ``get_quant_method`` constructs (named in the format,
  located in the tree with its line; the ``--quantization`` name must be registered on the
  device's platform, read from the guards around the registry entry, ``quantization/__init__.py``);
- BF16 by ``UnquantizedFusedMoEMethod``, which ``FusedMoE.__init__`` builds without a config.

Columns are :data:`~nvfp4study.sglang.auto_backend.DEVICES`. A cell takes the audit's rows
(:func:`nvfp4study.sglang.audit.audit_tree`) of that method, ``Method/<backend>``, whose platform
(``PathResult.platform``) includes the device's: each such backend is a ``--moe-runner-backend``
value the method names or tests, resolved as SGLang resolves it (:func:`resolve`: an explicit
``flashinfer_cutlass`` on ``Fp8MoEMethod`` runs Triton, ``fp8.py`` 2974-2984 in 0.5.23), with the
verdict of the row it reaches; a value the server refuses for this ``--quantization`` at start is
marked (``handle_moe_kernel_config``'s asserts, :func:`~nvfp4study.sglang.auto_server.server_refusals`).
The audit does not split CUDA by capability: a CUDA path is listed on every CUDA column, and the
capability shows only in the method chosen, a raise at load, and what a value resolves to.
``auto`` is resolved the same way (model override, server arguments, the method); its verdict is
that of the audit row it lands on. Anything not decided is UNDECIDED with the place.

Not covered: a non-default ``--moe-a2a-backend`` (DeepEP, MegaMoE, ... change both the choice
and the path), environment variables set away from their defaults, and a checkpoint mixing
formats (the mixed FP8/MXFP4 override of BailingMoeV3 is read, but no row is such a checkpoint).
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from ..core.errors import SGLangSourceError
from . import auto_backend as ab
from . import auto_server as asv
from . import path_keys
from .audit import PathResult, catalog
from .checks import NVFP4_ACTS, NVFP4_WEIGHTS, moe_scheme_for
from .code_index import SRT, CodeIndex, funcs, walk
from .quant_methods import FUSED_MOE_LAYER, QUANT_REGISTRY, quant_configs
from .source import SGLangTree

UNDECIDED = "UNDECIDED"


@dataclass(frozen=True)
class Format:
    """A checkpoint format (a matrix row). ``ct_group``: the compressed-tensors ``(weights,
    input_activations)`` entry; else ``method``: the MoE class the ``quantization`` config builds
    (``None`` quantization: BF16), or several names: the first the release builds (a class renamed,
    or a scheme's kernel class). ``facts``: what the format fixes in the method's tests
    (``{"self.block_quant": True}``)."""

    key: str
    label: str
    quantization: str | None
    ct_group: tuple[dict, dict | None] | None = None
    method: str | tuple[str, ...] | None = None
    facts: dict = field(default_factory=dict)


#: The rows, the card's format first. ``gptq``/``awq`` checkpoints are served as ``gptq_marlin`` /
#: ``awq_marlin`` on CUDA (SGLang converts them where Marlin runs).
FORMATS = (
    Format("ct-nvfp4-w4a4", "compressed-tensors NVFP4 W4A4 (the card's)", "compressed-tensors",
           ct_group=(NVFP4_WEIGHTS, NVFP4_ACTS)),
    Format("ct-nvfp4-w4a16", "compressed-tensors NVFP4 W4A16", "compressed-tensors", ct_group=(NVFP4_WEIGHTS, None)),
    Format("modelopt-nvfp4", "ModelOpt NVFP4", "modelopt_fp4", method="ModelOptNvFp4FusedMoEMethod"),
    Format("fp8-block", "FP8 block 128x128", "fp8", method="Fp8MoEMethod", facts={"self.block_quant": True}),
    Format("fp8-tensor", "FP8 per-tensor", "fp8", method="Fp8MoEMethod", facts={"self.block_quant": False}),
    Format("w8a8-int8", "W8A8 INT8", "w8a8_int8", method="W8A8Int8MoEMethod"),
    Format("mxfp4", "MXFP4", "mxfp4", method="Mxfp4MoEMethod"),
    # 0.5.23 builds them as schemes whose kernels the audit names (gptq/schemes/gptq_moe.py 456,
    # awq/schemes/awq_moe.py 399); earlier releases as the config's method class
    Format("gptq-int4", "GPTQ INT4 (gptq_marlin)", "gptq_marlin", method=("GPTQMarlinMoEKernel", "GPTQMarlinMoEMethod")),
    Format("awq-int4", "AWQ INT4 (awq_marlin)", "awq_marlin", method=("AWQMoEKernel", "AWQMarlinMoEMethod", "AWQMoEMethod")),
    Format("bf16", "BF16 (unquantized)", None, method="UnquantizedFusedMoEMethod"),
)
#: the card's format, whose ``auto`` the matrix must name on SM100 and SM120
CARD_FORMAT = "ct-nvfp4-w4a4"


def path_key(row: PathResult) -> str:
    """The derived key (``Method/backend``) of an audit row: a catalogued row's ``via``."""
    if row.catalogued:
        via = {e["id"]: e.get("via") for e in catalog()["paths"]}.get(row.path)
        return via or row.path
    return row.path


def _configs(code: CodeIndex) -> list[tuple[str, str | None, str, int]]:
    """:func:`~nvfp4study.sglang.quant_methods.quant_configs`, read once per index."""
    memo = code.__dict__.setdefault("_matrix_memo", {})
    if "configs" not in memo:
        memo["configs"] = quant_configs(code)
    return memo["configs"]


def _names(fmt: Format) -> tuple[str, ...]:
    return (fmt.method,) if isinstance(fmt.method, str) else tuple(fmt.method or ())


def _from_trail(code: CodeIndex, fmt: Format, rows: list[PathResult]) -> tuple[str | None, str | None, str | None]:
    """``(class, file, where)`` of the first of ``fmt``'s classes that an audit row reached from
    its ``--quantization`` entry (the row's ``found_by`` trail names the config and the class)."""
    for name in _names(fmt):
        for r in rows:
            if path_keys.method(path_key(r)) == name and r.found_by and f"'{fmt.quantization}' ->" in r.found_by[0]:
                hit = code.resolve(QUANT_REGISTRY, name) or _class_file(code, name)
                return name, hit[0] if hit else None, r.found_by[0].split(" -> ")[-1]
    return None, None, None


def _class_file(code: CodeIndex, name: str) -> tuple[str, ast.AST] | None:
    from .code_index import class_defined

    memo = code.__dict__.setdefault("_matrix_memo", {}).setdefault("class", {})
    if name not in memo:
        memo[name] = class_defined(code.root, name)
    where = memo[name]
    if where is None:
        return None
    rel = where.split(":")[0]
    rel = rel if rel.startswith("sglang/") else SRT + rel
    node = code.top(rel, name)
    return (rel, node) if node is not None else None


def _locate_method(code: CodeIndex, fmt: Format, name: str) -> tuple[str | None, str | None, str | None]:
    """``(file, "file:line", why not)`` of where class ``name`` is constructed by ``fmt``'s
    config's methods (``FusedMoE.__init__`` for BF16)."""
    if fmt.quantization is None:
        places = [(FUSED_MOE_LAYER, code.top(FUSED_MOE_LAYER, "FusedMoE"))]
    else:
        hits = [(rel, code.top(rel, cname)) for q, rel, cname, _ in _configs(code) if q == fmt.quantization and rel]
        if not hits:
            return None, None, f"no --quantization {fmt.quantization!r} in {QUANT_REGISTRY[len(SRT):]}"
        places = hits
    for rel, cls in places:
        for fn in funcs(cls) if isinstance(cls, ast.ClassDef) else []:
            for c in walk(fn):
                if isinstance(c, ast.Call) and ast.unparse(c.func).split(".")[-1] == name:
                    hit = code.resolve(rel, name)
                    return (hit[0] if hit else None), f"{rel[len(SRT):]}:{c.lineno}", None
    return None, None, f"the {fmt.quantization or 'FusedMoE'} config builds no {name} in this release"


def registered_on(code: CodeIndex, quantization: str | None, dev: ab.Device) -> str | None:
    """None when ``--quantization quantization`` is registered on device ``dev`` (or that is not
    decided), else why not: every registry entry of that name sits under a test decided against
    the device (``if is_cpu() or is_cuda() or _is_gfx95_supported ...``, ``quantization/__init__.py``
    93-101 in 0.5.23), or the CPU engine's ``CPU_QUANTIZATION_METHODS`` lacks it."""
    if quantization is None:
        return None
    mod = code.mod(QUANT_REGISTRY)
    cpu = _cpu_methods(mod)
    if dev.platform == "CPU" and cpu is not None and quantization not in cpu[0]:
        return (f"--quantization {quantization} is not in CPU_QUANTIZATION_METHODS "
                f"({QUANT_REGISTRY[len(SRT):]}:{cpu[1]}; get_quantization_config refuses it on an AMX CPU)")
    # the CPU engine's subset is no registration of its own (it only narrows the registry on CPU)
    cpu_lines = set(range(cpu[1], cpu[2] + 1)) if cpu else set()
    lines = [line for q, _, _, line in _configs(code) if q == quantization and line not in cpu_lines]
    facts = ab.Facts(code, dev)
    for node in walk(mod) if mod else ():
        if isinstance(node, ast.Constant) and node.value == quantization and getattr(node, "lineno", 0) in lines:
            if ab.runs(mod, node, facts, QUANT_REGISTRY)[0] is not False:
                return None
    return (f"--quantization {quantization} is not registered on {dev.key} "
            f"({QUANT_REGISTRY[len(SRT):]}:{','.join(map(str, lines)) or '-'})")


def _cpu_methods(mod: ast.Module | None) -> tuple[set[str], int, int] | None:
    """The keys of ``CPU_QUANTIZATION_METHODS`` (``quantization/__init__.py`` 148-156 in 0.5.23)
    and the first and last line of its assignment."""
    for st in mod.body if mod else []:
        if isinstance(st, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "CPU_QUANTIZATION_METHODS"
                                              for t in st.targets) and isinstance(st.value, ast.Dict):
            return {k.value for k in st.value.keys if isinstance(k, ast.Constant)}, st.lineno, st.end_lineno or st.lineno
    return None


def method_on(tree: SGLangTree, code: CodeIndex, fmt: Format, dev: ab.Device,
              rows: list[PathResult] = ()) -> dict[str, Any]:
    """``{"method", "file", "where", "error"}``: the MoE class ``fmt`` gets on ``dev`` (or the
    error that stops it: a raise in the scheme choice, an unregistered quantization, UNDECIDED);
    ``rows`` (the audit's) give the class where a scheme builds it (:func:`_from_trail`)."""
    why = registered_on(code, fmt.quantization, dev)
    if why:
        return {"method": None, "file": None, "where": None, "error": why}
    if fmt.ct_group is not None:
        flags = {"_is_hip": dev.platform == "ROCm", "_is_npu": dev.platform == "NPU", "_is_xpu": dev.platform == "XPU"}
        got = moe_scheme_for(tree, fmt.ct_group[0], fmt.ct_group[1], capability=dev.capability, flags=flags)
        if "capability unknown" in got.get("error", ""):
            return {"method": None, "file": None, "where": got.get("file"),
                    "error": f"{UNDECIDED}: get_moe_scheme asks the GPU's compute capability; none on {dev.key}"}
        if "error" in got and "scheme" not in got:
            return {"method": None, "file": None, "where": f"{got.get('file')}:{got.get('line')}", "error": got["error"]}
        hit = code.resolve(SRT + "layers/quantization/compressed_tensors/compressed_tensors.py", got["scheme"])
        return {"method": got["scheme"], "file": hit[0] if hit else None,
                "where": "compressed_tensors.get_moe_scheme (replayed)", "error": got.get("error")}
    audited = {path_keys.method(path_key(r)) for r in rows} - {None}
    first_why = None
    for name in _names(fmt):  # the first class the audit has rows of, else the first built
        rel, where, why = _locate_method(code, fmt, name)
        if rel and (name in audited or not audited & set(_names(fmt))):
            return {"method": name, "file": rel, "where": where, "error": None}
        first_why = first_why or why
    name, rel, where = _from_trail(code, fmt, list(rows))
    if name:
        return {"method": name, "file": rel, "where": where, "error": None}
    return {"method": None, "file": None, "where": None, "error": first_why}


def resolve(code: CodeIndex, fmt: Format, dev: ab.Device, method: str | None, file: str | None,
            value: str = "auto") -> ab.AutoChoice:
    """The backend ``--moe-runner-backend value`` ends with for ``fmt`` on ``dev``: BailingMoeV3's
    model override, then the server arguments, then the method (:mod:`~nvfp4study.sglang.auto_backend`);
    an explicit value the method hands to ``MoeRunner`` unchanged stays itself (:mod:`~nvfp4study.sglang.auto_server`
    for the first two)."""
    for reader in (asv.model_auto, asv.server_auto):
        got = reader(code, fmt.quantization, ab.Facts(code, dev, backend=value, extra=fmt.facts))
        if got is not None:
            return got
    cls = code.top(file, method) if file and method else None
    if not isinstance(cls, ast.ClassDef):
        return ab.AutoChoice(None, undecided="no MoE method here")
    got = ab.method_auto(code, file, cls, ab.Facts(code, dev, backend=value, extra=fmt.facts,
                                                  quantization=fmt.quantization))
    if got.passthrough and value != "auto":
        return ab.AutoChoice(value, got.where, "method", trail=[f"{method} hands {value!r} to MoeRunner at {got.where}"])
    return got


#: the other parameters' verdicts per audit path: ``{parameter: {path id: verdict}}`` (``audit-sglang --param``)
ParamVerdicts = Mapping[str, Mapping[str, str]]


def _params_of(row: PathResult | None, pv: ParamVerdicts) -> dict[str, str]:
    """Each other parameter's verdict on the audit path ``row`` (the clamp's row), UNDECIDED where
    the parameter audit has no row of it; ``{}`` without a row or without parameter rows."""
    return {n: by.get(row.path, UNDECIDED) for n, by in pv.items()} if row is not None else {}


def _reached(mine: list[tuple[str, PathResult]], method: str, got: ab.AutoChoice, dev: ab.Device,
             pv: ParamVerdicts) -> dict[str, Any]:
    """``{"path", "verdict", "undecided", "params"}`` of the audit row ``got``'s backend lands on (on
    ``dev``); ``params``: :func:`_params_of` that row."""
    path = f"{method}/{got.backend}" if got.backend else None
    row = next((r for k, r in mine if k == path and dev.platform in r.platform.split("|")), None) if path else None
    undecided = got.undecided or (None if row is not None else f"no audit row {path} on {dev.platform}" if path else None)
    return {"path": path, "verdict": row.verdict.value if row is not None else UNDECIDED, "undecided": undecided,
            "params": _params_of(row, pv)}


def build_cell(tree: SGLangTree, code: CodeIndex, rows: list[PathResult], fmt: Format, dev: ab.Device,
               refusals: dict, pv: ParamVerdicts | None = None) -> dict[str, Any]:
    """One cell: the method; for each backend value the method names or tests (its audit rows that
    run on ``dev``; ``direct``/``native``: any value) the path it reaches, its verdict, and whether
    the server refuses it for this quantization; and ``auto`` (backend, path, verdict, where, stage,
    undecided); each path's other parameters' verdicts from ``pv`` (``params``, :func:`_params_of`)."""
    pv = pv or {}
    m = method_on(tree, code, fmt, dev, rows)
    cell: dict[str, Any] = {"format": fmt.key, "device": dev.key, "quantization": fmt.quantization, **m,
                            "backends": [], "auto": None}
    if m["method"] is None:
        return cell
    cls = code.top(m["file"], m["method"]) if m["file"] else None
    raises = ab.init_raises(code, m["file"], cls, ab.Facts(code, dev, extra=fmt.facts)) \
        if isinstance(cls, ast.ClassDef) else None
    if raises:
        cell["error"] = f"raises at load: {raises}"
    mine = [(path_key(r), r) for r in rows if path_keys.method(path_key(r)) == m["method"]]
    seen: set[str] = set()
    for key, r in mine:
        backend = path_keys.runner(key)
        if dev.platform not in r.platform.split("|") or backend in seen:
            continue
        seen.add(backend)
        if backend in ("direct", "native"):
            cell["backends"].append({"value": f"any ({backend})", "path": key, "verdict": r.verdict.value,
                                     "refused": None, "where": None, "undecided": None, "params": _params_of(r, pv)})
            continue
        allowed = refusals.get(backend)
        got = resolve(code, fmt, dev, m["method"], m["file"], backend)
        reached = _reached(mine, m["method"], got, dev, pv)
        if got.backend is None:  # the method's choice is not decided here: the audit's path of that name
            reached.update(path=key, verdict=r.verdict.value, params=_params_of(r, pv))
        cell["backends"].append({"value": backend, **reached, "where": got.where,
                                 "refused": allowed[1] if allowed and fmt.quantization not in allowed[0] else None})
    a = resolve(code, fmt, dev, m["method"], m["file"])
    cell["auto"] = {"backend": a.backend, **_reached(mine, m["method"], a, dev, pv), "where": a.where, "stage": a.stage,
                    "trail": a.trail}
    return cell


def build_matrix(tree: SGLangTree, rows: list[PathResult],
                 params: Mapping[str, list[dict[str, Any]]] | None = None) -> dict[str, Any]:
    """The matrix of one release: ``{"sglang_version", "devices", "formats", "cells"}`` (one cell
    per format x device, :func:`build_cell`), from ``rows`` = ``audit_tree(tree)``; ``params``: the
    other parameters' rows (``{name: [ParamResult.as_json(), ...]}``, any releases: this one's are
    used), so that each reached path also carries each parameter's verdict.

    Raises:
        SGLangSourceError: ``rows`` are not of ``tree``'s release.
    """
    other = {r.sglang_version for r in rows} - {tree.version}
    if other:
        raise SGLangSourceError(f"audit rows of {sorted(other)} given for the tree of SGLang {tree.version}")
    code = CodeIndex(tree.root)
    refusals = asv.server_refusals(code)
    pv = {n: {r["path"]: r["verdict"] for r in rs if r.get("sglang_version") == tree.version}
          for n, rs in (params or {}).items()}
    cells = [build_cell(tree, code, rows, f, d, refusals, pv) for f in FORMATS for d in ab.DEVICES]
    return {"sglang_version": tree.version, "devices": [asdict(d) for d in ab.DEVICES],
            "formats": [{"key": f.key, "label": f.label, "quantization": f.quantization} for f in FORMATS],
            "cells": cells}


def cell(matrix: dict[str, Any], fmt: str, device: str) -> dict[str, Any]:
    """The cell of ``fmt`` x ``device`` (keys of :data:`FORMATS` / ``DEVICES``); KeyError names the valid ones."""
    for c in matrix["cells"]:
        if c["format"] == fmt and c["device"] == device:
            return c
    raise KeyError(f"no cell {fmt} x {device}; formats {[f.key for f in FORMATS]}, devices {[d.key for d in ab.DEVICES]}")


def auto_text(c: dict[str, Any]) -> str:
    """One cell in a few words: ``auto -> flashinfer_cutlass: APPROX``, ``raises at load (file:line)``,
    ``not served: why``, or ``UNDECIDED (the first place not decided)``."""
    a = c.get("auto") or {}
    if c["method"] is None:
        err = c.get("error") or ""
        return err if err.startswith(UNDECIDED) else f"not served: {err}"
    if (c.get("error") or "").startswith("raises at load"):
        return f"{c['method']} raises at load ({c['error'].split()[3]})"
    if c.get("error"):
        return f"{c['method']}: {c['error']}"
    if not a.get("backend"):
        return f"auto: {UNDECIDED} ({(a.get('undecided') or '').split('; ')[0]})"
    return f"auto -> {a['backend']}: {a['verdict']}{_params_text(a)}"


def _params_text(a: dict[str, Any]) -> str:
    """``, routed_scaling_factor DROPPED`` for each other parameter the audit decided on the path
    (UNDECIDED ones are left to the JSON)."""
    return "".join(f", {n} {v}" for n, v in (a.get("params") or {}).items() if v != UNDECIDED)


def card_answer(matrix: dict[str, Any]) -> str:
    """The sentence a Ling user needs: what ``auto`` picks for the card's format on SM100 and SM120."""
    parts = []
    for dev in ("SM100", "SM120"):
        c = cell(matrix, CARD_FORMAT, dev)
        a = c.get("auto") or {}
        if a.get("backend"):
            parts.append(f"on {dev} `{a['backend']}` ({a['path']}, decided at {a['where']}): "
                         f"clamp {a['verdict']}{_params_text(a)}")
        else:
            parts.append(f"on {dev} {UNDECIDED}: {a.get('undecided') or c.get('error')}")
    return (f"SGLang {matrix['sglang_version']}, Ling's checkpoint (compressed-tensors NVFP4 W4A4) with "
            f"`--moe-runner-backend auto`: " + "; ".join(parts) + ".")


def card_answer_short(matrix: dict[str, Any]) -> str:
    """:func:`card_answer` in one line: ``SGLang 0.5.23, Ling's checkpoint with auto: SM100
    `flashinfer_cutlass` (clamp APPROX), SM120 ... (decided at file:line)``."""
    parts, places = [], []
    for dev in ("SM100", "SM120"):
        a = cell(matrix, CARD_FORMAT, dev).get("auto") or {}
        parts.append(f"{dev} `{a['backend']}` (clamp {a['verdict']}{_params_text(a)})" if a.get("backend")
                     else f"{dev} {UNDECIDED}")
        if a.get("where") and a["where"] not in places:
            places.append(a["where"])
    where = f" (decided at `{'`, `'.join(p.rsplit('/', 1)[-1] for p in places)}`)" if places else ""
    return (f"SGLang {matrix['sglang_version']}, Ling's checkpoint (compressed-tensors NVFP4 W4A4) with "
            f"`--moe-runner-backend auto`: {', '.join(parts)}{where}.")


def summary_rows(matrix: dict[str, Any]) -> list[dict[str, str]]:
    """One row per format: ``{"format": label, <device>: auto_text}`` (the compact table)."""
    labels = {f["key"]: f["label"] for f in matrix["formats"]}
    out: dict[str, dict[str, str]] = {}
    for c in matrix["cells"]:
        out.setdefault(c["format"], {"format": labels[c["format"]]})[c["device"]] = auto_text(c)
    return list(out.values())


def _backend_text(b: dict[str, Any], method: str) -> str:
    """``flashinfer_cutlass APPROX`` / ``flashinfer_cutlass -> triton EXACT`` (+ refused at start);
    ``?`` after the verdict: which runner the method picks for the value was not decided (the
    verdict is the audit's path of that name)."""
    path = b.get("path") or ""
    reached = (path_keys.runner(path) if "/" in path else path) or UNDECIDED
    head = b["value"] if reached == b["value"] or b["value"].startswith("any") else f"{b['value']} -> {reached}"
    refused = f" (explicit value refused at start, {b['refused']})" if b.get("refused") else ""
    return f"{head} {b['verdict']}{'?' if b.get('undecided') else ''}{refused}"


def text_report(matrix: dict[str, Any], width: int = 110) -> str:
    """The whole matrix for a terminal: per format, per device the method, ``auto``'s choice with
    its deciding line, and every backend that reaches a MoE path there with its verdict."""
    import textwrap

    lines = [f"MoE backend matrix, SGLang {matrix['sglang_version']} (clamp verdicts for Ling: limit set, no alpha)",
             textwrap.fill(card_answer(matrix), width),
             textwrap.fill("backends: each --moe-runner-backend value the method names or tests, the path it "
                           "reaches (value -> backend where the method swaps it) and that path's verdict; '?': "
                           "the method's choice for the value is not decided from the source (the data file "
                           "says where), the verdict is the audit's path of that name.", width), ""]
    labels = {f["key"]: f["label"] for f in matrix["formats"]}
    for fmt in labels:
        lines.append(f"{labels[fmt]}")
        for c in (c for c in matrix["cells"] if c["format"] == fmt):
            a = c.get("auto") or {}
            head = f"  {c['device']:<7} {auto_text(c)}"
            if a.get("where"):
                head += f"  [{a.get('stage')}: {a['where']}]"
            lines.append(head)
            if c["method"]:
                lines.append(f"          method {c['method']} ({c['where']})")
            paths = ", ".join(_backend_text(b, c["method"]) for b in c["backends"])
            if paths:
                lines += textwrap.wrap("backends: " + paths, width, initial_indent="          ",
                                       subsequent_indent="            ")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


__all__ = ["CARD_FORMAT", "resolve", "auto_text", "card_answer", "card_answer_short", "summary_rows", "text_report", "FORMATS", "UNDECIDED", "Format", "build_cell", "build_matrix", "cell", "method_on",
           "path_key", "registered_on"]

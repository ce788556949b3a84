"""The format x device MoE backend matrix (``sglang.backend_matrix``, ``sglang.auto_backend``, ``sglang.auto_server``).

Expected values are read by hand from the released source (paths relative to ``sglang/srt``).
"""

from __future__ import annotations

import json
from functools import cache

import pytest

from nvfp4study import cli
from nvfp4study.sglang import auto_backend as ab
from nvfp4study.sglang import auto_server as asv
from nvfp4study.sglang import backend_matrix as bm
from nvfp4study.sglang.audit import audit_tree
from nvfp4study.sglang.code_index import CodeIndex
from sglang_fixtures import VERSIONS, copy23_fixture, release_gaps, released  # noqa: F401 (the copy23 fixture)

W4A4 = "layers/quantization/compressed_tensors/schemes/compressed_tensors_w4a4_nvfp4_moe.py"
W4A16 = "layers/quantization/compressed_tensors/schemes/compressed_tensors_w4a16_nvfp4_moe.py"


@cache
def _rows(version: str) -> tuple:
    """The audit rows of a release, once per test module run (the audit is the slow part)."""
    return tuple(audit_tree(released(version)))


@pytest.fixture(name="rows23", scope="module")
def rows23_fixture() -> list:
    return list(_rows("0.5.23"))


@pytest.fixture(name="m23", scope="module")
def m23_fixture(rows23) -> dict:
    return bm.build_matrix(released("0.5.23"), rows23)


def _line(version: str, where: str) -> str:
    """The source at ``where`` and the two lines after it (a call written over three lines)."""
    rel, line = where.rsplit(":", 1)
    lines = released(version).file("sglang/srt/" + rel).read_text().splitlines()
    return " ".join(x.strip() for x in lines[int(line) - 1:int(line) + 2])


def test_card_format_auto_on_blackwell_0523(m23):
    # 0.5.23, by hand: compressed_tensors.py 962-967 builds CompressedTensorsW4A4Nvfp4MoE at
    # capability >= 100 (get_min_capability 100, w4a4_nvfp4_moe.py 53-56; SM120 is 120);
    # arg_groups/overrides.py 1513-1518 rewrites auto only for modelopt_fp4, so auto reaches the
    # method; w4a4_nvfp4_moe.py 46 sets use_flashinfer_trtllm from is_flashinfer_trtllm() (False
    # for auto), so create_moe_runner takes the else branch, MoeRunner(FLASHINFER_CUTLASS) at 307.
    # The clamp audit reads that path APPROX (the README's table, flashinfer_cutlass.py:371).
    for dev in ("SM100", "SM120"):
        c = bm.cell(m23, bm.CARD_FORMAT, dev)
        assert c["method"] == "CompressedTensorsW4A4Nvfp4MoE" and c["error"] is None
        a = c["auto"]
        assert (a["backend"], a["path"], a["verdict"], a["stage"]) == (
            "flashinfer_cutlass", "CompressedTensorsW4A4Nvfp4MoE/flashinfer_cutlass", "APPROX", "method")
        assert a["where"] == f"{W4A4}:307"
        assert "MoeRunnerBackend.FLASHINFER_CUTLASS" in _line("0.5.23", a["where"])
        # both paths of the method run there; TRT-LLM asserts routing_method_type (w4a4_nvfp4_moe.py:324),
        # which Bailing never passes: it crashes whatever the limit (issue 36; before it, the literal None at 346)
        got = {b["value"]: b["verdict"] for b in c["backends"]}
        assert got == {"flashinfer_cutlass": "APPROX", "flashinfer_trtllm": "UNUSABLE"}
        # moe_hook.py 80-88: an explicit flashinfer_cutlass is refused for compressed-tensors
        refused = {b["value"]: b["refused"] for b in c["backends"]}
        assert refused == {"flashinfer_cutlass": "arg_groups/moe_hook.py:81", "flashinfer_trtllm": None}
    sentence = bm.card_answer(m23)
    assert "on SM100 `flashinfer_cutlass`" in sentence and "on SM120 `flashinfer_cutlass`" in sentence
    assert sentence.count("clamp APPROX") == 2


def test_card_format_below_blackwell_0523(m23):
    # compressed_tensors.py 968-975: below capability 100 the W4A4 checkpoint is served weight-only
    # by CompressedTensorsW4A16Nvfp4MoE; its create_moe_runner builds MoeRunner(MARLIN) at
    # w4a16_nvfp4_moe.py:163; the Marlin runner drops the clamp (moe_runner/marlin.py 205-209).
    for dev in ("Hopper", "Ampere"):
        c = bm.cell(m23, bm.CARD_FORMAT, dev)
        assert c["method"] == "CompressedTensorsW4A16Nvfp4MoE"
        assert (c["auto"]["backend"], c["auto"]["verdict"], c["auto"]["where"]) == ("marlin", "DROPPED", f"{W4A16}:163")
        assert "MoeRunnerBackend.MARLIN" in _line("0.5.23", c["auto"]["where"])
    # on a CPU torch.cuda.get_device_capability() (compressed_tensors.py 416) has no answer
    cpu = bm.cell(m23, bm.CARD_FORMAT, "CPU")
    assert cpu["method"] is None and cpu["error"].startswith("UNDECIDED")


def test_other_formats_auto_0523(m23):
    # modelopt_quant.py 3117-3123: auto -> MARLIN on CUDA capability [8.0, 10.0), else FLASHINFER_TRTLLM;
    # overrides.py 1513-1518: modelopt_fp4 on SM110/SM120 -> flashinfer_cutlass at server level.
    want = {("modelopt-nvfp4", "SM100"): ("flashinfer_trtllm", "layers/quantization/modelopt_quant.py:3123", "method"),
            ("modelopt-nvfp4", "SM120"): ("flashinfer_cutlass", "arg_groups/overrides.py:1518", "server"),
            ("modelopt-nvfp4", "Hopper"): ("marlin", "layers/quantization/modelopt_quant.py:3119", "method"),
            # fp8.py 2962-2972: auto -> DEEP_GEMM only with a DeepEP-class a2a (1520-1542), AITER only
            # on ROCm with SGLANG_USE_AITER (environ.py 949: False by default), else TRITON
            ("fp8-block", "SM100"): ("triton", "layers/quantization/fp8.py:2972", "method"),
            ("fp8-tensor", "Hopper"): ("triton", "layers/quantization/fp8.py:2972", "method"),
            ("fp8-block", "ROCm"): ("triton", "layers/quantization/fp8.py:2972", "method")}
    for (fmt, dev), (backend, where, stage) in want.items():
        a = bm.cell(m23, fmt, dev)["auto"]
        assert (a["backend"], a["where"], a["stage"]) == (backend, where, stage), (fmt, dev, a)
    # Triton forwards Ling's form (triton_utils/fused_moe.py 411-416)
    assert bm.cell(m23, "fp8-block", "SM100")["auto"]["verdict"] == "EXACT"
    # fp8.py 2974-2984: an explicit flashinfer_cutlass / flashinfer_cutedsl runs the FP8 experts on
    # Triton; flashinfer_cutlass is also refused for fp8 at start (moe_hook.py 80-88)
    by = {b["value"]: b for b in bm.cell(m23, "fp8-tensor", "SM100")["backends"]}
    for v in ("flashinfer_cutlass", "flashinfer_cutedsl"):
        assert (by[v]["path"], by[v]["verdict"], by[v]["where"]) == (
            "Fp8MoEMethod/triton", "EXACT", "layers/quantization/fp8.py:2984"), by[v]
    assert by["flashinfer_cutlass"]["refused"] == "arg_groups/moe_hook.py:81"
    # moe_hook.py 94-101: cutedsl needs an NVFP4 quantization or the model's NVFP4 MoE metadata
    assert by["flashinfer_cutedsl"]["refused"] == (
        "arg_groups/moe_hook.py:96 (unless model_config_of(server_args).nvfp4_moe_meta is not None)")
    # an explicit triton is handed to MoeRunner as it is (fp8.py 2986-2995)
    assert (by["triton"]["path"], by["triton"]["undecided"]) == ("Fp8MoEMethod/triton", None)
    # modelopt_quant.py 2377-2387: off CUDA use_marlin_fallback = is_marlin() (False for auto), and
    # not is_blackwell -> ValueError at 2383 when the method is built on ROCm
    assert bm.cell(m23, "modelopt-nvfp4", "ROCm")["error"].startswith(
        "raises at load: layers/quantization/modelopt_quant.py:2383 ")
    # quantization/__init__.py 97-103: mxfp4 is registered only `if is_cpu() or is_cuda() or
    # _is_gfx95_supported or is_xpu()` (line 102; 114 is the NPU's), so not on an MI300X (gfx942)
    rocm = bm.cell(m23, "mxfp4", "ROCm")
    assert rocm["method"] is None and rocm["error"] == (
        "--quantization mxfp4 is not registered on ROCm (layers/quantization/__init__.py:102,114)")
    assert bm.cell(m23, "mxfp4", "SM100")["method"] == "Mxfp4MoEMethod"
    # quantization/__init__.py 148-156: modelopt_fp4 is not a CPU quantization method
    assert "CPU_QUANTIZATION_METHODS" in bm.cell(m23, "modelopt-nvfp4", "CPU")["error"]


def test_every_cell_is_decided_or_names_its_place(m23):
    assert len(m23["cells"]) == len(bm.FORMATS) * len(ab.DEVICES)
    for c in m23["cells"]:
        if c["method"] is None:
            assert c["error"], c
            continue
        a = c["auto"]
        assert a["backend"] or a["undecided"], c
        if a["verdict"] == bm.UNDECIDED:
            assert a["undecided"] or not a["backend"], c
        # a listed backend runs on the cell's platform (the audit row's platform info)
        plat = next(d.platform for d in ab.DEVICES if d.key == c["device"])
        assert all(plat != "CPU" or b["value"] != "aiter" for b in c["backends"])


#: Ling's format with auto, per release, by hand: (the MoeRunner(FLASHINFER_CUTLASS) line of
#: compressed_tensors_w4a4_nvfp4_moe.py's create_moe_runner, the audit verdict of that path (the
#: README's table: no clamp field before 0.5.21, Swiglu + limit from 0.5.21), what Hopper gets:
#: the scheme's __init__ raise below Blackwell up to 0.5.21, W4A16 Marlin from 0.5.22
#: (compressed_tensors.py's weight-only fallback)).
CARD_AUTO = {
    "auto": {"0.5.19": (293, "DROPPED", "raises:37"), "0.5.20": (292, "DROPPED", "raises:36"),
             "0.5.21": (303, "APPROX", "raises:36"), "0.5.22": (303, "APPROX", "marlin"),
             "0.5.23": (307, "APPROX", "marlin")},
}


def test_card_format_per_release():
    assert release_gaps(CARD_AUTO, VERSIONS) == {}
    for v in VERSIONS:
        line, verdict, hopper = CARD_AUTO["auto"][v]
        tree = released(v)
        rows = list(_rows(v))
        code = CodeIndex(tree.root)
        fmt = next(f for f in bm.FORMATS if f.key == bm.CARD_FORMAT)
        dev = {d.key: d for d in ab.DEVICES}
        for d in ("SM100", "SM120"):
            a = bm.build_cell(tree, code, rows, fmt, dev[d], asv.server_refusals(code))["auto"]
            assert (a["backend"], a["where"], a["verdict"]) == ("flashinfer_cutlass", f"{W4A4}:{line}", verdict), (v, d)
        h = bm.build_cell(tree, code, rows, fmt, dev["Hopper"], asv.server_refusals(code))
        if hopper == "marlin":
            assert (h["method"], h["auto"]["backend"], h["auto"]["verdict"]) == (
                "CompressedTensorsW4A16Nvfp4MoE", "marlin", "DROPPED"), v
        else:
            assert h["error"].startswith(f"raises at load: {W4A4}:{hopper.split(':')[1]} "), (v, h["error"])


def test_auto_on_0519():
    # 0.5.19 by hand: w4a4_nvfp4_moe.py 288-293 MoeRunner(FLASHINFER_CUTLASS) unless
    # use_flashinfer_trtllm; __init__ raises below Blackwell (line 37: is_blackwell, utils/common.py
    # majors [10, 11, 12]); overrides.py 1509-1513 modelopt_fp4 on SM110/SM120 -> flashinfer_cutlass.
    tree = released("0.5.19")
    code = CodeIndex(tree.root)
    rel = "sglang/srt/" + W4A4
    cls = code.top(rel, "CompressedTensorsW4A4Nvfp4MoE")
    dev = {d.key: d for d in ab.DEVICES}
    got = ab.method_auto(code, rel, cls, ab.Facts(code, dev["SM120"]))
    assert (got.backend, got.where) == ("flashinfer_cutlass", f"{W4A4}:293")
    assert ab.init_raises(code, rel, cls, ab.Facts(code, dev["SM100"])) is None
    assert ab.init_raises(code, rel, cls, ab.Facts(code, dev["Hopper"])).startswith(f"{W4A4}:37 ")
    assert ab.capability_majors(code)["is_blackwell"] == [10, 11, 12]
    srv = asv.server_auto(code, "modelopt_fp4", ab.Facts(code, dev["SM120"]))
    assert (srv.backend, srv.where) == ("flashinfer_cutlass", "arg_groups/overrides.py:1513")
    assert asv.server_auto(code, "modelopt_fp4", ab.Facts(code, dev["SM100"])) is None
    assert asv.server_auto(code, "compressed-tensors", ab.Facts(code, dev["SM120"])) is None


def test_undecided_test_is_named(copy23):
    # an auto branch on a test the reader cannot decide: UNDECIDED with that test's line
    f = copy23.file("sglang/srt/" + W4A4)
    src = f.read_text()
    old = "        if self.use_flashinfer_trtllm:\n            import sglang.srt.layers.moe.moe_runner.flashinfer_trtllm"
    assert old in src
    f.write_text(src.replace(old, "        if some_runtime_probe():\n            import sglang.srt.layers.moe.moe_runner.flashinfer_trtllm"))
    code = CodeIndex(copy23.root)
    cls = code.top("sglang/srt/" + W4A4, "CompressedTensorsW4A4Nvfp4MoE")
    got = ab.method_auto(code, "sglang/srt/" + W4A4, cls, ab.Facts(code, ab.DEVICES[0]))
    assert got.backend is None and "some_runtime_probe()" in got.undecided and W4A4 in got.undecided


def test_bailing_model_override_applies_only_to_fp4_experts():
    # arg_groups/model_overrides/bailing_moe_v3.py 20-44 (0.5.23): fp8 with is_fp4_experts on
    # SM90/SM100/SM120 -> flashinfer_mxfp4; a plain FP8 checkpoint gets nothing from it
    code = CodeIndex(released("0.5.23").root)
    sm100 = ab.DEVICES[0]
    assert asv.model_auto(code, "fp8", ab.Facts(code, sm100)) is None
    mixed = asv.model_auto(code, "fp8", ab.Facts(code, sm100, extra={"model_config.is_fp4_experts": True}))
    assert (mixed.backend, mixed.where) == ("flashinfer_mxfp4", "arg_groups/model_overrides/bailing_moe_v3.py:44")
    assert asv.model_auto(code, "fp8", ab.Facts(code, ab.DEVICES[3], extra={"model_config.is_fp4_experts": True})) is None


def test_rows_of_another_release_are_refused():
    from nvfp4study.core.errors import SGLangSourceError

    rows = list(_rows("0.5.22"))
    with pytest.raises(SGLangSourceError, match="0.5.22"):
        bm.build_matrix(released("0.5.23"), rows)


def test_cli_matrix_and_bad_version(capsys):
    assert cli.main(["audit-sglang", "--matrix", "--version", "0.5.23"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("MoE backend matrix, SGLang 0.5.23")
    flat = " ".join(out.split())
    assert "on SM100 `flashinfer_cutlass`" in flat and "explicit value refused at start" in flat
    assert cli.main(["audit-sglang", "--matrix", "--version", "9.9.9"]) == 2
    err = capsys.readouterr().err
    assert "SGLangSourceError" in err and "9.9.9" in err and "0.5.23" in err


def test_cli_matrix_json(capsys):
    assert cli.main(["audit-sglang", "--matrix", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["sglang_version"] == "0.5.23"
    assert bm.cell(doc, bm.CARD_FORMAT, "SM120")["auto"]["backend"] == "flashinfer_cutlass"


def test_report_table_is_compact(tmp_path, m23):
    from nvfp4study.stages import s99_report as report

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "sglang_backend_matrix.json").write_text(json.dumps({"latest": "0.5.23",
                                                                               "releases": {"0.5.23": m23}}))
    html = report.backend_matrix_html(tmp_path)
    # one header row, then one row per run of formats whose cells are all alike (0.5.23: FP8 block,
    # FP8 per-tensor and W8A8 INT8 are 'triton EXACT' on every device; MXFP4 is not served on ROCm)
    body = html.split("<tbody>")[1]
    assert body.count("<tr>") == len(bm.FORMATS) - 2
    assert "<th>FP8 block 128x128; FP8 per-tensor; W8A8 INT8</th>" in body and "<th>MXFP4</th>" in body
    assert html.count("<th>") == len(ab.DEVICES) + 1 + len(bm.FORMATS) - 2
    assert "flashinfer_<wbr>cutlass APPROX" in html and "table-layout:fixed" in html
    assert "SM100 <code>flashinfer_cutlass</code> (clamp APPROX), SM120 <code>flashinfer_cutlass</code> (clamp APPROX)" in html
    assert report.backend_matrix_html(tmp_path / "nothing") == ""


def test_stage_writes_the_matrix_file(tmp_path, rows23):
    from nvfp4study.core.errors import StageInputMissing
    from nvfp4study.core.params import DEFAULT_PARAMS
    from nvfp4study.core.stage import open_stage
    from nvfp4study.stages import s03_sglang as s3

    st = open_stage("03_patch_sglang", str(DEFAULT_PARAMS), str(tmp_path / "run"))
    with pytest.raises(StageInputMissing, match="sglang_backend_matrix"):
        s3.backend_answer(st)
    table = s3.backend_matrix(st, rows23).data
    assert list(table.columns) == ["format", *(d.key for d in ab.DEVICES)]
    assert table.iloc[0]["SM100"] == "auto -> flashinfer_cutlass: APPROX"
    f = st.paths.data("sglang_backend_matrix")
    doc = json.loads(f.read_text())
    assert doc["latest"] == "0.5.23" and list(doc["releases"]) == ["0.5.23"]
    assert bm.cell(doc["releases"]["0.5.23"], bm.CARD_FORMAT, "SM120")["auto"]["verdict"] == "APPROX"
    assert not list(f.parent.glob("*.tmp*"))  # written whole, through a temporary file
    answer = s3.backend_answer(st)
    assert "on SM120 `flashinfer_cutlass`" in getattr(answer, "data", str(answer))


# A blind hand reading (a reader who saw neither this module nor its output, only the released
# sources) of what SGLang builds and runs for Ling's compressed-tensors NVFP4 W4A4 checkpoint with
# --moe-runner-backend auto, a2a none, TP 1: (release, device) -> (method, auto resolves to).
# 0.5.23: compressed_tensors.py 962-967 (W4A4 at capability >= 100), 968-976 (W4A16 fallback
# below); w4a4_nvfp4_moe.py 46 use_flashinfer_trtllm False for AUTO -> FLASHINFER_CUTLASS at
# 304-309; w4a16_nvfp4_moe.py 163 MARLIN; overrides.py 1449-1525 and model_overrides/
# bailing_moe_v3.py 22-35 leave auto alone for compressed-tensors. 0.5.20: compressed_tensors.py
# 872-874 (W4A4, no capability check), w4a4_nvfp4_moe.py 42 and 279-294 -> FLASHINFER_CUTLASS.
BLIND_AUTO = {("0.5.23", "SM100"): ("CompressedTensorsW4A4Nvfp4MoE", "flashinfer_cutlass"),
              ("0.5.23", "SM120"): ("CompressedTensorsW4A4Nvfp4MoE", "flashinfer_cutlass"),
              ("0.5.23", "Hopper"): ("CompressedTensorsW4A16Nvfp4MoE", "marlin"),
              ("0.5.20", "SM100"): ("CompressedTensorsW4A4Nvfp4MoE", "flashinfer_cutlass")}


def test_auto_choice_agrees_with_a_blind_reading(m23):
    mats = {"0.5.23": m23, "0.5.20": bm.build_matrix(released("0.5.20"), list(_rows("0.5.20")))}
    got = {(v, dev): (bm.cell(mats[v], bm.CARD_FORMAT, dev)["method"],
                      bm.cell(mats[v], bm.CARD_FORMAT, dev)["auto"]["backend"]) for v, dev in BLIND_AUTO}
    assert got == BLIND_AUTO


def test_cells_carry_the_other_parameters(rows23, m23):
    """Issue 36: with the parameter audit's rows, each reached path carries each parameter's verdict
    (the row of the clamp audit's path id); the card's cell on Blackwell reads the routed scaling
    factor DROPPED (compressed_tensors_w4a4_nvfp4_moe.py:375 passes apply_routed_scaling_factor=False),
    which the texts say, while an UNDECIDED parameter stays in the data only. Without the rows,
    nothing is added."""
    from nvfp4study.sglang.param_audit import audit_param

    tree = released("0.5.23")
    card = [r for r in rows23 if r.path == "nvfp4-w4a4-cutlass"]
    rsf = [r.as_json() for r in audit_param(tree, "routed_scaling_factor", ["nvfp4-w4a4-cutlass"], card)]
    assert [r["verdict"] for r in rsf] == ["DROPPED"]
    other = [{**rsf[0], "sglang_version": "0.5.22", "verdict": "APPLIED"}]  # another release's row: not used
    m = bm.build_matrix(tree, rows23, {"routed_scaling_factor": rsf + other, "grouped_topk": []})
    for dev in ("SM100", "SM120"):
        a = bm.cell(m, bm.CARD_FORMAT, dev)["auto"]
        assert a["params"] == {"routed_scaling_factor": "DROPPED", "grouped_topk": "UNDECIDED"}
        assert bm.auto_text(bm.cell(m, bm.CARD_FORMAT, dev)) == \
            "auto -> flashinfer_cutlass: APPROX, routed_scaling_factor DROPPED"
        assert bm.auto_text(bm.cell(m23, bm.CARD_FORMAT, dev)) == "auto -> flashinfer_cutlass: APPROX"
        assert bm.cell(m23, bm.CARD_FORMAT, dev)["auto"]["params"] == {}
    assert "clamp APPROX, routed_scaling_factor DROPPED" in bm.card_answer(m)
    assert "(clamp APPROX, routed_scaling_factor DROPPED)" in bm.card_answer_short(m)
    # a path without a row in the parameter audit is UNDECIDED for it, never another path's verdict
    triton = next(b for c in m["cells"] for b in c["backends"] if b.get("path", "").endswith("/triton"))
    assert triton["params"] == {"routed_scaling_factor": "UNDECIDED", "grouped_topk": "UNDECIDED"}

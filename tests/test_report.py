"""The report's pieces: readable values, headline sentences, open work, the README section."""

import re

import pytest

from nvfp4study.core.errors import StudyError
from nvfp4study.core.ledger import card_claims
from nvfp4study.report import findings, readable
from nvfp4study.report.sections import FIGURES, SECTIONS, figure_info, section_of


def _text(h: str) -> str:
    # <wbr> is a place a line may break, not a space
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", h.replace("<wbr>", ""))).strip()


def test_versions_by_paths_is_a_table():
    v = {"0.5.20": {"cutlass": "DROPPED", "trtllm": "DROPPED"}, "0.5.21": {"cutlass": "APPROX", "trtllm": "DROPPED"}}
    h = readable.value_html(v)
    assert h.count("<tr>") == 3 and "<th>SGLang</th>" in h and "<th>cutlass</th>" in h
    assert _text(h) == "SGLang cutlass trtllm 0.5.20 DROPPED DROPPED 0.5.21 APPROX DROPPED"


def test_count_formula_range_units_percent():
    assert _text(readable.value_html({"count": 288, "formula": "3 x num_experts x (L - k) = 3 x 16 x (8 - 2)"})) \
        == "288 = 3 x 16 x (8 - 2)"
    assert _text(readable.value_html({"accept_len": [1.85, 1.95], "tok_s": 40.19, "load_s": 300})) \
        == "accept len 1.85 – 1.95 tok/s 40.19 tok/s load s 300 s"
    # fractions are percent when their key (or the parent's) says so; 0.3964 -> 39.6 %
    assert "39.6 %" in readable.value_html({"recall_all": {"detector": 0.3964}})
    assert readable.number(61440) == "61,440" and readable.number(0.5, "share_fraction") == "50 %"


def test_no_json_and_long_values_clipped_with_the_whole_value():
    long = {f"k{i}": "x" * 300 for i in range(12)}
    cell = readable.cell_html(long)
    compact, whole = cell.split("<details", 1)
    assert "… 4 more rows" in compact and "x" * 300 not in compact
    assert whole.count("x" * 300) == 12
    for c in card_claims():
        t = _text(readable.cell_html(c["card"]))
        assert not re.search(r"[{\[]\s*[\"']|[\"']\s*:", t), (c["id"], t)
    assert readable.cell_html(None, "not measured").endswith("not measured</span>")


def _claim_row(id_, measured, verdict="partly", **kw):
    """A ledger row as :func:`~nvfp4study.core.ledger.record` writes it (``kw``: its other fields)."""
    return {"id": id_, "stage": kw.get("stage", "03_patch_sglang"), "claim": kw.get("claim", f"claim {id_}."),
            "card": kw.get("card"), "origin": kw.get("origin", "card"), "measured": measured,
            "verdict": verdict, "evidence": kw.get("evidence", []), "note": kw.get("note", ""), "checked_on": None}


def test_headline_from_data_and_fallback():
    rows = [_claim_row("sglang.w4a16-unservable", {"0.5.20": "AttributeError: x", "0.5.22": "SchemeB", "0.5.23": "SchemeB"},
                       "contradicted"),
            _claim_row("det.min-deepgemm-dim", None, "not run", note="not run: needs an NVFP4-capable GPU (x). More.")]
    by = {f.title: f for f in findings.headlines(rows)}
    w = by["W4A16"]
    assert w.generated == "data" and w.verdict == "contradicted"
    assert "on 0.5.20, but 0.5.22 and 0.5.23 select `SchemeB`" in w.sentence
    d = by["Deterministic mode"]
    assert d.generated == "fallback" and d.verdict == "not run" and "needs an NVFP4-capable GPU (x)" in d.sentence
    assert set(by) == {"W4A16", "Deterministic mode"}  # headlines whose rows are absent are left out


def test_other_runners_headline_names_raising_runners():
    # each runner classed by its worst path; REFUSED / UNUSABLE named only when a runner is one
    assert findings.runner_class({"EXACT", "UNUSABLE"}) == "UNUSABLE"
    assert findings.runner_class({"REFUSED", "APPROX"}) == "APPROX"
    assert findings.runner_class({"REFUSED", "DROPPED"}) == "DROPPED"
    assert findings.runner_class({"UNDECIDED"}) == "APPROX"
    agreement = {"stage_counts": {k: 0 for k in ("dropped_trusted_kind", "trusted_kind", "dropped_counted",
                                                  "dropped_catalogued", "dropped_hand", "hand_read",
                                                  "dropped_machine", "machine")},
                 "overall": {"n": 1, "agree": 1, "rate": 1.0, "wilson95": [0.2, 1.0]}, "trusted_kinds": []}
    measured = {"triton": {"t": "EXACT"}, "marlin": {"m": "DROPPED"}, "lora": {"l": "REFUSED"},
                "gguf": {"g": "UNUSABLE", "h": "EXACT"}}
    rows = [_claim_row("clamp.others-forward", measured, "contradicted"),
            _claim_row("finding.audit-agreement", agreement, "partly")]
    s = {f.title: f for f in findings.headlines(rows)}["Other MoE runners"].sentence
    assert ("of the 4 runners the card names that the audit decides, `triton` forward it exactly, `lora` refuse "
            "to start when the limit is set, `gguf` cannot run for Ling at all and `marlin` drop it;") in s
    rows[0] = _claim_row("clamp.others-forward", {"triton": {"t": "EXACT"}}, "reproduced")
    s = {f.title: f for f in findings.headlines(rows)}["Other MoE runners"].sentence
    assert "`triton` forward it exactly and none drop it;" in s
    rows[0] = _claim_row("clamp.others-forward", {"triton": {"t": "EXACT"}, "m": {"m": "APPROX"}}, "reproduced")
    s = {f.title: f for f in findings.headlines(rows)}["Other MoE runners"].sentence
    assert "`triton` forward it exactly, `m` approximately and none drop it;" in s


def test_open_items_group_gpu_stages_once():
    rows = [_claim_row("a", None, "not run", stage="04_launch_server", note="not run: needs an NVFP4-capable GPU (no GPU)"),
            _claim_row("b", None, "not run", stage="06_mtp_sweep", note="not run: needs an NVFP4-capable GPU (no GPU)"),
            _claim_row("c", None, "not run", stage="02_inspect_checkpoint", note="not run (generated checkpoint: circular): x"),
            _claim_row("d", {"x": 1}, "partly")]
    items = findings.open_items(rows)
    assert [(o.stage, o.rows) for o in items] == [("04_launch_server, 06_mtp_sweep", ["a", "b"]),
                                                  ("02_inspect_checkpoint", ["c"])]
    assert items[0].commands[0] == findings.GPU_COMMAND and "128 GB" in items[0].hardware
    assert items[1].reason == "generated checkpoint: circular" and "quantized_path" in items[1].commands[0]
    assert findings.verdict_counts(rows)["card"] == {"reproduced": 0, "contradicted": 0, "partly": 1, "not run": 3}


def test_readme_section_replacement():
    text = f"intro\n{findings.START}\nold 1,234\n{findings.END}\nrest"
    new = findings.replace_section(text, f"{findings.START}\nnew\n{findings.END}")
    assert new == f"intro\n{findings.START}\nnew\n{findings.END}\nrest"
    assert findings.current_section(new) == f"{findings.START}\nnew\n{findings.END}"
    with pytest.raises(StudyError, match="markers"):
        findings.replace_section("no markers", "x")


def test_every_card_claim_has_a_section_and_figures_are_captioned():
    keys = {k for k, _, _ in SECTIONS}
    assert all(section_of(c["id"]) in keys for c in card_claims())
    assert all(v["section"] in keys and v["caption"] and v["read"] and v["alt"] for v in FIGURES.values())
    unknown = figure_info("new-figure", {"new-figure": "mtp"})
    assert unknown["generic"] and unknown["section"] == "mtp" and unknown["caption"]


def test_row_leads_with_its_verdict_and_folds_long_detail():
    from nvfp4study.stages.s99_report import NOTE_CHARS, row_html

    note = "Not measured on the real files. " + "More words here. " * 20
    evidence = [f"data/serve-raw-{i}.jsonl" for i in range(6)]
    h = row_html(_claim_row("size.disk", {"path": "layers/moe/moe_runner/marlin.py:179"}, note=note,
                            evidence=evidence, checked_on="sglang 0.5.23"))
    assert findings.row_verdict(_claim_row("size.disk", 1, note=note)) == \
        "Partly reproduced: Not measured on the real files."
    lead = re.search(r'<div class="lead">(.*?)</div>', h).group(1)
    assert _text(lead) == "Partly reproduced : Not measured on the real files."  # the label, then the sentence
    # how / why: the rest of the note (not the lead again), its tail and the evidence list folded
    why = h.split('<td class="c-why">', 1)[1]
    shown = _text(re.sub(r"<details.*?</details>", "", why, flags=re.S))
    assert "Not measured" not in shown and len(shown) < NOTE_CHARS + 120
    assert 'details class="more fold"' in why and 'details class="more evidence"' in why
    assert "data/serve-raw-0.jsonl and 5 more files" in _text(why)
    assert "layers/<wbr>moe/<wbr>moe_runner/<wbr>marlin.py:179" in h  # paths break at their slashes
    # a "not run" row says why as the open work groups it; a study finding without a card value is marked
    nr = _claim_row("mtp.k2", None, "not run", note="not run: needs the real model on an NVFP4-capable GPU (x)")
    assert findings.row_verdict(nr) == "Not run: needs an NVFP4-capable GPU."
    assert 'class="c-card none"' in row_html({**nr, "origin": "study"}) and 'class="c-ours none"' in row_html(nr)

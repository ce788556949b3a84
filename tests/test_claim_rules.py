"""The claim-rule registry (``core/claim_rules.py``): every card claim of ``claims.yaml`` is decided
in exactly one place, a registered rule (``stages/claim_rules/``), and every registered rule
decides a row that exists."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from dataclasses import dataclass
from typing import ClassVar

import pytest

from nvfp4study.core import claim_rules as cr
from nvfp4study.core.errors import LedgerError
from nvfp4study.core.ledger import Verdict, card_claims, read_ledger
from nvfp4study.core.stage import open_stage
from nvfp4study.stages import claim_rules as rules_pkg


def registered() -> dict[str, cr.Rule]:
    for mod in pkgutil.iter_modules(rules_pkg.__path__):
        importlib.import_module(f"{rules_pkg.__name__}.{mod.name}")
    return dict(cr.RULES)


def test_every_rules_module_is_listed():
    assert sorted(m.name for m in pkgutil.iter_modules(rules_pkg.__path__)) == sorted(rules_pkg.__all__)


def test_every_card_claim_is_decided_in_exactly_one_place():
    rules = {i: r for i, r in registered().items() if r.kind == "claim"}
    claims = {c["id"]: c["stage"] for c in card_claims()}
    nowhere = sorted(set(claims) - set(rules))
    assert not nowhere, f"claims with no registered rule: {nowhere}"
    unknown = sorted(set(rules) - set(claims))
    assert not unknown, f"rules for ids that are not card claims: {unknown}"


def test_each_rule_belongs_to_its_claims_stage():
    claims = {c["id"]: c["stage"] for c in card_claims()}
    wrong = {i: (r.stage, claims[i]) for i, r in registered().items() if r.kind == "claim" and r.stage != claims[i]}
    assert not wrong, f"rule stage != claims.yaml stage: {wrong}"


def test_findings_are_not_card_claims_and_say_what_they_claim():
    ids = {c["id"] for c in card_claims()}
    findings = {i: r for i, r in registered().items() if r.kind == "finding"}
    assert findings and not set(findings) & ids
    assert all(len(r.claim) > 20 for r in findings.values())


def test_each_rules_module_belongs_to_the_stage_that_imports_it():
    # rNN_x holds the rules of stage sNN_y: every rule's STAGE is that stage's notebook, and the
    # stage imports the module (importing it registers the rules record_rules runs)
    stages = {m.name[1:3]: m.name for m in pkgutil.iter_modules(importlib.import_module("nvfp4study.stages").__path__)
              if m.name[0] == "s"}
    for name in rules_pkg.__all__:
        stage = importlib.import_module(f"nvfp4study.stages.{stages[name[1:3]]}")
        assert f"from .claim_rules import {name} as rules" in inspect.getsource(stage), stage.__name__
        mine = {r.stage for r in registered().values() if r.fn.__module__ == f"{rules_pkg.__name__}.{name}"}
        assert mine == {stage.NOTEBOOK}, name


# --- the registry itself ------------------------------------------------------------------------
@dataclass(frozen=True)
class _M:
    STAGE: ClassVar[str] = "02_inspect_checkpoint"
    n: int


@pytest.fixture
def scratch_registry():
    """An empty registry for the test; the real rules are put back afterwards."""
    saved = dict(cr.RULES)
    cr.RULES.clear()
    yield
    cr.RULES.clear()
    cr.RULES.update(saved)


def test_record_rules_writes_rows_in_order_and_skips_absent_findings(tmp_path, scratch_registry):
    @cr.claim_rule("size.disk", _M)
    def disk(m: _M) -> cr.Row:
        return cr.Row({"disk_gb": m.n}, Verdict.PARTLY, note="n", checked_on="here")

    @cr.claim_rule("config.context", _M)
    def ctx(m: _M) -> cr.Row:
        return cr.Row.not_run("no config")

    @cr.finding_rule("test.finding", _M, claim="a finding that only some runs have")
    def absent(m: _M) -> cr.Row | None:
        return None

    st = open_stage("02_inspect_checkpoint", "", str(tmp_path / "run"))
    out = cr.record_rules(st, _M(76))
    assert [r["id"] for r in out] == ["size.disk", "config.context"]
    rows = {r["id"]: r for r in read_ledger(st.run_dir)}
    assert rows["size.disk"]["measured"] == {"disk_gb": 76} and rows["size.disk"]["verdict"] == "partly"
    assert rows["config.context"]["note"] == "not run: no config" and rows["config.context"]["evidence"] == []
    assert "test.finding" not in rows
    assert [r["id"] for r in cr.record_rules(st, _M(1), ids={"config.context"})] == ["config.context"]


def test_a_second_rule_for_an_id_and_a_claim_rule_without_a_row_are_refused(tmp_path, scratch_registry):
    @cr.claim_rule("size.disk", _M)
    def none(m: _M):
        return None

    with pytest.raises(LedgerError, match="two rules"):
        cr.claim_rule("size.disk", _M)(none)
    with pytest.raises(LedgerError, match="no row"):
        cr.record_rules(open_stage("02_inspect_checkpoint", "", str(tmp_path / "run")), _M(0))

    class NoStage:
        pass

    with pytest.raises(LedgerError, match="STAGE"):
        cr.claim_rule("config.context", NoStage)(none)


def test_a_finding_row_may_state_this_runs_claim_a_card_claim_may_not(tmp_path, scratch_registry):
    @cr.finding_rule("test.repeats", _M, claim="greedy output is identical across repeats")
    def repeats(m: _M) -> cr.Row:
        return cr.Row(m.n, Verdict.REPRODUCED, claim=f"greedy output is identical across {m.n} repeats")

    @cr.finding_rule("test.plain", _M, claim="a finding stated once, whatever the params")
    def plain(m: _M) -> cr.Row:
        return cr.Row(m.n, Verdict.PARTLY)

    st = open_stage("02_inspect_checkpoint", "", str(tmp_path / "run"))
    cr.record_rules(st, _M(3))
    rows = {r["id"]: r for r in read_ledger(st.run_dir)}
    assert rows["test.repeats"]["claim"] == "greedy output is identical across 3 repeats"
    assert rows["test.plain"]["claim"] == "a finding stated once, whatever the params"

    @cr.claim_rule("size.disk", _M)
    def disk(m: _M) -> cr.Row:
        return cr.Row(m.n, Verdict.PARTLY, claim="76 GB on disk, or so")

    with pytest.raises(LedgerError, match="claim text for card claim 'size.disk'"):
        cr.record_rules(st, _M(1), ids={"size.disk"})


def test_no_stage_writes_a_ledger_row_past_the_registry():
    # every row goes through a registered rule (record_rules); "not run" marks stay stage.not_run
    from nvfp4study.core.params import REPO_ROOT

    lib = REPO_ROOT / "lib" / "nvfp4study"
    inline = {str(p.relative_to(lib)): n for p in sorted(lib.rglob("*.py")) if p.parent.name not in ("core", "claim_rules")
              if (n := p.read_text().count(".add_finding(") + p.read_text().count("stage.record("))}
    assert inline == {}, f"ledger rows written inline, not through a rule: {inline}"

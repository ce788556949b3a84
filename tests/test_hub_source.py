"""Hub sources in params: ``checkpoint.source: hub`` downloads through the fixture Hub, records the
commit, and a re-run reuses it; ``checkpoint.card_checkpoint`` validates."""

from __future__ import annotations

import json

import pytest

from hub_server import HubServer, Repo
from nvfp4study.checkpoint.layout import iter_header_specs
from nvfp4study.core.errors import HubRevisionNotFound, ParamsError, SourceCheckpointMissing
from nvfp4study.core.params import load_params
from nvfp4study.core.paths import RunPaths
from nvfp4study.stages import s01_quantize as qs

SHA = "a" * 40


@pytest.fixture
def bf16_repo(tmp_path_factory):
    from ling_fixtures import TINY
    from nvfp4study.checkpoint.generate import write_checkpoint

    return write_checkpoint(TINY, tmp_path_factory.mktemp("src") / "bf16", shards=2)


def _params(tmp_path, text: str):
    f = tmp_path / "p.yaml"
    f.write_text("profile: hubtest\n" + text)
    return load_params(f)


def test_hub_source_downloads_records_the_commit_and_reuses_it(bf16_repo, tmp_path, monkeypatch):
    repo = Repo("study/bf16", bf16_repo, SHA)
    with HubServer([repo]) as srv:
        monkeypatch.setenv("HF_ENDPOINT", srv.url)
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        params = _params(tmp_path, "checkpoint:\n  source: hub\n  source_hub: {repo_id: study/bf16, revision: main}\n")
        paths = RunPaths(tmp_path / "run")
        p = qs.plan(params, paths)
        assert p["source_kind"] == "hub" and p["source"] == "hf:study/bf16@main"
        src = qs.build_source(params, paths, p)
        assert src["hub"]["commit"] == SHA and p["source"].endswith(SHA)
        assert json.loads((tmp_path / "run" / "data" / "source_hub.json").read_text())["commit"] == SHA
        assert src["tensors"] == len(list(iter_header_specs(bf16_repo)))
        # the branch moves on the Hub: a re-run in this run folder keeps the recorded commit
        repo.revisions = {SHA, "b" * 40}
        srv.reset_counters()
        p2 = qs.plan(params, paths)
        src2 = qs.build_source(params, paths, p2)
        assert src2["hub"]["commit"] == SHA and src2["hub"]["reused_commit"]
        assert not any("/revision/main" in path for _, path, _ in srv.log)


def test_hub_source_bad_revision_and_missing_block(bf16_repo, tmp_path, monkeypatch):
    with HubServer([Repo("study/bf16", bf16_repo, SHA)]) as srv:
        monkeypatch.setenv("HF_ENDPOINT", srv.url)
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        params = _params(tmp_path, "checkpoint:\n  source: hub\n  source_hub: {repo_id: study/bf16, revision: nope}\n")
        paths = RunPaths(tmp_path / "run")
        (tmp_path / "run" / "data").mkdir(parents=True)
        with pytest.raises(HubRevisionNotFound):
            qs.build_source(params, paths, qs.plan(params, paths))
        assert not (tmp_path / "run" / "data" / "source_hub.json").exists()
    with pytest.raises(SourceCheckpointMissing, match="source_hub"):
        qs.plan(_params(tmp_path, "checkpoint:\n  source: hub\n"), paths)
    with pytest.raises(ParamsError):
        _params(tmp_path, "checkpoint:\n  card_checkpoint: {repo: x/y}\n")

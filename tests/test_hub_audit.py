"""Remote (Hub) audit: a fixture Hub server, the offline cache path and the bad inputs of issue 15.

The fixture repository is a header-only NVFP4 layout from the project's generator (sparse weights,
real ``[1]`` scales) with two scales edited in place so value checks have something to find: one
NaN input_global_scale and one expert whose up_proj global scale differs from its gate_proj's.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import numpy as np
import pytest

from hub_server import HubServer, Repo
from nvfp4study import cli
from nvfp4study.checkpoint.audit import audit_checkpoint
from nvfp4study.checkpoint.hub_audit import open_target
from nvfp4study.checkpoint.reader import coalesce, decode_scalar
from nvfp4study.core import hub
from nvfp4study.core.errors import (
    HubAccessDenied,
    HubNotCached,
    HubRepoNotFound,
    HubRevisionNotFound,
    HubUnreachable,
    IndexShardMissing,
    ShardTruncated,
)
from nvfp4study.core.params import LingShape

SHAPE = LingShape(
    vocab_size=16384, hidden_size=1024, intermediate_size=1024, num_hidden_layers=3,
    num_attention_heads=8, num_key_value_heads=8, head_dim=128, layer_group_size=3,
    num_experts=16, num_experts_per_tok=2, n_group=2, topk_group=1,
    moe_intermediate_size=512, moe_shared_expert_intermediate_size=512, first_k_dense_replace=1,
    kv_lora_rank=128, qk_nope_head_dim=64, qk_rope_head_dim=32, v_head_dim=64,
    expert_swiglu_limits={2: 4.0}, share_expert_swiglu_limits={1: 5.0, 2: 7.0},
)
REPO = "study-fixture/ling-nvfp4"
GATED = "study-fixture/gated"
SHA = "0123456789abcdef0123456789abcdef01234567"
TOKEN = "hf_fixture_token"
NAN_SCALE = "model.layers.2.mlp.experts.3.down_proj.input_global_scale"
UP_SCALE = "model.layers.1.mlp.experts.5.up_proj.weight_global_scale"


def _poke(root: Path, tensor: str, value: float) -> None:
    """Overwrite one F32 [1] tensor's bytes in place (offsets from the header, independently parsed)."""
    index = json.loads((root / "model.safetensors.index.json").read_text())
    shard = root / index["weight_map"][tensor]
    with open(shard, "r+b") as fh:
        n = struct.unpack("<Q", fh.read(8))[0]
        entry = json.loads(fh.read(n))[tensor]
        fh.seek(8 + n + entry["data_offsets"][0])
        fh.write(np.float32(value).tobytes())


@pytest.fixture(scope="module")
def fixture_repo(tmp_path_factory) -> Path:
    from nvfp4study.checkpoint.generate import write_checkpoint

    root = write_checkpoint(SHAPE, tmp_path_factory.mktemp("hub") / "ckpt", shards=3, header_only=True, layout="nvfp4")
    _poke(root, NAN_SCALE, float("nan"))
    _poke(root, UP_SCALE, 12345.0)
    return root


@pytest.fixture
def hub_env(fixture_repo, tmp_path, monkeypatch):
    """A running fixture Hub with the public repo and a gated copy; HF_* pointed at it and a fresh cache."""
    srv = HubServer([Repo(REPO, fixture_repo, SHA), Repo(GATED, fixture_repo, "f" * 40, token=TOKEN)])
    with srv:
        monkeypatch.setenv("HF_ENDPOINT", srv.url)
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.delenv("HF_TOKEN", raising=False)
        monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        yield srv


def _findings(rep) -> list[dict]:
    return [f.to_dict() for f in rep.findings]


def test_remote_audit_gives_the_local_findings_from_under_one_percent_of_the_bytes(fixture_repo, hub_env, capsys):
    local = audit_checkpoint(fixture_repo)
    path, reader, source = open_target(f"hf:{REPO}@main")
    assert source["commit"] == SHA  # the branch was resolved to the commit
    remote = audit_checkpoint(path, reader=reader)
    assert _findings(remote) == _findings(local)
    codes = {f["code"] for f in _findings(remote)}
    assert {"F01-input-scale-nonfinite", "gate-up-scale-mismatch"} <= codes  # the poked values, read remotely
    assert remote.gate_up_summary["mismatched"] == 1
    assert remote.input_scales == local.input_scales and remote.counts == local.counts
    total = sum(p.stat().st_size for p in fixture_repo.iterdir())
    # our counts agree with the server's (its bytes also hold the two API JSON answers)
    assert reader.stats.requests == hub_env.requests and reader.stats.bytes <= hub_env.bytes
    assert 0 < hub_env.bytes < 0.01 * total
    # every byte range asked of a shard lies in its header or in a [1] scale
    assert all(r for m, p, r in hub_env.log if p.endswith(".safetensors") and m == "GET")
    print(f"fixture {total} bytes; fetched {hub_env.bytes} bytes ({100 * hub_env.bytes / total:.3f} %) "
          f"in {hub_env.requests} requests")


def test_cli_prints_bytes_and_requests(hub_env, capsys):
    rc = cli.main(["audit-checkpoint", f"hf:{REPO}", "--json"])
    out, err = capsys.readouterr()
    assert rc == 1  # the NaN input scale is an error finding
    assert any(f["code"] == "gate-up-scale-mismatch" for f in json.loads(out))
    assert f" bytes in {hub_env.requests} requests" in err and "% of the checkpoint" in err


def test_offline_from_a_populated_cache(fixture_repo, hub_env, monkeypatch):
    folder, commit = hub.download(hub.HubRef(REPO, "main"))
    assert commit == SHA and folder.name == SHA
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens: offline must not ask
    n = hub_env.requests
    path, reader, source = open_target(f"hf:{REPO}@main")
    assert source["kind"] == "cache" and source["commit"] == SHA
    assert _findings(audit_checkpoint(path, reader=reader)) == _findings(audit_checkpoint(fixture_repo))
    assert hub_env.requests == n


def test_offline_without_cache_is_named(hub_env, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(HubNotCached, match="HF_HUB_OFFLINE"):
        open_target(f"hf:{REPO}@main")


def test_interrupted_download_resumes(fixture_repo, tmp_path, monkeypatch):
    """A connection cut half-way through a shard: huggingface_hub 1.33 resumes it in the same call
    with a Range request from the byte it had written (file_download.py http_get, 5 retries per stall;
    it writes in 10 MiB chunks, DOWNLOAD_CHUNK_SIZE, so a cut at 30e6 bytes resumes at 20 MiB)."""
    shard = "model-00002-of-00003.safetensors"
    srv = HubServer([Repo(REPO, fixture_repo, SHA)], cut_after={shard: 30_000_000}, fail_once=True)
    with srv:
        monkeypatch.setenv("HF_ENDPOINT", srv.url)
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        folder, commit = hub.download(hub.HubRef(REPO, "main"))
        assert commit == SHA
        assert (folder / shard).read_bytes()[:4096] == (fixture_repo / shard).read_bytes()[:4096]
        assert (folder / shard).stat().st_size == (fixture_repo / shard).stat().st_size
        ranged = [r for m, p, r in srv.log if m == "GET" and p.endswith(shard)]
        assert ranged == ["", f"bytes={20 * 2**20}-"]  # continued from the partial file, not from zero
        assert not list((tmp_path / "cache").rglob("*.incomplete"))


def test_download_that_never_completes_leaves_no_partial_shard(fixture_repo, tmp_path, monkeypatch):
    shard = "model-00002-of-00003.safetensors"
    srv = HubServer([Repo(REPO, fixture_repo, SHA)], cut_after={shard: 5_000_000})
    with srv:
        monkeypatch.setenv("HF_ENDPOINT", srv.url)
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        with pytest.raises(hub.HubError):  # huggingface_hub's retries all stop at byte 5e6
            hub.download(hub.HubRef(REPO, "main"))
        assert not list((tmp_path / "cache").rglob("*.incomplete"))  # nothing half-written kept
        snap = tmp_path / "cache" / f"models--{REPO.replace('/', '--')}" / "snapshots" / SHA
        assert not (snap / shard).exists() and (snap / "config.json").is_file()
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # offline audit: the shard is missing, not complete
        path, reader, _ = open_target(f"hf:{REPO}@main")
        with pytest.raises(IndexShardMissing, match=shard):
            audit_checkpoint(path, reader=reader)


def test_unknown_repo_and_revision(hub_env):
    with pytest.raises(HubRepoNotFound, match="not found"):
        open_target("hf:nobody/nothing")
    with pytest.raises(HubRevisionNotFound, match="no-such-branch"):
        open_target(f"hf:{REPO}@no-such-branch")


def test_gated_repo_says_how_to_log_in(hub_env, monkeypatch, capsys):
    with pytest.raises(HubAccessDenied, match="hf auth login"):
        open_target(f"hf:{GATED}")
    assert cli.main(["audit-checkpoint", f"hf:{GATED}"]) == 2
    assert "HF_TOKEN" in capsys.readouterr().err
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    path, reader, _ = open_target(f"hf:{GATED}")
    assert audit_checkpoint(path, reader=reader).counts["measured"]["total_tensors"] > 0


def test_no_network_names_the_variables(monkeypatch, capsys):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(HubUnreachable, match="HF_ENDPOINT.*HF_HUB_OFFLINE"):
        open_target(f"hf:{REPO}")
    assert cli.main(["audit-checkpoint", f"hf:{REPO}"]) == 2
    err = capsys.readouterr().err
    assert "HubUnreachable" in err and "Traceback" not in err


def test_header_cut_by_the_server(fixture_repo, tmp_path, monkeypatch):
    shard = "model-00001-of-00003.safetensors"
    srv = HubServer([Repo(REPO, fixture_repo, SHA)], cut_after={shard: 1000})
    with srv:
        monkeypatch.setenv("HF_ENDPOINT", srv.url)
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        path, reader, _ = open_target(f"hf:{REPO}")
        with pytest.raises(ShardTruncated, match="cut short"):
            audit_checkpoint(path, reader=reader)


def test_coalesce_merges_neighbours_only():
    spans = coalesce([(100, 104), (0, 8), (104, 108), (10_000, 10_004)], max_gap=16)
    assert [(a, b, sorted(m)) for a, b, m in spans] == [(0, 8, [1]), (100, 108, [0, 2]), (10_000, 10_004, [3])]
    assert len(coalesce([(0, 4), (20, 24)], max_gap=16)) == 1


def test_decode_scalar_matches_numpy():
    for dt, npdt in (("F32", "<f4"), ("F64", "<f8"), ("F16", "<f2")):
        assert decode_scalar(dt, np.array([2688.5], dtype=npdt).tobytes()) == float(np.array([2688.5], dtype=npdt)[0])
    assert decode_scalar("BF16", np.array([3.0], dtype="<f4").tobytes()[2:]) == 3.0
    assert math.isnan(decode_scalar("U8", b"\x01"))


def test_hubref_parse():
    assert hub.HubRef.parse("hf:a/b@v1") == hub.HubRef("a/b", "v1")
    assert hub.HubRef.parse("hf:a/b").revision == "main"
    with pytest.raises(hub.HubError):
        hub.HubRef.parse("hf:nope")

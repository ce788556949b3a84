"""The trained stand-in: its reference model's arithmetic against hand computations, its checkpoint
names against the layout, the artifact's hash check (both sides), the corpus manifest check, the
trainer end to end on a tiny corpus, and the served study's pure parts."""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from nvfp4study.trained import artifact, corpus, reference, served, train


def _silu(x: float) -> float:
    return x / (1 + math.exp(-x))


# --- the reference's arithmetic -------------------------------------------------------------
@pytest.mark.parametrize("g,u,L", [(5.0, 3.0, 4.0), (6.5, -5.0, 4.0), (2.0, 1.0, 4.0), (-3.0, 9.0, 2.0)])
def test_swiglu_forms_against_hand_computation(g, u, L):
    uc = max(-L, min(L, u))
    want = {"exact": min(_silu(g), L) * uc, "approx": _silu(min(g, L)) * uc, "dropped": _silu(g) * u}
    for form, w in want.items():
        got = reference.swiglu(torch.tensor([g], dtype=torch.float64), torch.tensor([u], dtype=torch.float64), L, form)
        assert got.item() == pytest.approx(w, rel=1e-12), form
    # a gate over the limit separates the three forms (what the served arms rely on)
    if _silu(g) > L:
        assert len({round(v, 9) for v in want.values()}) == 3


def test_swiglu_without_limit_is_plain_and_bad_form_is_refused():
    g, u = torch.tensor([7.0]), torch.tensor([9.0])
    assert reference.swiglu(g, u, None, "exact").item() == pytest.approx(_silu(7.0) * 9.0, rel=1e-6)
    with pytest.raises(ValueError, match="routed_clamp"):
        reference.Forms(routed_clamp="post")


def test_rope_rotates_interleaved_pairs():
    x = torch.tensor([[[1.0, 0.0, 0.0, 1.0]]])  # [T=1, heads=1, d=4]
    pos, theta = torch.tensor([3]), 100.0
    got = reference.rope_interleaved(x, pos, theta)[0, 0]
    a0, a1 = 3 * 1.0, 3 * theta ** (-2 / 4)  # angle of pair 0 and pair 1
    want = [math.cos(a0), math.sin(a0), -math.sin(a1), math.cos(a1)]
    assert got.tolist() == pytest.approx(want, abs=1e-6)


def _moe_config(**kw):
    c = {"hidden_size": 4, "num_experts": 4, "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1,
         "routed_scaling_factor": 1.0, "norm_topk_prob": True, "moe_intermediate_size": 2,
         "expert_swiglu_limit_list": [0], "share_expert_swiglu_limit_list": [0],
         "moe_shared_expert_intermediate_size": 2, "num_shared_experts": 1}
    return {**c, **kw}


def test_grouped_topk_routing_against_hand_choice():
    moe = reference.MoE(_moe_config(), 0)
    with torch.no_grad():
        moe.gate.weight.copy_(torch.eye(4))
        moe.expert_bias.copy_(torch.tensor([0.0, 0.0, 0.0, 0.9]))
    x = torch.tensor([[2.0, 1.0, 0.5, 0.0]])
    s = [1 / (1 + math.exp(-v)) for v in (2.0, 1.0, 0.5, 0.0)]
    # groups {0,1} and {2,3}: choice scores s + bias; group score = sum of both (top-2 of 2)
    g0, g1 = s[0] + s[1], s[2] + s[3] + 0.9
    assert g1 > g0  # the bias alone moves the choice to group 1 ...
    w, ids = moe.route(x)
    assert sorted(ids[0].tolist()) == [2, 3]
    # ... but the weights are the unbiased scores, renormalised
    want = {2: s[2] / (s[2] + s[3]), 3: s[3] / (s[2] + s[3])}
    got = dict(zip(ids[0].tolist(), w[0].tolist(), strict=True))
    assert got == pytest.approx(want, rel=1e-6)


def test_moe_forward_sums_weighted_experts_and_shared_and_applies_the_scaling_factor():
    moe = reference.MoE(_moe_config(routed_scaling_factor=2.5), 0)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in (moe.gate.weight, moe.w_gate, moe.w_up, moe.w_down, *moe.shared_experts.parameters()):
            p.copy_(torch.randn_like(p))
    x = torch.randn(1, 3, 4)
    w, ids = moe.route(x.view(-1, 4))
    want = torch.zeros(3, 4)
    for t in range(3):
        for k in range(2):
            e = ids[t, k]
            h = torch.nn.functional.silu(moe.w_gate[e] @ x[0, t]) * (moe.w_up[e] @ x[0, t])
            want[t] += w[t, k] * (moe.w_down[e] @ h)
    shared = moe.shared_experts(x[0])
    for scaling, factor in ((True, 2.5), (False, 1.0)):
        got = moe(x, reference.Forms(routed_scaling=scaling))[0]
        assert torch.allclose(got, factor * want + shared, atol=1e-5), scaling


def test_checkpoint_names_are_the_layouts_and_round_trip():
    from nvfp4study.checkpoint.layout import tensor_specs
    from nvfp4study.checkpoint.served import served_shape

    cfg = json.loads((artifact.ARTIFACT / "config.json").read_text())
    shape = served_shape().model_copy(update={"vocab_size": cfg["vocab_size"]})
    m = reference.BailingReference(cfg)
    m.init_weights(1)
    ck = reference.to_checkpoint(m)
    specs = {n: (tuple(s), d) for n, s, d in tensor_specs(shape)}
    assert {n: (tuple(t.shape), "F32" if t.dtype == torch.float32 else "BF16") for n, t in ck.items()} == specs
    back = reference.from_checkpoint(cfg, ck)
    ids = torch.tensor([[1, 5, 9, 2]])
    with torch.no_grad():
        a, b = m(ids)[0], back(ids)[0]
    assert (a - b).abs().max() < 0.05  # the only change is BF16 rounding of the weights
    del ck["lm_head.weight"]
    with pytest.raises(KeyError, match="lm_head"):
        reference.from_checkpoint(cfg, ck)


# --- the committed artifact -----------------------------------------------------------------
def test_committed_artifact_matches_its_hashes_and_describes_itself():
    sums = artifact.verify()
    assert set(artifact.SERVED_FILES) <= set(sums)
    d = artifact.describe()
    log = json.loads((artifact.ARTIFACT / "train_log.json").read_text())
    assert d["steps"] == log["steps"] and d["device"].startswith("NVIDIA")
    assert d["megabytes"] < 40 and 1e6 < d["parameters"] < 2e7  # "a few tens of MB at most"
    # the clamp as trained is what the model was fitted with: dropping it costs held-out loss
    h = d["held_out"]
    assert h["dropped"]["loss"] > h["exact"]["loss"]


def _copy(tmp_path: Path) -> Path:
    dst = tmp_path / "art"
    shutil.copytree(artifact.ARTIFACT, dst)
    return dst


def test_a_flipped_byte_is_refused_and_nothing_is_served(tmp_path):
    src = _copy(tmp_path)
    f = src / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0x01
    f.write_bytes(bytes(data))
    with pytest.raises(artifact.TrainedArtifactError, match="model.safetensors: sha256"):
        artifact.verify(src)
    with pytest.raises(artifact.TrainedArtifactError):
        artifact.served_copy(tmp_path / "served", src)
    assert not (tmp_path / "served").exists() and not (tmp_path / "served.partial").exists()


def test_missing_sums_file_or_unlisted_weights_are_refused(tmp_path):
    src = _copy(tmp_path)
    sums = (src / "SHA256SUMS").read_text().splitlines()
    (src / "SHA256SUMS").write_text("\n".join(ln for ln in sums if not ln.endswith("model.safetensors")) + "\n")
    with pytest.raises(artifact.TrainedArtifactError, match="does not list model.safetensors"):
        artifact.verify(src, sums_sha256=None)
    with pytest.raises(artifact.TrainedArtifactError, match="not the committed one"):
        artifact.verify(src)
    (src / "SHA256SUMS").unlink()
    with pytest.raises(artifact.TrainedArtifactError, match="missing"):
        artifact.verify(src)


def test_a_file_changed_together_with_its_line_is_refused_by_the_pin(tmp_path):
    src = _copy(tmp_path)
    cfg = json.loads((src / "config.json").read_text())
    cfg["expert_swiglu_limit_list"] = [99] * len(cfg["expert_swiglu_limit_list"])
    (src / "config.json").write_text(json.dumps(cfg))
    new = hashlib.sha256((src / "config.json").read_bytes()).hexdigest()
    lines = [f"{new}  config.json" if ln.endswith("  config.json") else ln
             for ln in (src / "SHA256SUMS").read_text().splitlines()]
    (src / "SHA256SUMS").write_text("\n".join(lines) + "\n")
    assert artifact.verify(src, sums_sha256=None)["config.json"] == new  # consistent with itself ...
    with pytest.raises(artifact.TrainedArtifactError, match="not the committed one"):
        artifact.verify(src)  # ... but not the committed list
    with pytest.raises(artifact.TrainedArtifactError):
        artifact.served_copy(tmp_path / "served", src)
    assert not (tmp_path / "served").exists()


@pytest.mark.parametrize("entry", ["../x", "/etc/hostname", "sub/dir.json"])
def test_listed_names_must_stay_in_the_folder(tmp_path, entry):
    src = _copy(tmp_path)
    with open(src / "SHA256SUMS", "a") as fh:
        fh.write(f"{'0' * 64}  {entry}\n")
    with pytest.raises(artifact.TrainedArtifactError, match="file name in this folder"):
        artifact.verify(src, sums_sha256=None)


def test_a_listed_symlink_is_refused(tmp_path):
    src = _copy(tmp_path)
    target = tmp_path / "outside.json"
    shutil.copy2(src / "tokenizer_config.json", target)
    (src / "tokenizer_config.json").unlink()
    (src / "tokenizer_config.json").symlink_to(target)
    with pytest.raises(artifact.TrainedArtifactError, match="tokenizer_config.json is not a regular file"):
        artifact.verify(src)


def test_served_copy_is_made_once_and_remade_when_tampered(tmp_path):
    dst = artifact.served_copy(tmp_path / "served")
    assert sorted(p.name for p in dst.iterdir()) == sorted(artifact.SERVED_FILES)
    f = dst / "model.safetensors"
    f.write_bytes(b"not the model")
    artifact.served_copy(dst)
    assert hashlib.sha256(f.read_bytes()).hexdigest() == artifact.verify()["model.safetensors"]



def test_served_folder_remakes_the_nvfp4_copy_when_its_source_or_model_changed(tmp_path, monkeypatch):
    """Issue 37, the trained weights' hash check from both sides: the NVFP4-rounded served copy is
    reused only while its record's source_sha256 is the served BF16 model's and its model_sha256
    the file's own; a tampered copy, a record of another source, or no record makes it again.
    (nvfp4_copy is replaced by a stand-in that writes a marked model file and counts its calls.)"""
    calls = []

    def fake_copy(bf16, dst, qparams):
        calls.append(qparams)
        dst.mkdir(parents=True, exist_ok=True)
        (dst / "model.safetensors").write_bytes(b"nvfp4 copy %d" % len(calls))
        return {"quantized": 3, "report": {"counts": {"quantized": 3}}}

    monkeypatch.setattr(artifact, "nvfp4_copy", fake_copy)
    work = lambda name: tmp_path / name  # noqa: E731

    def sha(p: Path) -> str:
        return hashlib.sha256(p.read_bytes()).hexdigest()

    dst = artifact.served_folder(work, "nvfp4", "q")
    rec = json.loads((dst / "nvfp4study_quantize.json").read_text())
    assert dst == tmp_path / "served-trained-nvfp4" and len(calls) == 1
    assert rec == {"quantized": 3, "counts": {"quantized": 3},
                   "source_sha256": artifact.verify()["model.safetensors"],
                   "model_sha256": sha(dst / "model.safetensors")}
    assert artifact.served_folder(work, "nvfp4", "q") == dst and len(calls) == 1  # reused
    (dst / "model.safetensors").write_bytes(b"tampered")
    artifact.served_folder(work, "nvfp4", "q")
    assert len(calls) == 2 and (dst / "model.safetensors").read_bytes() == b"nvfp4 copy 2"
    (dst / "nvfp4study_quantize.json").write_text(json.dumps({**rec, "model_sha256": sha(dst / "model.safetensors"),
                                                              "source_sha256": "0" * 64}))
    artifact.served_folder(work, "nvfp4", "q")
    assert len(calls) == 3
    (dst / "nvfp4study_quantize.json").unlink()
    artifact.served_folder(work, "nvfp4", "q")
    assert len(calls) == 4
    assert artifact.served_folder(work, "bf16", "q") == tmp_path / "served-trained-bf16" and len(calls) == 4
    with pytest.raises(artifact.TrainedArtifactError, match="no trained weights 'fp8'"):
        artifact.served_folder(work, "fp8", "q")

# --- the corpus manifest --------------------------------------------------------------------
def test_manifest_check_names_what_differs(tmp_path, monkeypatch):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    for i in range(3):
        (pkg / f"m{i}.py").write_text(f"x = {i}\n" + "# filler\n" * 100)
    monkeypatch.setattr(corpus, "package_root", lambda name: (pkg, "1.0"))
    tr, held = corpus.collect(("pkg",))
    man = corpus.manifest(tr, held)
    assert corpus.check_manifest(man) == [] and len(man["files"]) == 3
    (pkg / "m1.py").write_text("x = 99\n" + "# filler\n" * 100)
    (pkg / "m2.py").unlink()
    (pkg / "new.py").write_text("y = 1\n" + "# filler\n" * 100)
    problems = corpus.check_manifest(man)
    assert any("m1.py: sha256 differs" in p for p in problems)
    assert any("m2.py: missing" in p for p in problems)
    assert any("new.py: here but not listed" in p for p in problems)
    monkeypatch.setattr(corpus, "package_root", lambda name: (pkg, "2.0"))
    assert any("is 2.0 here, the manifest lists 1.0" in p for p in corpus.check_manifest(man))


def test_committed_manifest_lists_files_with_hashes():
    man = json.loads((artifact.ARTIFACT / "corpus_manifest.json").read_text())
    cfg = json.loads((artifact.ARTIFACT / "config.json").read_text())
    summary = cfg["_nvfp4study"]["corpus"]
    splits = [f[4] for f in man["files"]]
    assert splits.count("train") == summary["files"]["train"] and splits.count("held_out") == summary["files"]["held_out"]
    assert all(len(f[2]) == 64 for f in man["files"]) and set(man["versions"]) == set(man["sources"])


# --- the trainer, end to end on a tiny corpus (CPU) -------------------------------------------
def test_fit_trains_writes_layout_weights_and_checks_the_corpus_hash(tmp_path):
    out = tmp_path / "art"
    out.mkdir()
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy2(artifact.ARTIFACT / f, out / f)
    rng = np.random.default_rng(0)
    ids = {"train": rng.integers(0, 1000, 4000).astype(np.uint16), "held_out": rng.integers(0, 1000, 400).astype(np.uint16)}
    np.savez_compressed(out / "corpus.npz", **ids, held_out_bytes=np.array(1000))
    cfg = json.loads((out / "config.json").read_text())
    cfg["_nvfp4study"]["corpus"]["ids_sha256"] = {k: corpus.ids_sha256(v) for k, v in ids.items()}
    (out / "config.json").write_text(json.dumps(cfg))
    log = train.fit(out, steps=2, batch=2, seq=16, device="cpu", log_every=1)
    assert [c["step"] for c in log["curve"]] == [0, 1] and all(math.isfinite(c["loss"]) for c in log["curve"])
    assert set(log["held_out"]) >= {"exact", "approx", "dropped", "routed_clamp_binds"}
    got = artifact.verify(out, sums_sha256=None)  # SHA256SUMS written over the files present
    assert "model.safetensors" in got and "train_log.json" in got
    # a packed corpus that is not the one the config names is refused before training
    np.savez_compressed(out / "corpus.npz", train=ids["train"][::-1].copy(), held_out=ids["held_out"],
                        held_out_bytes=np.array(1000))
    with pytest.raises(corpus.CorpusError, match="train ids sha256"):
        train.fit(out, steps=1, batch=1, seq=8, device="cpu")


def test_learning_rate_schedule():
    assert train._lr(0, 1000) == pytest.approx(train.LR / train.WARMUP)
    assert train._lr(train.WARMUP, 1000) == pytest.approx(train.LR)
    assert train._lr(1000, 1000) == pytest.approx(train.LR * train.FINAL_LR_SHARE)


# --- the served study's pure parts ----------------------------------------------------------
def test_arms_put_the_reference_first_and_the_null_control_last():
    from nvfp4study.core.params import load_params

    a = served.arms(load_params(None))
    assert a[0].key == served.REFERENCE_KEY and a[-1].key == served.NULL_KEY
    assert {x.key for x in a[1:-1]} == {"released-bf16", "approx-bf16", "released-nvfp4", "approx-nvfp4", "exact-nvfp4"}


def test_the_arms_are_planned_for_the_one_collector_and_the_reference_shares_06s_launch():
    """05's plan on the default (CPU engine) profile lists one item per arm in serving order; the
    reference arm's configuration is 06/07's speculation-off one on the trained stand-in (one
    launch for both), the null control a configuration of its own."""
    from nvfp4study.core.params import load_params
    from nvfp4study.serving import plans
    from nvfp4study.stages import s06_mtp

    p = load_params(None)
    items = [i for i in plans.plan_of(p, "05_corruption") if i.what.startswith("05 trained")]
    assert [i.what.split("arm ")[1] for i in items] == [
        "exact-bf16", "exact-nvfp4", "exact-bf16-again", "released-bf16", "released-nvfp4", "approx-bf16",
        "approx-nvfp4"]  # by clamp form (one install state loads together), the reference's first
    ref, again = items[0].config, items[2].config
    assert ref in [c for _, _, c in s06_mtp.sweep_configs(p) if c.spec_depth is None]
    assert again.key == ref.key + "-instance=again" and again != ref
    assert [r.key for r in items[0].requests][:2] == ["trained/exact-bf16/HumanEval/0", "trained/exact-bf16/HumanEval/1"]
    assert len(items[0].requests) == p.server.cpu.trained.prompts
    assert all(not r.wants_warmup and r.max_tokens == p.server.cpu.trained.max_new_tokens for r in items[0].requests)


def test_assemble_reads_the_arms_rows_and_launches_back(tmp_path):
    """The raw rows the collector appended (extras stripped, the last "ok" row per task) and each
    arm's launch (by the launch number its rows carry) in launch order; a missing answer and
    answers from other weights are named errors."""
    from nvfp4study.core.jsonl import append_jsonl
    from nvfp4study.core.params import load_params
    from nvfp4study.core.paths import RunPaths
    from nvfp4study.core.stage import Stage
    from nvfp4study.serving.records import launch_path

    p = load_params(None, ["server.cpu.trained.prompts=2", "server.cpu.trained.weights=[bf16]",
                           "server.cpu.trained.clamps=[released, exact]"])
    stage = Stage(name="05_corruption", params=p, paths=RunPaths(tmp_path))
    ids = ["HumanEval/0", "HumanEval/1"]
    for k, arm in enumerate(served.arms(p)):  # exact-bf16, released-bf16, exact-bf16-again
        f = served.raw_path(stage.paths, arm.key)
        for i in ids:
            row = {"arm": arm.key, "clamp": arm.clamp, "weights": arm.weights, "task_id": i,
                   "completion": f"{arm.key} {i}", "output_ids": [k, 1], "finish_reason": "stop"}
            if i == ids[0]:  # a failed try first: ignored
                append_jsonl(f, {**row, "status": "error", "launch": 1})
            append_jsonl(f, {**row, "request_key": f"trained/{arm.key}/{i}", "status": "ok", "launch": 2,
                             "config_key": "x", "elapsed_s": 0.25, "model_sha256": "abc"})
        cfg = served.server_config(p, arm)
        for n in (1, 2):
            append_jsonl(launch_path(stage.paths, cfg), {"launch": n, "config_key": cfg.key, "load_s": 10.0 * n,
                                                         "log": f"logs/{arm.key}-{n}.log", "model_path": "m"})
    data = served.assemble(stage, model_sha256="abc")
    assert [(r["arm"], r["task_id"]) for r in data["rows"]] == [
        (a, i) for a in ("exact-bf16", "exact-bf16-again", "released-bf16") for i in ids]
    assert list(data["rows"][0]) == ["arm", "clamp", "weights", "task_id", "completion", "output_ids", "finish_reason"]
    assert [(x["arm"], x["load_s"], x["requests_s"], x["log"]) for x in data["launches"]] == [
        ("exact-bf16", 20.0, 0.5, "logs/exact-bf16-2.log"), ("exact-bf16-again", 20.0, 0.5, "logs/exact-bf16-again-2.log"),
        ("released-bf16", 20.0, 0.5, "logs/released-bf16-2.log")]
    assert data["launches"][1]["config_key"].endswith("-instance=again")
    assert json.loads(stage.paths.data("trained_corruption").read_text())["rows"] == data["rows"]
    with pytest.raises(served.TrainedStudyError, match="other trained weights"):
        served.assemble(stage, model_sha256="def")
    f = served.raw_path(stage.paths, "released-bf16")
    f.write_text("".join(ln + "\n" for ln in f.read_text().splitlines()[:-1]))  # HumanEval/1 lost
    with pytest.raises(served.TrainedStudyError, match="released-bf16: no answer recorded for 1 task"):
        served.assemble(stage, model_sha256="abc")


def test_complete_lines_only_trims_answers_cut_by_the_token_limit():
    assert served.complete_lines("a = 1\nb = fo", "length") == "a = 1\n"
    assert served.complete_lines("a = 1\nb = fo", "stop") == "a = 1\nb = fo"
    assert served.complete_lines("no newline at all", "length") == ""


@pytest.mark.parametrize("k,n", [(0, 10), (3, 10), (10, 10), (1, 16)])
def test_summary_intervals_are_wilson_by_its_formula(k, n):
    z = 1.959964
    p = k / n
    c = (p + z * z / (2 * n)) / (1 + z * z / n)
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    rows = [{"arm": "a", "clamp": "exact", "weights": "bf16", "code": False, "same_as_reference": i < k,
             "reference_logprob_mean": None} for i in range(n)]
    lo, hi = served.summarize(rows)[0]["same_as_reference_ci"]
    assert (lo, hi) == pytest.approx((max(0, c - h), min(1, c + h)), abs=1e-3)  # rounded to 3 places
    assert lo <= p <= hi


def test_classify_and_summarize_count_each_outcome():
    from nvfp4study.codeeval.tasks import humaneval_tasks

    t = humaneval_tasks()[0]
    good = "return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])\n"
    rows = [
        {"arm": "exact-bf16", "clamp": "exact", "weights": "bf16", "task_id": t.task_id, "completion": good,
         "output_ids": [1, 2], "finish_reason": "stop", "reference_logprob_mean": -0.5},
        {"arm": "released-bf16", "clamp": "released", "weights": "bf16", "task_id": t.task_id,
         "completion": "return numbers[[[\n", "output_ids": [1, 3], "finish_reason": "stop", "reference_logprob_mean": -0.9},
    ]
    out = served.classify({"rows": rows}, run_code=False)
    assert [o["parses"] for o in out] == [True, False] and [o["same_as_reference"] for o in out] == [True, False]
    s = {x["arm"]: x for x in served.summarize(out)}
    assert s["exact-bf16"]["parses"] == 1 and s["released-bf16"]["parses"] == 0
    assert s["released-bf16"]["reference_logprob_mean"] == -0.9 and "passed" not in s["exact-bf16"]


# --- the findings' rules, from both sides ------------------------------------------------------
def _arm(key, same, lp, n=10):
    from nvfp4study.codeeval.served_analysis import wilson_interval

    lo, hi = wilson_interval(same, n)
    return {"arm": key, "requests": n, "same_as_reference": same, "same_as_reference_ci": [lo, hi],
            "reference_logprob_mean": lp, "parses": 0, "junk": n}


def _measure(**arms):
    from nvfp4study.stages.claim_rules import r05_corruption as r5

    base = {"exact-bf16": _arm("exact-bf16", 10, -0.50), "exact-bf16-again": _arm("exact-bf16-again", 10, -0.50)}
    base.update({k.replace("_", "-"): v for k, v in arms.items()})
    return r5.TrainedMeasurements(base, artifact.describe(), [], "engine")


def test_before_after_rule_both_sides():
    from nvfp4study.core.ledger import Verdict
    from nvfp4study.stages.claim_rules import r05_corruption as r5

    assert r5.trained_before_after(_measure(released_bf16=_arm("released-bf16", 2, -0.56))).verdict is Verdict.REPRODUCED
    # dropping changes outputs but makes the trained form's tokens MORE likely: contradicted
    assert r5.trained_before_after(_measure(released_bf16=_arm("released-bf16", 2, -0.40))).verdict is Verdict.CONTRADICTED
    # dropping changes nothing: contradicted
    assert r5.trained_before_after(_measure(released_bf16=_arm("released-bf16", 10, -0.50))).verdict is Verdict.CONTRADICTED
    # a null control that moved: the difference cannot be read
    m = _measure(released_bf16=_arm("released-bf16", 2, -0.56))
    m.arms["exact-bf16-again"] = _arm("exact-bf16-again", 9, -0.50)
    row = r5.trained_before_after(m)
    assert row.verdict is Verdict.NOT_RUN and "null control failed" in row.note
    assert r5.trained_before_after(r5.TrainedMeasurements({}, {}, [], "")) is None


def test_weights_vs_clamp_and_approx_rules_both_sides():
    from nvfp4study.core.ledger import Verdict
    from nvfp4study.stages.claim_rules import r05_corruption as r5

    drop = _arm("released-bf16", 1, -0.56)
    assert r5.trained_weights_vs_clamp(_measure(released_bf16=drop, exact_nvfp4=_arm("exact-nvfp4", 2, -0.51))
                                       ).verdict is Verdict.REPRODUCED
    assert r5.trained_weights_vs_clamp(_measure(released_bf16=drop, exact_nvfp4=_arm("exact-nvfp4", 2, -0.60))
                                       ).verdict is Verdict.CONTRADICTED
    assert r5.trained_approx_gap(_measure(released_bf16=drop, approx_bf16=_arm("approx-bf16", 6, -0.50))
                                 ).verdict is Verdict.REPRODUCED
    # approx keeping fewer continuations than dropping: contradicted even with a small logprob gap
    assert r5.trained_approx_gap(_measure(released_bf16=drop, approx_bf16=_arm("approx-bf16", 0, -0.50))
                                 ).verdict is Verdict.CONTRADICTED
    assert r5.trained_approx_gap(_measure(released_bf16=drop)).verdict is Verdict.NOT_RUN


def test_trained_acceptance_rule_both_sides():
    from nvfp4study.core.ledger import Verdict
    from nvfp4study.stages.claim_rules import r06_mtp as r6

    def m(rates, lens, model="trained-bf16"):
        spread = {f"k={d}": {"accept_rate": {r6.TRAINED_ESTIMATOR: r}, "accept_len": {r6.TRAINED_ESTIMATOR: n}}
                  for d, (r, n) in enumerate(zip(rates, lens, strict=True), start=1)}
        return r6.CpuMtpMeasurements([], None, spread, [], [], "engine", sweep_model=model)

    assert r6.mtp_trained_acceptance(m([0.5, 0.3, 0.2], [1.6, 1.7, 1.7])).verdict is Verdict.REPRODUCED
    assert r6.mtp_trained_acceptance(m([0.5, 0.5, 0.2], [1.6, 2.0, 1.7])).verdict is Verdict.CONTRADICTED
    assert r6.mtp_trained_acceptance(m([0.5], [1.6])).verdict is Verdict.NOT_RUN
    assert r6.mtp_trained_acceptance(m([0.5, 0.3], [1.6, 1.7], model="study")) is None


def test_free_ports_lie_below_the_ephemeral_range_and_are_free():
    import socket

    from nvfp4study.serving import server

    lo, _ = server._ephemeral_range()
    ports = {server.free_port("127.0.0.1") for _ in range(20)}
    assert all(p < lo for p in ports)
    for p in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))  # nothing listens there
    server._PORTS_HELD.add(("127.0.0.1", min(ports)))
    try:
        assert all(server.free_port("127.0.0.1") != min(ports) for _ in range(50))
    finally:
        server._PORTS_HELD.discard(("127.0.0.1", min(ports)))

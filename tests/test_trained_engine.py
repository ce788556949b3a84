"""The trained stand-in on SGLang 0.5.23's REAL engine (marker ``real_engine``): the engine's
teacher-forced token logprobs agree with the project's PyTorch reference (what the trained model
is) on text it was not trained on, for the released native MoE path (routed clamp dropped) and
for the study's exact patch (Ling's post-SiLU form). A missing ``.venv-sglang`` FAILS.

Tolerance, stated: the mean absolute difference per token at most :data:`MEAN_TOL` nats and the
largest at most :data:`MAX_TOL`. Both sides compute in float32 from the same BF16 weights; what
is left is summation order (measured on this machine: mean 0.009, largest 0.04 over 300 tokens).
The wrong form differs by far more (mean 0.27 nats with the clamp form swapped), so the test
separates the forms as well as it checks the arithmetic.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from cpu_engine_fixtures import require_sglang_env
from nvfp4study.codeeval.tasks import humaneval_tasks
from nvfp4study.serving import client, server
from nvfp4study.serving.launch_env import standin_path
from nvfp4study.trained.reference import Forms, from_checkpoint
from real_engine_fixtures import engine_stage
from serving_fixtures import free_port

pytestmark = pytest.mark.real_engine
MEAN_TOL, MAX_TOL = 0.02, 0.15
#: what the reference computes for each native MoE mode of the engine
FORMS = {"released": Forms(routed_clamp="dropped"), "exact": Forms(routed_clamp="exact")}


def _reference_logprobs(folder, ids: list[int], forms: Forms) -> list[float]:
    cfg = json.loads((folder / "config.json").read_text())
    model = from_checkpoint(cfg, load_file(str(folder / "model.safetensors"))).eval()
    with torch.no_grad():
        logits, _ = model(torch.tensor([ids]), forms)
    lp = torch.log_softmax(logits[0], -1)
    return [lp[i, ids[i + 1]].item() for i in range(len(ids) - 1)]


def test_engine_logprobs_agree_with_the_reference(tmp_path):
    from tokenizers import Tokenizer

    require_sglang_env()
    stage = engine_stage(tmp_path, free_port())
    folder = standin_path(stage, "trained-bf16")
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    ids = tok.encode("".join(t.prompt for t in humaneval_tasks()[:3])).ids[:300]
    diffs = {}
    for mode, forms in FORMS.items():
        config = server.ServerConfig(clamp="exact", spec_depth=None, model_label="trained-bf16",
                                     native=(("moe_clamp", mode),))
        with server.serving(stage, config) as url:
            got = client.generate(url, ids, max_new_tokens=1, logprob_start_len=0)["input_token_logprobs"][1:]
        want = _reference_logprobs(folder, ids, forms)
        assert len(got) == len(want) == len(ids) - 1
        d = [abs(a - b) for a, b in zip(got, want, strict=True)]
        diffs[mode] = (sum(d) / len(d), max(d))
        # the other form is far off: the check tells the forms apart
        other = _reference_logprobs(folder, ids, FORMS["exact" if mode == "released" else "released"])
        assert sum(abs(a - b) for a, b in zip(got, other, strict=True)) / len(d) > 5 * MEAN_TOL, mode
    for mode, (mean, top) in diffs.items():
        assert mean <= MEAN_TOL and top <= MAX_TOL, (mode, mean, top)

"""What a first real run on the card's machine class meets between stages, without a GPU: the
checkpoint 01 records is the one 04-07 serve."""

from __future__ import annotations

from nvfp4study.core.params import REPO_ROOT, load_params
from nvfp4study.core.paths import RunPaths
from nvfp4study.core.stage import Stage
from nvfp4study.serving.server import card_config, served_model_path
from nvfp4study.stages import s01_quantize

LING = REPO_ROOT / "params" / "ling3-flash.yaml"


def test_the_checkpoint_01_records_is_served(tmp_path):
    """ling3-flash.yaml sets no server.model_path: 04-07 serve what 01 wrote in data/quantize.json
    (its ``quantized`` key), which is what 02 audits too."""
    p = load_params(LING, overlay=False)
    assert p.server.model_path is None
    paths = RunPaths(tmp_path / "run")
    q = str(tmp_path / "run" / "work" / s01_quantize.QUANTIZED_DIR)
    s01_quantize.run_quantize(p, paths, {"action": "skip", "source": None, "quantized": q, "reason": "test"}, {})
    stage = Stage(name="04_launch_server", params=p, paths=paths)
    assert served_model_path(stage, card_config(p)) == q

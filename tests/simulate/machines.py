"""Stand-in machines for the simulated first runs (test code only; the study never imports it).

A machine class is a folder of stand-ins put first on PATH and named in the params:

- ``nvidia-smi``: prints the class's recorded answers (``tests/nvidia_smi/<class>``, sources in
  its SOURCES.md);
- ``nvcc``: prints ``nvcc --version`` of a CUDA 13.0 toolkit (what FlashInfer's JIT finds);
- ``docker`` (the Docker route): ``tests/fake_docker.py``;
- the SGLang interpreter ``server.python``: ``tests/fake_sglang.py``, a GPU SGLang 0.5.23 server
  stand-in (SGLang's HTTP API, its GPU log lines) that reports the class's GPU to preflight's
  probe and, as SGLang 0.5.23 does on Hopper, would refuse the NVFP4 MoE scheme at load on a 9.x
  GPU (the study's own GPU check stops before any launch there);
- the Hub (``tests/hub_server.py``) serving a small header-only checkpoint in the card's layout
  as the card's repo.

:data:`SIMULATED_ENV` carries a sentence naming them into the run: the study writes it into
``environment.json``, every ledger row and the report (``core/environment.py``
:func:`simulated`), so nothing of a simulated run reads as a measurement.
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))

import fake_docker  # noqa: E402
import fake_sglang  # noqa: E402
from nvfp4study.core.environment import SIMULATED_ENV  # noqa: E402
from nvfp4study.core.params import LingShape  # noqa: E402

SMI = TESTS / "nvidia_smi"
MiB = 2**20
CARD_REPO = "kingjones777/Ling-3.0-flash-NVFP4-SGLang-MTP"
CARD_SHA = "5a" * 20
IMAGE = "lmsysorg/sglang:v0.5.23"

#: the card checkpoint's stand-in: Ling's layout at toy sizes (42 -> 3 layers; the MTP layer and
#: the clamp lists follow the layout's rules)
SHAPE = LingShape(
    vocab_size=16384, hidden_size=1024, intermediate_size=1024, num_hidden_layers=3,
    num_attention_heads=8, num_key_value_heads=8, head_dim=128, layer_group_size=3,
    num_experts=16, num_experts_per_tok=2, n_group=2, topk_group=1,
    moe_intermediate_size=512, moe_shared_expert_intermediate_size=512, first_k_dense_replace=1,
    expert_swiglu_limits={1: 4.0, 2: 4.0}, share_expert_swiglu_limits={1: 5.0, 2: 7.0},
)


@dataclass
class MachineClass:
    """One class: its recorded ``nvidia-smi`` folder, the GPU torch reports (capability, name,
    bytes), how its run is launched and why."""

    name: str
    capability: tuple[int, int]
    gpu_name: str
    total_bytes: int
    launcher: str = "local"
    overrides: list[str] = field(default_factory=list)
    skip_preflight: bool = False
    why: str = ""


def recorded_gpu(name: str) -> tuple[tuple[int, int], str, float | None]:
    """(capability, name, total MiB or None) of the class's recorded ``--query-gpu`` line."""
    cols = [c.strip() for c in (SMI / name / "query-gpu.csv").read_text().splitlines()[0].split(",")]
    major, minor = cols[2].split(".")
    total = None if cols[3].startswith("[") else float(cols[3])
    return (int(major), int(minor)), cols[1], total


def machine(name: str, **kw) -> MachineClass:
    cap, gpu, total = recorded_gpu(name)
    # GB10: torch's total is the unified memory (128 GB-class; nvidia-smi prints [N/A])
    return MachineClass(name, cap, gpu, int((total or 128_000) * MiB), **kw)


CLASSES = {
    "gb10": machine("gb10", why="the card's own class (DGX Spark, unified memory), local SGLang",
                    # preflight sizes GB10's pool from THIS host's available memory (as SGLang
                    # does); the CI host is no 128 GB machine, so its blocker is real and named
                    skip_preflight=True),
    "b200": machine("b200", launcher="docker", why="the README's Docker route (no local SGLang)"),
    "rtx-pro-6000": machine("rtx-pro-6000", overrides=["server.mem_fraction_static=0.88"],
                            why="96 GB: preflight's memory blocker at 0.75, fixed as its row says"),
    "h200": machine("h200", skip_preflight=True,
                    why="Hopper: preflight refuses it by name; with --skip-preflight the study launches no "
                        "server (the interpreter's GPU probe) and 04-07 say why"),
}


def write_bin(folder: Path, cls: MachineClass, python: Path) -> Path:
    """``folder/bin`` with ``nvidia-smi``, ``nvcc`` and (docker route) ``docker`` stand-ins."""
    b = folder / "bin"
    b.mkdir(parents=True, exist_ok=True)
    rec = SMI / cls.name
    (b / "nvidia-smi").write_text("#!/bin/sh\ncase \"$1\" in\n"
                                  f"  --query-gpu=*) cat '{rec / 'query-gpu.csv'}' ;;\n"
                                  f"  --query-compute-apps=*) cat '{rec / 'query-apps.csv'}' ;;\n"
                                  f"  *) cat '{rec / 'plain.txt'}' ;;\nesac\n")
    # nvcc --version of the CUDA 13.0 toolkit (the line FlashInfer's get_cuda_version reads)
    (b / "nvcc").write_text("#!/bin/sh\necho 'nvcc: NVIDIA (R) Cuda compiler driver'\n"
                            "echo 'Cuda compilation tools, release 13.0, V13.0.88'\n")
    for f in ("nvidia-smi", "nvcc"):
        (b / f).chmod(0o755)
    if cls.launcher == "docker":  # the image holds the released wheel's files (hash-checked by the study)
        site = folder / "image-site"
        installed_sglang(site)
        fake_docker.make_docker(b, python=python, images=(IMAGE,), image_tree=site)
    return b


def card_repo(folder: Path) -> Path:
    """The card repo's stand-in: a header-only NVFP4 checkpoint in the card's layout (config
    without the generator's marker, as the card's files are) and a README."""
    from nvfp4study.checkpoint.generate import write_checkpoint

    if folder.is_dir():
        return folder
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    write_checkpoint(SHAPE, tmp, shards=2, header_only=True, layout="nvfp4")
    cfg = json.loads((tmp / "config.json").read_text())
    cfg.pop("_nvfp4study", None)
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
    (tmp / "README.md").write_text("# simulated card repo (tests/simulate): not the card's weights\n")
    tmp.rename(folder)
    return folder


def installed_sglang(folder: Path, version: str = "0.5.23") -> Path:
    """SGLang ``version`` as pip installs it: the released wheel's ``sglang/`` and dist-info
    unpacked into ``folder`` (a site-packages; the wheel is downloaded once into the study's
    cache). Returns the package's ``__init__.py`` (what ``find_spec('sglang').origin`` says)."""
    import zipfile

    from nvfp4study.sglang.source import wheel_path

    with zipfile.ZipFile(wheel_path(version)) as z:
        z.extractall(folder, [n for n in z.namelist() if n.startswith(("sglang/", f"sglang-{version}.dist-info/"))])
    return folder / "sglang" / "__init__.py"


def interpreter(folder: Path, cls: MachineClass, origin: Path | None, request_log: Path) -> Path:
    """The SGLang interpreter stand-in for ``cls`` (``fake_sglang``), with SGLang 0.5.23's pins
    as its packages so preflight's package check passes as on a ``make workstation-envs`` env."""
    from nvfp4study.workstation import probes

    pins, _ = probes.sglang_pins("0.5.23")
    packages = {n: s.lstrip("=<>~!").split(",")[0] for n, s in pins.items()}
    return fake_sglang.make_interpreter(
        folder, gpu=[*cls.capability, cls.gpu_name, cls.total_bytes], packages=packages,
        clamp_form="install" if origin else "exact", sglang_origin=str(origin) if origin else None,
        die_during_load=cls.capability[0] < 10, step_s=0.0002, prefill_s=0.001, request_log=str(request_log),
        listen_delay_s=0.05, starting_s=0.1, replies=[{"mode": None, "match": None, "content": ANSWER}])


#: every chat answer of the stand-in: a fenced program, so 05's extraction, sandbox and tests run
#: (it solves no task: the stand-in is no model)
ANSWER = "Here is the code.\n\n```python\ndef solve(*args):\n    return None\n```\n"


def description(cls: MachineClass) -> str:
    """The sentence :data:`SIMULATED_ENV` carries (what stood in for what)."""
    route = "the Docker CLI (tests/fake_docker.py), " if cls.launcher == "docker" else ""
    return (f"simulated {cls.name} first run: nvidia-smi prints recorded {cls.name} answers "
            f"(tests/nvidia_smi/{cls.name}), {route}SGLang is a GPU server stand-in (tests/fake_sglang.py), "
            "the Hub a local server (tests/hub_server.py) with a toy card checkpoint (random, header-only); "
            "no value is a measurement")


__all__ = ["CLASSES", "CARD_REPO", "CARD_SHA", "IMAGE", "SIMULATED_ENV", "MachineClass", "card_repo",
           "description", "interpreter", "write_bin"]

"""What a launch on SGLang's real CPU engine adds to the study's one serving path
(:func:`nvfp4study.serving.server.serving`), and the per-launch records every engine keeps.

- ``server.engine``: :func:`~nvfp4study.serving.strategies.serves_standin`; ``server.python`` resolved from the repo root
  (:func:`server_python`); the engine's description (:func:`engine_description`, from
  :mod:`nvfp4study.serving.cpu_engine`).
- The served stand-in (:func:`standin_path`: :func:`nvfp4study.checkpoint.served.write_served_checkpoint`
  into the run's ``work/``), the patched overlay of the install (:func:`install_overlay`) and the
  server's environment (:func:`server_env`).
- Per launch: the process tree while healthy (:func:`process_tree`) and one row in
  ``data/serve-lifecycle.jsonl`` (:func:`lifecycle_row`, read back by :func:`lifecycle`).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from ..core.errors import StageInputMissing
from ..core.jsonl import append_jsonl, read_jsonl
from ..core.params import REPO_ROOT, Params
from ..core.stage import Stage
from .process import ServerProcess
from .strategies import serves_standin

#: model labels of the CPU engine's control stand-ins -> ``write_served_checkpoint(draft=...)``.
CONTROL_LABELS = {"agree": "agree-draft", "disagree": "broken-draft"}
STANDIN_DRAFTS = {"study": "random", **{v: k for k, v in CONTROL_LABELS.items()}}
#: the trained stand-in's labels -> its weights (:mod:`nvfp4study.trained.artifact`).
TRAINED_LABELS = {"trained-bf16": "bf16", "trained-nvfp4": "nvfp4"}
#: what the CPU engine serves where the trained stand-in is served, said wherever its results show.
TRAINED_STANDIN_NOTE = ("served stand-in: the project's trained BF16 all-MLA model in Ling's layout "
                        "(docs/trained-standin.md), not the NVFP4 hybrid checkpoint of 01-03")


def trained_sweep(params: Params) -> dict[str, Any]:
    """``ServerConfig`` fields of 06's depth sweep and 07's launches on the CPU engine: the trained
    stand-in as trained (BF16, Ling's exact clamp on the native MoE path) when
    ``server.cpu.trained.enabled``, so the two stages share launches; ``{}`` otherwise (the card's
    checkpoint on a GPU, the random stand-in on the CPU)."""
    from .strategies import serves_standin

    if serves_standin(params) and params.server.cpu.trained.enabled:
        return {"model_label": "trained-bf16", "native": (("moe_clamp", "exact"),)}
    return {}


def sweep_note(params: Params) -> str:
    """:data:`TRAINED_STANDIN_NOTE` where :func:`trained_sweep` serves the trained stand-in, else
    :data:`STANDIN_NOTE`."""
    return TRAINED_STANDIN_NOTE if trained_sweep(params) else STANDIN_NOTE
#: model labels of 04's clamp probe -> ``write_served_checkpoint(clamp_probe=(probe, limit))``
#: (the "study" weights; only the clamp lists differ: :func:`nvfp4study.checkpoint.served.probe_shape`).
#: "off-again" is a second launch of the "off" checkpoint: the null control (two launches of one
#: model must give the same outputs, or a difference says nothing about the clamp).
#: "scaling-factor" / "scaling-weights": the routed-scaling probe, the "off" model with
#: routed_scaling_factor or the routed experts' down_proj x ``server.cpu.scaling_probe_ratio``
#: (:data:`~nvfp4study.checkpoint.served.SCALING_PROBES`); "off-again" is its null control too.
PROBE_LABELS = {"off": "clamp-probe-off", "routed": "clamp-probe-routed", "shared": "clamp-probe-shared",
                "off-again": "clamp-probe-off-again", "scaling-factor": "scaling-probe-factor",
                "scaling-weights": "scaling-probe-weights"}


def probe_checkpoint(key: str) -> str:
    """The clamp probe (:data:`~nvfp4study.checkpoint.served.CLAMP_PROBES`) a :data:`PROBE_LABELS`
    key serves: itself, except "off-again" and the scaling probes, which serve "off"'s lists."""
    return "off" if key.startswith("scaling-") else key.removesuffix("-again")

#: what the CPU engine serves, said wherever its results show.
STANDIN_NOTE = ("served stand-in: BF16 all-MLA random-weight model in Ling's layout, not the NVFP4 "
                "hybrid checkpoint of 01-03")


def server_python(params: Params) -> str | None:
    """``server.python`` with a relative path (one holding ``/``) resolved against the repo root
    (notebooks run in ``notebooks/``; tracked params never name an absolute path); a bare name
    (``python3``) is left for ``PATH``; None when unset."""
    py = params.server.python
    if not py or "/" not in py or Path(py).expanduser().is_absolute():
        return str(Path(py).expanduser()) if py and "/" in py else py
    return str(REPO_ROOT / py)


def engine_description(params: Params) -> dict[str, Any] | None:
    """The CPU engine's :func:`nvfp4study.serving.cpu_engine.describe` plus its ``summary`` and
    the served stand-in's note; None for the GPU engine."""
    if not serves_standin(params):
        return None
    from . import cpu_engine

    return {**cpu_engine.describe(), "summary": cpu_engine.summary(), "served_model": STANDIN_NOTE}



def standin_path(stage: Stage, label: str = "study") -> Path:
    """The CPU engine's served stand-in for a model label, written once into the run's work folder
    (``work/served-<draft>``) by :func:`nvfp4study.checkpoint.served.write_served_checkpoint`
    with the profile's ``checkpoint.shape`` and ``server.cpu.standin_seed``; label "study" is the
    random-weight model, "agree-draft" / "broken-draft" the draft constructions "agree" /
    "disagree", and the labels of :data:`PROBE_LABELS` the random-weight model with the clamp
    probe's lists (``server.cpu.clamp_probe_limit``; folder ``work/served-clamp-probe-<probe>``,
    one per :func:`probe_checkpoint`; the scaling probes ``work/served-scaling-probe-<kind>``, with
    ``server.cpu.scaling_probe_ratio``).

    The labels of :data:`TRAINED_LABELS` are the committed trained stand-in, hash-checked, as
    trained or with NVFP4-rounded experts (:func:`nvfp4study.trained.artifact.served_folder`).

    Raises:
        StageInputMissing: an unknown label.
        TrainedArtifactError: the trained stand-in's files differ from their hashes.
    """
    if label in TRAINED_LABELS:
        from ..trained.artifact import served_folder

        return served_folder(stage.paths.work, TRAINED_LABELS[label], stage.params.quantize)
    probes = {v: k for k, v in PROBE_LABELS.items()}
    if label not in STANDIN_DRAFTS and label not in probes:
        raise StageInputMissing(f"no stand-in for model label {label!r} "
                                f"(known: {', '.join([*STANDIN_DRAFTS, *TRAINED_LABELS, *probes])})")
    from ..checkpoint.served import write_served_checkpoint

    cpu = stage.params.server.cpu
    draft = STANDIN_DRAFTS.get(label, "random")
    probe = (probe_checkpoint(probes[label]), cpu.clamp_probe_limit) if label in probes else None
    scaling = probes.get(label, "").removeprefix("scaling-")
    scaling = (scaling, cpu.scaling_probe_ratio) if probes.get(label, "").startswith("scaling-") else None
    out = stage.paths.work(f"served-{draft}" if probe is None else f"served-clamp-probe-{probe[0]}"
                           if scaling is None else f"served-scaling-probe-{scaling[0]}")
    if not (out / "config.json").is_file():
        write_served_checkpoint(out, stage.params.checkpoint.shape, seed=cpu.standin_seed, draft=draft,
                                clamp_probe=probe, scaling_probe=scaling)
    return out


def install_overlay(stage: Stage) -> Path:
    """A private copy of the ``sglang`` package ``server.python`` imports, in the run's
    ``work/sglang-install/`` (made once per run): every file hard-linked (copied where linking
    fails), except the files any patch mode of the release edits, which are real copies, so
    patching the overlay never writes through to the environment. Returns the folder that holds
    ``sglang/`` (put first on the server's ``PYTHONPATH``).

    Raises:
        SGLangNotInstalled: ``server.python`` has no importable sglang.
    """
    import os
    import shutil

    from ..sglang import patch as sglang_patch
    from ..sglang import source as sglang_source

    root = stage.paths.work("sglang-install")
    if (root / "sglang" / "__init__.py").is_file():
        return root
    src = sglang_source.installed_tree(server_python(stage.params))
    tmp = root.with_name(root.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)

    def link(a: str, b: str) -> None:
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)

    # The install's bytecode comes along (hard-linked): with PYTHONDONTWRITEBYTECODE set, as on
    # the project's machines, an overlay without it made every server process compile SGLang's
    # ~4,700 modules again (about 6 s of CPU per process, three processes per launch).
    shutil.copytree(src.root / "sglang", tmp / "sglang", copy_function=link)
    edited = {e["path"] for m in sglang_patch.modes_for(src.version) if m != "stock"
              for e in sglang_patch._files(src.version, m)}
    for rel in edited:
        f = tmp / rel
        if f.is_file():
            data = f.read_bytes()
            f.unlink()
            f.write_bytes(data)
            for pyc in (f.parent / "__pycache__").glob(f"{f.stem}.*.pyc"):  # stale once patched
                pyc.unlink()
    tmp.rename(root)
    return root


def server_env(stage: Stage, install_root: Path | None) -> dict[str, str]:
    """The server's extra environment: ``server.env``; on the CPU engine
    :func:`nvfp4study.serving.cpu_engine.engine_env` of it, with the patched overlay
    (``install_root``) first on ``PYTHONPATH``."""
    s = stage.params.server
    if not serves_standin(stage.params):
        return dict(s.env)
    import os

    from . import cpu_engine

    env = cpu_engine.engine_env(dict(s.env))
    if install_root is not None:
        env["PYTHONPATH"] = os.pathsep.join(x for x in (str(install_root), env.get("PYTHONPATH", "")) if x)
    return env


def process_tree(sp: ServerProcess) -> list[dict[str, Any]]:
    """The live processes of a launch (:meth:`ServerProcess.group_members`): pid, parent pid,
    process name (SGLang titles its children ``sglang::scheduler`` etc. with ``setproctitle``)
    and resident memory in MB (1e6 bytes)."""
    import psutil

    rows = []
    for p in sorted(sp.group_members(), key=lambda p: p.pid):
        with contextlib.suppress(psutil.Error):
            cmd = p.cmdline()
            rows.append({"pid": p.pid, "ppid": p.ppid(), "name": p.name(),
                         "title": " ".join(cmd[:1]) if cmd else "", "rss_mb": round(p.memory_info().rss / 1e6, 1)})
    return rows


LIFECYCLE_STEM = "serve-lifecycle"


def lifecycle_row(stage: Stage, rec: dict[str, Any]) -> None:
    """Append one row per launch, whichever stage made it, to ``data/serve-lifecycle.jsonl``:
    stage, configuration, log, launch-to-healthy seconds (None: never healthy), the process
    names seen while healthy, the processes left after :meth:`ServerProcess.stop` (pids and
    names) and the exit status."""
    row = {"stage": stage.name, "config_key": rec.get("config_key"), "clamp": (rec.get("config") or {}).get("clamp"),
           "log": rec.get("log"), "load_s": rec.get("load_s"),
           "processes": [p["name"] for p in rec.get("process_tree") or []],
           "left_after_stop": rec.get("left_after_stop") or [], "returncode": rec.get("returncode"),
           "engine": str(stage.params.server.engine)}
    append_jsonl(stage.paths.data(LIFECYCLE_STEM, "jsonl"), row)


def lifecycle(stage: Stage) -> list[dict[str, Any]]:
    """The rows :func:`serving` appended to ``data/serve-lifecycle.jsonl`` (every launch of the run)."""
    path = stage.paths.data(LIFECYCLE_STEM, "jsonl")
    if not path.is_file():
        return []
    return read_jsonl(path)

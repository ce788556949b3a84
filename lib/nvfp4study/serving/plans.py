"""What each stage serves: the stages' serving plans, read in one place.

A serving stage declares what it serves in its own module, as ``serving_plan(params) -> list[Served]``:
one :class:`Served` per server configuration, with the requests the stage asks that server and how
the launch is treated. Nothing in the serving wing lists a stage's configurations or requests;
adding a configuration to a stage is one more item in that stage's ``serving_plan``
(``tests/test_serving_plans.py`` adds one in a temporary stage and runs it against the fake server).

How the plans are read (:func:`stage_plans`): every module ``sNN_*`` of :mod:`nvfp4study.stages`
that defines a top-level ``serving_plan`` (seen in its source, so modules that serve nothing are not
imported) is imported by name and asked, in module order (the notebooks' order). This is the one
place a wing reaches a stage, and it does so by name at run time, as a plugin lookup: the stages
are the plans' owners, and the serving wing (:func:`nvfp4study.serving.measure.collect`) and
``nvfp4study plan`` (:mod:`nvfp4study.workstation.plan`) need every stage's plan, not only the
running notebook's, because a launch is shared by every stage that serves its configuration
(:func:`needs`).
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from ..core.params import Params
from .records import ServedRequest
from .server import ServerConfig

#: the package whose ``sNN_*`` modules are asked for their plans.
STAGES_PACKAGE = "nvfp4study.stages"
_STAGE_MODULE = re.compile(r"s\d\d_\w+")


@dataclass(frozen=True)
class Served:
    """One server configuration a stage serves.

    - ``requests``: what the stage asks this server (:class:`~nvfp4study.serving.records.ServedRequest`:
      04/06/07's timed chat requests, 05's corruption and probe requests, the trained arms'); the
      one collector (:func:`nvfp4study.serving.measure.collect`) sends every stage's requests of
      a configuration on one launch.
    - ``launch_measured``: the launch itself is measured (04): launched even when nothing is left
      to ask, until one launch came up.
    - ``replay_requests``: a replay copies the recorded requests' files too (False: launch records only).
    - ``replay_launch``: a replay copies the launch records too (False: 05's, whose analysis reads
      only its request files, and whose runs recorded before the one collector have none).
    - ``replay_optional``: a recorded run may lack this configuration (a replay skips it).
    - ``refusable``: SGLang may refuse the launch; the refusal is recorded, the stage goes on.
    - ``what``: what the launch is for, in words (``nvfp4study plan``'s reason; empty: "needed by"
      the stages that serve it).
    """

    config: ServerConfig
    requests: tuple[ServedRequest, ...] = ()
    launch_measured: bool = False
    replay_requests: bool = True
    replay_launch: bool = True
    replay_optional: bool = False
    refusable: bool = False
    what: str = ""


#: the function a serving stage defines.
PLAN_FUNCTION = "serving_plan"


def _defines_plan(path: Path) -> bool:
    """Whether the module source at ``path`` defines a top-level function :data:`PLAN_FUNCTION`."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return any(isinstance(n, ast.FunctionDef) and n.name == PLAN_FUNCTION for n in tree.body)


@cache
def planning_modules() -> tuple[str, ...]:
    """Dotted names of the stage modules that define :data:`PLAN_FUNCTION`, in module order (cached; a test
    that adds a stage clears it with ``planning_modules.cache_clear()``)."""
    pkg = importlib.import_module(STAGES_PACKAGE)
    out = []
    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda i: i.name):
        src = Path(getattr(info.module_finder, "path", "")) / f"{info.name}.py"
        if _STAGE_MODULE.fullmatch(info.name) and src.is_file() and _defines_plan(src):
            out.append(f"{STAGES_PACKAGE}.{info.name}")
    return tuple(out)


def stage_plans(params: Params) -> dict[str, list[Served]]:
    """``{notebook name: that stage's serving_plan(params)}`` for every stage that serves, in notebook order."""
    out: dict[str, list[Served]] = {}
    for name in planning_modules():
        mod = importlib.import_module(name)
        out[mod.NOTEBOOK] = list(getattr(mod, PLAN_FUNCTION)(params))
    return out


def stage_configs(params: Params) -> dict[str, list[ServerConfig]]:
    """``{notebook name: its configurations}`` in each stage's launch order (:func:`stage_plans`)."""
    return {name: [s.config for s in items] for name, items in stage_plans(params).items()}


def plan_of(params: Params, notebook: str) -> list[Served]:
    """One stage's plan (empty when it serves nothing)."""
    return stage_plans(params).get(notebook, [])


def needs(params: Params, config: ServerConfig,
          plans: dict[str, list[Served]] | None = None) -> list[ServedRequest]:
    """Every request any stage asks ``config``'s server, each once, in sending order (the stages'
    order, then each plan's own); ``plans``: :func:`stage_plans` of ``params`` when already read."""
    out: dict[str, ServedRequest] = {}
    for items in (plans if plans is not None else stage_plans(params)).values():
        for s in items:
            if s.config == config:
                out.update((r.key, r) for r in s.requests)
    return list(out.values())


def plan_servers(params: Params) -> list[ServerConfig]:
    """Every distinct configuration the stages serve, each once, grouped by clamp mode (so the
    serving install is re-patched as rarely as possible), then checkpoint, determinism, reasoning
    parser override, instance, depth."""
    seen: dict[ServerConfig, None] = {}
    for configs in stage_configs(params).values():
        for c in configs:
            seen.setdefault(c, None)
    clamp_order = {m: i for i, m in enumerate(dict.fromkeys(
        [params.server.clamp_mode, *params.corruption.clamp_modes]))}
    return sorted(seen, key=lambda c: (clamp_order.get(c.clamp, 99), c.model_label != "study",
                                       c.model_label, c.deterministic, c.reasoning_parser or "", c.instance,
                                       -1 if c.spec_depth is None else c.spec_depth))


def plan_table(params: Params):
    """A DataFrame: one row per planned configuration, the stages that use it and its flags."""
    import pandas as pd

    from .server import _config_flags

    users = stage_configs(params)
    rows = []
    for c in plan_servers(params):
        rows.append({"config": c.key, "stages": ", ".join(s for s, cs in users.items() if c in cs),
                     "flags": " ".join(_config_flags(params, c)) or "(card's base flags only)"})
    return pd.DataFrame(rows)

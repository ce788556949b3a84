"""What each (engine, launcher) pair does differently, in one place: the serving strategies.

``server.engine`` (:class:`~nvfp4study.core.kinds.Engine`) and ``server.launcher``
(:class:`~nvfp4study.core.kinds.LauncherKind`) are two axes; params admit only the pairs of
:data:`nvfp4study.core.kinds.SUPPORTED`, and :data:`STRATEGIES` holds one
:class:`ServingStrategy` per pair (a test checks the keys agree). The rest of the serving wing and
the stages ask the run's strategy (:func:`strategy_for`) what to do, never test the engine or
launcher names themselves (``tests/test_architecture.py`` greps for such tests outside this
module and the plan modules).

What differs:

- ``launch``: which :data:`nvfp4study.serving.launchers.LAUNCHERS` class starts the server
  (a local process group, the local one on the CPU engine's patched overlay, or a container);
- ``standin``: the CPU engine serves the stand-in of :mod:`nvfp4study.checkpoint.served`, never
  the card's NVFP4 checkpoint, so the card's rows of 04-07 stay "not run" and the stages record
  their stand-in findings instead; it needs no GPU;
- ``in_image``: SGLang comes from ``server.docker.image`` (the GPU probe runs in the image, no
  ``server.python`` is needed, the patched files are mounted at launch);
- ``settles_card_claims``: whether a live run can settle the card's rows of 04-07 (the card's
  checkpoint served on a GPU); where it cannot (the stand-in), each stage's one
  ``record_claims`` records those rows "not run" and its stand-in findings instead.

Adding a pair: one :class:`~nvfp4study.core.kinds.SUPPORTED` entry, one :data:`STRATEGIES` entry,
and its launcher class if it needs a new one.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.kinds import Engine, LauncherKind
from ..core.params import Params


@dataclass(frozen=True)
class ServingStrategy:
    """How one (engine, launcher) pair serves (module docstring, "What differs")."""

    engine: Engine
    launcher: LauncherKind
    launch: str  # key of launchers.LAUNCHERS: the class that starts the server
    standin: bool  # serves the CPU engine's stand-in, never the card's checkpoint; needs no GPU
    in_image: bool  # SGLang runs from server.docker.image, not server.python

    @property
    def settles_card_claims(self) -> bool:
        """Whether a live run of this pair can settle the card's rows of 04-07: only one serving
        the card's checkpoint (not the stand-in)."""
        return not self.standin

    @property
    def key(self) -> tuple[Engine, LauncherKind]:
        """``(engine, launcher)``: this strategy's key in :data:`STRATEGIES`."""
        return (self.engine, self.launcher)


STRATEGIES: dict[tuple[Engine, LauncherKind], ServingStrategy] = {s.key: s for s in (
    ServingStrategy(Engine.GPU, LauncherKind.LOCAL, launch="local", standin=False, in_image=False),
    ServingStrategy(Engine.GPU, LauncherKind.DOCKER, launch="docker", standin=False, in_image=True),
    ServingStrategy(Engine.CPU, LauncherKind.LOCAL, launch="cpu-engine", standin=True, in_image=False),
)}


def strategy_for(params: Params) -> ServingStrategy:
    """The strategy of ``params.server``'s (engine, launcher) pair. Params refuse an unsupported
    pair when they are loaded, so every validated params object has one."""
    return STRATEGIES[(params.server.engine, params.server.launcher)]


def serves_standin(params: Params) -> bool:
    """Whether the run serves the CPU engine's stand-in (``server.engine: cpu``): SGLang's real
    engine on this CPU (``serving/cpu_engine``), never the card's checkpoint."""
    return strategy_for(params).standin


def in_image(params: Params) -> bool:
    """Whether SGLang runs from ``server.docker.image`` (``server.launcher: docker``)."""
    return strategy_for(params).in_image

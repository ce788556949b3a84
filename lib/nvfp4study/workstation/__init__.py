"""The workstation front door: what a user runs before and around a long GPU run.

Preflight checks the machine against the params, the plan lists every server launch with its
requests and an estimated time, and ``run`` puts preflight in front of the study's runner.
"""

__all__ = [
    "bound",
    "checks",
    "envs",
    "plan",
    "preflight",
    "preflight_gpu",
    "probes",
    "run",
]

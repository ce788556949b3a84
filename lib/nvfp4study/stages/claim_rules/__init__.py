"""The claim rules of the stages: one function per ledger row, registered by decorator.

Each ``rNN_*`` module holds the rules of stage ``sNN_*`` and the measurements type they read
(:mod:`nvfp4study.core.claim_rules` is the registry); a stage module imports its own rules module
only, and a rules module imports no stage. Importing a module registers its rules (the package
itself imports none, so a stage loads only its own).
"""

__all__ = ["r01_quantize", "r02_inspect", "r03_sglang", "r04_launch", "r05_corruption", "r06_mtp", "r07_determinism"]

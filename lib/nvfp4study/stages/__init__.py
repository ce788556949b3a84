"""One module per notebook (``sNN_*`` serves ``notebooks/NN_*``), the only thing it imports.

A stage opens its run (``open_stage``), calls the wings, records its ledger rows and shows
tables and figures. Stages import wings and core, never each other; wings never import stages.
"""

__all__ = [
    "claim_rules",
    "s00_environment",
    "s01_quantize",
    "s02_inspect",
    "s03_sglang",
    "s04_launch",
    "s05_corruption",
    "s06_mtp",
    "s07_determinism",
    "s99_report",
]

"""The study's spine, imported by every other part and importing none of them.

Params (validated YAML), run folders and their file names, atomic writes, the claims ledger,
named errors, the ``Stage`` context a notebook opens, machine probes and the papermill runner.
"""

__all__ = [
    "bytecode",
    "claim_rules",
    "display",
    "environment",
    "errors",
    "files",
    "hub",
    "jsonl",
    "kinds",
    "ledger",
    "params",
    "params_keys",
    "params_yaml",
    "paths",
    "progress",
    "runlock",
    "runner",
    "shape_rules",
    "stage",
]

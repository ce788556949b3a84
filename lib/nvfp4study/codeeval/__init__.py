"""Generated code, judged: extraction, junk detection, sandboxed execution, their validation.

HumanEval and card tasks, markdown code extraction, the junk-token detector, the bubblewrap
sandbox, the detector's recall on injected junk (``detector_*``), and the served corruption study's
raw data, live collection, analysis and display (``served_*``).
"""

__all__ = [
    "bounds",
    "card_problems",
    "detect",
    "detector_samples",
    "detector_scores",
    "detector_validation",
    "extract",
    "findings",
    "isolation",
    "junk",
    "program",
    "recovery",
    "sandbox",
    "served_analysis",
    "served_collect",
    "served_data",
    "served_display",
    "task_cap",
    "tasks",
    "token_scan",
    "undefined",
    "watchdog",
]

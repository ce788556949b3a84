"""Generated code, judged: extraction, junk detection, sandboxed execution, their validation.

HumanEval and card tasks, markdown code extraction, the junk-token detector, the bubblewrap
sandbox, the detector's recall on injected junk, and the served corruption study's analysis.
"""

__all__ = [
    "card_problems",
    "corruption",
    "detect",
    "extract",
    "findings",
    "isolation",
    "junk",
    "program",
    "recovery",
    "sandbox",
    "tasks",
    "token_scan",
    "undefined",
    "validation",
    "watchdog",
]

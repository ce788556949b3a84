"""The report's words: a ledger turned into sentences, readable values and card-following sections.

Headline findings generated from ledger data (also the README's findings section), values
rendered as text and small tables instead of JSON, and the sections and figure captions of report.html.
"""
__all__ = [
    "findings",
    "readable",
    "sections",
]

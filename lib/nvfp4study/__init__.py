"""nvfp4study: a reproducibility study of the Ling-3.0-flash NVFP4 / SGLang / MTP model card.

Notebooks under ``notebooks/`` call this package; every result is a file under
``outputs/<run-id>/``. See README.md.
"""

__version__ = "0.1.0"

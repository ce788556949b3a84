"""A running SGLang server and the requests the study sends it.

The launch command, the process lifecycle (health, log capture, teardown), the OpenAI-compatible
HTTP client that keeps raw records, and request sessions with per-request metrics.
"""

__all__ = [
    "acceptance",
    "client",
    "decode_log",
    "docker",
    "measure",
    "process",
    "serve_cli",
    "server",
    "transport",
]

"""A running SGLang server and the requests the study sends it.

The launch command, the process lifecycle (health, log capture, teardown), the OpenAI-compatible
HTTP client that keeps raw records, what each launch is asked and where its answers are recorded
(``records``), and request sessions with per-request metrics; ``strategies``: what each
(engine, launcher) pair does differently; ``plans``: the stages' own serving plans, read in one place; ``sglang_log``: the one reader of
SGLang's server log;
``cpu_engine``: SGLang's real engine on a CPU (stand-in kernels, in-memory patches, flags);
``forkserver``: its servers forked from one preloaded interpreter per launching process.
"""

__all__ = [
    "acceptance",
    "client",
    "cpu_engine",
    "decode_log",
    "docker",
    "forkserver",
    "gpu_probe",
    "known_acceptance",
    "launch_env",
    "launchers",
    "measure",
    "plans",
    "process",
    "records",
    "request_numbers",
    "serve_cli",
    "server",
    "sglang_log",
    "strategies",
    "transport",
]

"""``nvfp4study`` command line: a thin table of subcommands over the library.

Each subcommand lives in the module that does the work, as ``main(argv) -> int``; heavy imports
happen only when that command runs.

Exit statuses (README, "Bad input"): 0 success; 1 the command's own negative result (e.g.
``audit-checkpoint`` found a finding of severity error); 2 a usage error or a named
:class:`~nvfp4study.core.errors.StudyError` (one line on stderr); 3 an internal error (an
unexpected exception: one line and "please report", the traceback only with
``NVFP4STUDY_DEBUG=1``); 130 interrupted (SIGINT), 143 terminated (SIGTERM, where a command
handles it).
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from pathlib import Path

from .core.errors import StudyError

#: exit statuses shared by every command (module docstring).
EXIT_OK, EXIT_FINDING, EXIT_INPUT, EXIT_INTERNAL = 0, 1, 2, 3

# command -> (module, one-line help with an example)
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("nvfp4study.workstation.run", "preflight, then the study's notebooks: nvfp4study run --params params/default.yaml"),
    "preflight": ("nvfp4study.workstation.preflight", "check GPU, disk, interpreters, port before a run: nvfp4study preflight --params params/ling3-flash.yaml"),
    "plan": ("nvfp4study.workstation.plan", "server launches, requests and estimated time: nvfp4study plan --params params/ling3-flash.yaml"),
    "decode-log": ("nvfp4study.serving.decode_log", "parse SGLang's Decode batch log lines: nvfp4study decode-log LOG --json"),
    "make-checkpoint": ("nvfp4study.checkpoint.generate", "write a Ling-layout BF16 checkpoint: nvfp4study make-checkpoint OUT"),
    "make-served-checkpoint": ("nvfp4study.checkpoint.served", "write the all-MLA BF16 checkpoint with MTP that SGLang serves on a CPU: nvfp4study make-served-checkpoint OUT --draft agree"),
    "quantize": ("nvfp4study.checkpoint.quantize", "NVFP4-quantize a checkpoint: nvfp4study quantize SRC DST"),
    "audit-checkpoint": ("nvfp4study.checkpoint.audit", "audit a checkpoint from its headers: nvfp4study audit-checkpoint PATH --json"),
    "audit-sglang": ("nvfp4study.sglang.audit_report", "audit SGLang's clamp plumbing: nvfp4study audit-sglang --version 0.5.23"),
    "patch": ("nvfp4study.sglang.patch", "patch SGLang's clamp: nvfp4study patch apply --mode exact --sglang PATH"),
    "detect": ("nvfp4study.codeeval.detect", "classify code for junk tokens: nvfp4study detect --json FILE..."),
    "findings": ("nvfp4study.report.findings", "README findings from a run's ledger: nvfp4study findings outputs/latest --write"),
    "serve": ("nvfp4study.serving.serve_cli", "start SGLang with the study's flags: nvfp4study serve --params params/ling3-flash.yaml"),
}


def _usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: nvfp4study COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "`nvfp4study COMMAND --help` shows a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``nvfp4study`` script. Returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"nvfp4study: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    try:
        module = importlib.import_module(COMMANDS[name][0])
        rc = int(module.main(rest) or 0)
        sys.stdout.flush()  # a closed pipe shows here, inside the handler, not at exit
        return rc
    except BrokenPipeError:
        # The reader went away (``... | head -1``): stop quietly, as a SIGPIPE'd tool does.
        # stdout is pointed at /dev/null so the interpreter's final flush cannot raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    except StudyError as exc:
        print(f"nvfp4study {name}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_INPUT
    except KeyboardInterrupt:
        print(f"nvfp4study {name}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug of ours, not a finding: its own status, never mistaken for 1
        if os.environ.get("NVFP4STUDY_DEBUG") == "1":
            traceback.print_exc()
        where = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
        at = f" at {Path(where.filename).name}:{where.lineno}" if where else ""
        text = " ".join(str(exc).split())[:300]
        print(f"nvfp4study {name}: internal error {type(exc).__name__}{at}: {text} -- please report "
              "(NVFP4STUDY_DEBUG=1 shows the traceback)", file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())

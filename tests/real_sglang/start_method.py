"""Prints the multiprocessing start method SGLang 0.5.23's launch leaves, with the CPU engine's boot
hook (``serving/cpu_engine/site/sitecustomize.py``) and with SGLang's own function alone.

Run with the SGLang venv's python and ``cpu_engine.engine_env()``; argv[1] is a checkpoint folder.
Prints ``START <patched> <unpatched>`` (``fork spawn`` when the speed patch is in place).
"""

import multiprocessing
import sys


def start_methods(ckpt: str) -> tuple[str, str]:
    """(start method after the patched ``_set_envs_and_config``, after SGLang's own function)."""
    from sglang.srt.entrypoints import engine
    from sglang.srt.server_args import ServerArgs

    args = ServerArgs(model_path=ckpt, device="cpu")
    engine._set_envs_and_config(args)
    patched = multiprocessing.get_start_method()
    unpatched = getattr(engine._set_envs_and_config, "__wrapped__", engine._set_envs_and_config)
    unpatched(args)
    return patched, multiprocessing.get_start_method()


if __name__ == "__main__":
    print("START", *start_methods(sys.argv[1]))

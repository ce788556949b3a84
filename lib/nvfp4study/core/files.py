"""Atomic file writes: a file is either its old self or wholly new, never half-written.

Every JSON, YAML and HTML file the study writes goes through :func:`atomic_write`, so an
interrupted run never leaves a truncated file that a later notebook would read as complete.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def atomic_write(path: Path, write: Callable[[Path], None]) -> Path:
    """Write ``path`` all at once: ``write(tmp)`` fills a temporary file in the same folder, which
    is then renamed over ``path`` (mode 0644). On error the temporary file is removed and
    ``path`` is left as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(name)
    try:
        write(tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_json(path: Path, data: Any, *, indent: int = 1, sort_keys: bool = False) -> Path:
    """Atomically write ``data`` as JSON (non-JSON values via ``str``). Returns the path."""
    text = json.dumps(data, indent=indent, sort_keys=sort_keys, default=str)
    return atomic_write(path, lambda tmp: tmp.write_text(text))

"""Named errors of the study. Every library failure a user can cause is one of these.

The CLI turns a :class:`StudyError` into one line on stderr and exit status 2.
Each stage keeps its errors in its own section below.
"""

from __future__ import annotations


class StudyError(Exception):
    """Base class: a failure the user can act on (bad input, missing file, refused state)."""


# --- harness: params, runs, ledger (issue 2) ---------------------------------------------
class ParamsError(StudyError):
    """The params file is missing, unreadable, or fails validation (names the key and file)."""


class RunDirError(StudyError):
    """The outputs folder or run folder cannot be created or written."""


class NotebookFailed(StudyError):
    """A notebook raised or timed out; carries the notebook, cell index and error."""

    def __init__(self, notebook: str, cell: int | None, ename: str, evalue: str):
        self.notebook, self.cell, self.ename, self.evalue = notebook, cell, ename, evalue
        where = f"cell {cell} (executed notebook)" if cell is not None else "kernel"
        super().__init__(f"{notebook} failed at {where}: {ename}: {evalue}")


class LedgerError(StudyError):
    """An unknown claim id, an invalid verdict, or a ledger file that is not the study's."""


class StageInputMissing(StudyError):
    """A stage needs a file an earlier stage writes, and it is not in the run folder."""


# --- checkpoint: generate, quantize, audit (issue 3) -----------------------------------------
class CheckpointFileError(StudyError):
    """A checkpoint file the audit reads is unusable; ``path`` names the file."""

    def __init__(self, path: object, message: str):
        self.path = str(path)
        super().__init__(f"{self.path}: {message}")


class ShardTruncated(CheckpointFileError):
    """A safetensors shard ends before its 8-byte header length or before a tensor's data."""


class HeaderLengthBeyondFile(CheckpointFileError):
    """A shard's header length (first 8 bytes, little-endian u64) points past the file's end."""


class HeaderJSONInvalid(CheckpointFileError):
    """A shard's header is not valid UTF-8 JSON of the safetensors form (or has bad offsets)."""


class UnknownDtype(CheckpointFileError):
    """A header names a dtype that safetensors does not define."""


class IndexShardMissing(CheckpointFileError):
    """``model.safetensors.index.json`` names a shard file that is not in the folder."""


class IndexTensorMissing(CheckpointFileError):
    """The index maps a tensor to a shard whose header does not contain it."""


class CheckpointConfigError(CheckpointFileError):
    """``config.json`` is missing or not a JSON object."""


class QuantizationConfigMissing(CheckpointFileError):
    """``config.json`` has no ``quantization_config``: not a quantized checkpoint."""



# --- sglang: source trees, audit, patches (issue 4) -------------------------------------------


# --- corruption: tasks, extraction, detection, sandbox (issue 5) ------------------------------


# --- serving: lifecycle, client, MTP, determinism (issue 6) ----------------------------------

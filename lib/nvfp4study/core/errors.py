"""Named errors of the study. Every library failure a user can cause is one of these.

The CLI turns a :class:`StudyError` into one line on stderr and exit status 2; any other
exception into one line, "please report", and exit status 3 (README, "Bad input").
Each stage keeps its errors in its own section below.
"""

from __future__ import annotations


class StudyError(Exception):
    """Base class: a failure the user can act on (bad input, missing file, refused state)."""


# --- harness: params, runs, ledger ---------------------------------------------
class ParamsError(StudyError):
    """The params file is missing, unreadable, or fails validation (names the key and file)."""


class ResultParamsChanged(ParamsError):
    """A run folder is continued with params whose result keys differ from the ones it was run
    with (names each key with its old and new value); operational keys may change
    (:data:`nvfp4study.core.params_keys.OPERATIONAL_KEYS`)."""


class RunDirError(StudyError):
    """The outputs folder or run folder cannot be created or written."""


class RunLocked(RunDirError):
    """Another ``nvfp4study run`` holds the run folder's lock (names the folder and its pid)."""


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


class JsonlError(StudyError):
    """A JSONL data file has a complete line that is not a JSON object (names the file and line);
    only a last line cut by a crash is dropped instead (:mod:`nvfp4study.core.jsonl`)."""


# --- checkpoint: generate, quantize, audit -----------------------------------------
# generator, quantizer, round trip (checkpoint/layout.py, quantize.py, roundtrip.py)
class LayoutError(StudyError):
    """A Ling shape that cannot be built or quantized (e.g. experts not divisible by n_group)."""


class ShapeInvalid(ParamsError, LayoutError):
    """A Ling shape that breaks a rule of the layout, NVFP4 or SGLang 0.5.23's BailingMoeV3 model
    (e.g. ``num_hidden_layers`` not a multiple of ``layer_group_size``); names every broken rule.
    Raised by :class:`~nvfp4study.core.params.LingShape` itself, so it is both a params error and a
    layout error."""


class ServedCheckpointError(LayoutError):
    """Bad input to the served-checkpoint writer (an unknown draft construction, a shape without
    exactly one MTP layer); nothing was written."""


class OutputExists(StudyError):
    """The output folder of a generator/quantizer already exists (names it); nothing written."""


class SourceCheckpointMissing(StudyError):
    """The source checkpoint folder, its config.json, its shards or a tensor is missing."""


class OutputNotWritable(StudyError):
    """The quantizer's output folder (or its parent) cannot be created or written; nothing written."""


class QuantizeFailed(StudyError):
    """llmcompressor's model_free_ptq (or the serving rewrite) raised; names the source and error."""


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


class HeaderTooLarge(HeaderJSONInvalid):
    """A shard's header is longer than safetensors' own limit (100,000,000 bytes); not parsed."""


class HeaderTooDeep(HeaderJSONInvalid):
    """A shard's header JSON nests deeper than any safetensors header can (checked before parsing)."""


class UnknownDtype(CheckpointFileError):
    """A header names a dtype that safetensors does not define."""


class IndexInvalid(CheckpointFileError):
    """``model.safetensors.index.json`` is not JSON, too large or deep, or a field has the wrong type
    (e.g. a ``weight_map`` value that is not a shard file name)."""


class IndexShardMissing(CheckpointFileError):
    """``model.safetensors.index.json`` names a shard file that is not in the folder."""


class IndexTensorMissing(CheckpointFileError):
    """The index maps a tensor to a shard whose header does not contain it."""


class CheckpointConfigError(CheckpointFileError):
    """``config.json`` is missing or not a JSON object."""


class ConfigFieldInvalid(CheckpointConfigError):
    """A ``config.json`` / ``quantization_config`` field has the wrong type or range (names the field)."""


class QuantizationConfigMissing(CheckpointFileError):
    """``config.json`` has no ``quantization_config``: not a quantized checkpoint."""



# --- the Hugging Face Hub: sources, remote audit, the card's files (core/hub.py) ------------
class HubError(StudyError):
    """A Hub repository or file could not be reached, resolved or read; names the repo and what to do."""


class HubRepoNotFound(HubError):
    """The Hub answered 404 for the repository (wrong name, or private and no token sent)."""


class HubRevisionNotFound(HubError):
    """The repository exists but the branch, tag or commit does not."""


class HubFileNotFound(HubError):
    """The repository and revision exist but a file the study needs is not in it."""


class HubAccessDenied(HubError):
    """401/403: a gated or private repository; the message says how to log in."""


class HubUnreachable(HubError):
    """No connection to ``HF_ENDPOINT`` (network down, wrong endpoint); suggests HF_HUB_OFFLINE=1."""


class HubNotCached(HubError):
    """Offline (``HF_HUB_OFFLINE=1``) and the revision or a file is not in the local cache."""


class HubRangeError(HubError):
    """The server answered a byte-range request with the wrong status or too few bytes."""


# --- sglang: source trees, audit, patches -------------------------------------------
class SGLangSourceError(StudyError):
    """An SGLang source tree cannot be obtained (download, unpack or lookup failed)."""


class NotAnSGLangTree(SGLangSourceError):
    """A folder given as an SGLang tree has no ``sglang/srt/layers/moe`` package (names the folder)."""


class SGLangNotInstalled(SGLangSourceError):
    """``--installed`` was asked for, but the interpreter has no importable ``sglang``."""


class AuditError(StudyError):
    """The clamp audit cannot parse a file it needs, or was given an unknown option."""


class NoBailingMoeV3(AuditError):
    """The SGLang release has no ``models/bailing_moe_v3.py``: Ling-3.0-flash does not load there,
    so no clamp path can be judged."""


class HandReadingsError(AuditError):
    """``sglang/data/hand_readings.yaml`` lacks a field, repeats a (release, path), or gives a
    verdict outside its own definitions (names the reading)."""


class KernelEvidenceError(AuditError):
    """The stored GPU measurement of the clamp forms is missing, malformed or does not decide a form."""


class PatchError(StudyError):
    """Base of every refusal of ``nvfp4study patch``; when raised, no file was changed."""


class UnknownPatchVersion(PatchError):
    """The tree's SGLang version has no patch set (names the version and the ones that exist)."""


class UnknownPatchMode(PatchError):
    """The mode is not one of the patch set's modes for this version."""


class PatchConflict(PatchError):
    """A target file matches neither its released original nor the requested patch
    (it changed since the patch was made, or another mode is applied)."""


class PatchTargetReadOnly(PatchError):
    """A file or folder the patch must write is not writable (e.g. a read-only site-packages)."""


class PatchStateError(PatchError):
    """The recorded patch state (``sglang_patch_state.json``) disagrees with the tree."""


class CardPatchError(StudyError):
    """The card's published patch files cannot be read (none found, folder missing)."""


class CardPatchNotUnifiedDiff(CardPatchError):
    """A file among the card's patches is not a unified diff (no ``---``/``+++``/``@@`` hunk)."""


# --- corruption: tasks, extraction, detection, sandbox ------------------------------
class CompletionFormatError(StudyError):
    """A completion record is not a chat message (no ``content``/``reasoning_content``/``choices``)."""


class DetectInputError(StudyError):
    """``nvfp4study detect`` was given a file it cannot read (missing, a folder, unreadable)."""


class DetectorValidationError(StudyError):
    """The detector validation cannot run: no tasks with canonical solutions, or bad settings."""


class TaskSelectionError(StudyError):
    """The task selection is invalid: a HumanEval count outside 0..164, or an unknown task id."""


class SandboxUnavailable(StudyError):
    """``sandbox.isolation: bwrap`` was required but bubblewrap is missing or cannot run here."""


class RawDataError(StudyError):
    """A recorded corruption JSONL file is unreadable or holds a row that is not a request record."""


# --- serving: lifecycle, client, MTP, determinism ----------------------------------
class ServerError(StudyError):
    """A failure of the SGLang server or of a request to it; ``log_tail`` holds the server log's
    last lines (errors first) when a log exists, and ``log`` its path."""

    def __init__(self, message: str, *, log: object = None, log_tail: str = ""):
        self.log = None if log is None else str(log)
        self.log_tail = log_tail
        text = message
        if self.log:
            text += f" (log: {self.log})"
        if log_tail:
            text += "\n--- server log, last lines ---\n" + log_tail
        super().__init__(text)


class WrongInterpreter(ServerError):
    """``server.python`` is missing, not executable, has no ``sglang``, or the wrong version."""


class DockerUnavailable(ServerError):
    """``server.launcher: docker`` cannot launch: no ``docker`` CLI, no daemon, no image, or the
    image's SGLang is not the one the params want."""


class ImageFilesDiffer(DockerUnavailable):
    """The image's copy of a file the study mounts a patched copy over is not the released
    wheel's file of the image's SGLang version (sha256 differs, or the image lacks it): mounting
    would replace edits the study never audited."""


class PortInUse(ServerError):
    """Something already listens on the server's host:port (checked before launch)."""


class NoCapableGPU(ServerError):
    """No GPU of compute capability >= 10.0 (SGLang's NVFP4 W4A4 MoE path needs Blackwell)."""


class ServerExitedDuringLoad(ServerError):
    """The server process exited before ``/health_generate`` answered 200."""


class HealthTimeout(ServerError):
    """``/health_generate`` never answered 200 within the startup timeout."""


class ServerDied(ServerError):
    """The server process exited while the study was sending it requests."""


class ResponseMissingFields(ServerError):
    """A response lacks a field the study needs (content, finish_reason, usage, spec details)."""


class StreamCut(ServerError):
    """A streamed response ended before its ``data: [DONE]`` (connection closed or truncated)."""


class RequestFailed(ServerError):
    """A request got an HTTP error status, an error chunk, a timeout or no connection."""


class ReplayDataMissing(StageInputMissing):
    """``replay_from`` names a run whose recorded raw files for this stage are missing."""

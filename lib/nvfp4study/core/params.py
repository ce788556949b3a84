"""Study parameters: one YAML file per profile under ``params/``, validated before any notebook.

Every section is a pydantic model with ``extra="forbid"``: a typo in a key is a
:class:`~nvfp4study.core.errors.ParamsError` naming the key, the file and the closest valid name.
``-p a.b=value`` overrides are applied to the raw YAML before validation; the value is parsed
as a YAML scalar (``-p quantize.device=cuda``, ``-p mtp.depths=[0,2]``).
"""

from __future__ import annotations

import difflib
import hashlib
import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .errors import ParamsError
from .files import atomic_write

REPO_ROOT = Path(__file__).resolve().parents[3]
PARAMS_DIR = REPO_ROOT / "params"
DEFAULT_PARAMS = PARAMS_DIR / "default.yaml"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


# --- checkpoint --------------------------------------------------------------------
class LingShape(_Strict):
    """Ling-3.0-flash sizes. The defaults are the real model's, as the code that loads it reads
    them (SGLang 0.5.23 ``srt/models/bailing_moe_v3.py``, ``srt/configs/bailing_hybrid.py``);
    a checkpoint's own ``config.json`` overrides them wherever the study reads one."""

    vocab_size: int = 157184
    hidden_size: int = 2560
    intermediate_size: int = 6144
    num_hidden_layers: int = 42
    num_attention_heads: int = 32
    num_key_value_heads: int = 32
    head_dim: int = 128
    layer_group_size: int = 6
    num_experts: int = 512
    num_experts_per_tok: int = 8
    num_shared_experts: int = 1
    n_group: int = 8
    topk_group: int = 4
    moe_intermediate_size: int = 768
    moe_shared_expert_intermediate_size: int = 768
    first_k_dense_replace: int = 2
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 128
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128
    short_conv_kernel_size: int = 4
    num_nextn_predict_layers: int = 1
    # Clamp lists: {layer: limit}; unlisted layers are 0 (no clamp). Real model's by default.
    expert_swiglu_limits: dict[int, float] = Field(
        default_factory=lambda: {i: 4.0 for i in range(35, 42)}
    )
    share_expert_swiglu_limits: dict[int, float] = Field(
        default_factory=lambda: {**{i: 5.0 for i in range(34, 40)}, 40: 7.0, 41: 7.0}
    )


class CheckpointParams(_Strict):
    source: Literal["generate", "path"] = "generate"
    source_path: str | None = None  # BF16 source checkpoint when source == "path"
    shape: LingShape = Field(default_factory=LingShape)
    shards: int = 4
    seed: int = 0
    quantized_path: str | None = None  # audit this existing quantized checkpoint instead


# --- quantize ----------------------------------------------------------------------
class QuantizeParams(_Strict):
    enabled: bool = True
    scheme: Literal["NVFP4A16"] = "NVFP4A16"
    device: str = "cpu"
    max_workers: int = 1
    share_gate_up_global_scale: bool = True
    serving_rewrite: bool = True  # add input_global_scale = 1.0 and the W4A4 config block
    python: str | None = None  # interpreter of a separate quantizer environment
    roundtrip_experts: int = 8  # experts dequantized for the round-trip check
    compare_unshared: bool = True  # also quantize without the gate/up rule to measure the scale mismatch (2x time)


# --- sglang ------------------------------------------------------------------------
class SGLangParams(_Strict):
    version: str = "0.5.23"
    source: Literal["wheel", "installed", "path"] = "wheel"
    path: str | None = None  # an SGLang tree (the folder holding sglang/srt) when source == path
    audit_versions: list[str] = Field(default_factory=lambda: ["0.5.20", "0.5.21", "0.5.22", "0.5.23"])
    # "card" (the model card's own patch) exists for 0.5.20 only; modes a version lacks are skipped
    patch_modes: list[Literal["stock", "none", "exact", "card"]] = Field(
        default_factory=lambda: ["stock", "none", "exact"]
    )
    deterministic_patch: bool = True
    apply_to_install: bool = False  # True: patch the serving install in place (GPU profile)


# --- serving -----------------------------------------------------------------------
class SpeculativeParams(_Strict):
    algorithm: Literal["NEXTN"] | None = "NEXTN"
    num_steps: int = 2
    eagle_topk: int = 1
    num_draft_tokens: int = 3


class ServerParams(_Strict):
    enabled: bool = False  # False: stages 04/06/07 record "not run" (no NVFP4-capable GPU)
    python: str | None = None  # interpreter of the SGLang environment
    model_path: str | None = None  # served checkpoint; None = this run's quantized checkpoint
    host: str = "127.0.0.1"
    port: int = 30013
    tp_size: int = 1
    ep_size: int = 1
    mem_fraction_static: float = 0.75
    context_length: int = 32768
    max_running_requests: int = 1
    chunked_prefill_size: int = 2048
    disable_shared_experts_fusion: bool = True
    tool_call_parser: str | None = "glm45"
    reasoning_parser: str | None = None
    speculative: SpeculativeParams = Field(default_factory=SpeculativeParams)
    enable_metrics: bool = True
    extra_args: list[str] = Field(default_factory=list)
    startup_timeout_s: float = 1800.0
    request_timeout_s: float = 600.0
    trust_remote_code: bool = True  # the card's command passes --trust-remote-code
    clamp_mode: Literal["stock", "none", "exact"] = "exact"  # clamp mode served in 04/06/07
    require_gpu: bool = True  # refuse to launch below compute capability 10 (tests: False)
    check_version: bool = True  # the interpreter's sglang must be sglang.version
    shutdown_grace_s: float = 30.0  # SIGTERM -> SIGKILL grace for the server's process group
    health_poll_s: float = 2.0  # seconds between /health_generate polls while loading
    env: dict[str, str] = Field(default_factory=dict)  # extra environment for the server


# --- corruption --------------------------------------------------------------------
class SamplingConfig(_Strict):
    name: str
    temperature: float
    top_p: float = 1.0
    top_k: int = -1
    thinking: bool = False
    max_tokens: int = 2048


def _card_sampling() -> list[SamplingConfig]:
    return [
        SamplingConfig(name="t0-off-a", temperature=0.0, thinking=False),
        SamplingConfig(name="t0-off-b", temperature=0.0, thinking=False),
        SamplingConfig(name="t06-on", temperature=0.6, top_p=0.95, top_k=20, thinking=True),
        SamplingConfig(name="t06-off", temperature=0.6, top_p=0.95, top_k=20, thinking=False),
    ]


class SandboxParams(_Strict):
    timeout_s: float = 10.0  # wall clock per program; the whole sandbox is killed after it
    memory_mb: int = 1024  # RLIMIT_AS per process, and the sandbox's total RSS (watchdog)
    cpu_s: int = 10  # RLIMIT_CPU per process (SIGXCPU)
    file_size_mb: int = 16  # RLIMIT_FSIZE
    isolation: Literal["auto", "bwrap", "subprocess"] = "auto"  # auto: bwrap if it runs here
    max_processes: int = 32  # processes in the sandbox before the watchdog kills it
    tmp_size_mb: int = 64  # size of the sandbox's private /tmp (tmpfs)
    output_tail_bytes: int = 2000  # stdout/stderr kept per run (the rest is counted, dropped)
    python: str | None = None  # interpreter run in the sandbox; None = this one's base interpreter


class CorruptionParams(_Strict):
    humaneval_count: int = 164  # first N HumanEval problems (0..164)
    card_tasks: bool = True  # include the card-style algorithmic prompts
    sampling: list[SamplingConfig] = Field(default_factory=_card_sampling)
    clamp_modes: list[Literal["stock", "none", "exact"]] = Field(
        default_factory=lambda: ["none", "exact"]
    )
    validate_detector: bool = True
    junk_variants_per_kind: int = 1  # junk-injected variants per canonical solution and kind
    junk_seed: int = 0  # seed of the junk injection (detector validation); same seed, same variants
    validation_execute: bool = True  # detector validation also runs every variant in the sandbox
    validation_timeout_s: float = 5.0  # wall clock per program in the detector validation (<= sandbox.timeout_s)
    sandbox: SandboxParams = Field(default_factory=SandboxParams)
    # The card's claim sets: a claim of n tasks uses the first n ids of this list (n from
    # claims.yaml: 15 for corruption.t0-off-15, 10 for the others); [] = the card-style tasks
    # in tasks.py order (requires card_tasks: true), else the first n loaded tasks.
    claim_tasks: list[str] = Field(default_factory=list)
    before_mode: Literal["stock", "none", "exact"] = "none"  # the card's "before patch" state
    after_mode: Literal["stock", "none", "exact"] = "exact"  # the card's "after patch" state
    executed_n: int = 8  # corruption.executed: first n claim tasks, first sampling, after_mode
    reasoning_probe_parser: str | None = "ling3"  # serve.reasoning-parser probe; None = skip
    reasoning_probe_tasks: int = 5  # thinking-off requests per stream mode in the probe
    max_workers: int = 2  # parallel sandboxed executions when classifying
    # requests in flight on the corruption sweep's servers (--max-running-requests of those
    # launches); 1 = the card's --max-running-requests 1. >1 runs the sweep batched as its own
    # server configuration (``nvfp4study plan`` shows the saving).
    concurrency: int = Field(default=1, ge=1)


# --- MTP and determinism -----------------------------------------------------------
class MTPParams(_Strict):
    depths: list[int] = Field(default_factory=lambda: [0, 1, 2, 3])
    prompts: int = 10
    max_tokens: int = 512
    warmup_requests: int = 1
    thinking: bool = False  # chat_template_kwargs enable_thinking for the timed prompts
    flush_cache: bool = True  # POST /flush_cache before each 06/07 request (no prefix-cache reuse)
    broken_model_path: str | None = None  # a checkpoint with layer 42 mis-declared (mtp.broken-draft)


class DeterminismParams(_Strict):
    prompts: int = 5
    repeats: int = 2
    max_tokens: int = 512
    deterministic_mode: bool = True
    spec_depth: int = 2  # the NEXTN depth compared with speculation off (the card's k=2)


# --- the whole profile -----------------------------------------------------------------------
class Params(_Strict):
    profile: str
    description: str = ""
    execution_timeout_s: int = 1800  # per notebook cell; a timeout fails the run
    replay_from: str | None = None  # a recorded run folder: re-analyse its raw files, no server
    checkpoint: CheckpointParams = Field(default_factory=CheckpointParams)
    quantize: QuantizeParams = Field(default_factory=QuantizeParams)
    sglang: SGLangParams = Field(default_factory=SGLangParams)
    server: ServerParams = Field(default_factory=ServerParams)
    corruption: CorruptionParams = Field(default_factory=CorruptionParams)
    mtp: MTPParams = Field(default_factory=MTPParams)
    determinism: DeterminismParams = Field(default_factory=DeterminismParams)

    def digest(self) -> str:
        """SHA-256 (hex, first 16 chars) of the canonical JSON of the validated params."""
        blob = json.dumps(self.model_dump(mode="json"), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def _model_at(model: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """The pydantic model class that owns the field at ``loc`` (for "did you mean")."""
    cur: Any = model
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = cur.model_fields.get(part) if isinstance(cur, type) else None
        if field is None:
            return None
        ann = field.annotation
        args = getattr(ann, "__args__", ())
        nxt = next((a for a in (ann, *args) if isinstance(a, type) and issubclass(a, BaseModel)), None)
        if nxt is None:
            return None
        cur = nxt
    return cur


def _explain(err: ValidationError, source: str, overridden: tuple[str, ...] = ()) -> str:
    lines = []
    for e in err.errors():
        loc = tuple(e["loc"])
        key = ".".join(str(p) for p in loc)
        where = f"-p {key}" if any(key == o or key.startswith(o + ".") or o.startswith(key + ".")
                                   for o in overridden) else source
        if e["type"] == "extra_forbidden":
            owner = _model_at(Params, loc)
            valid = sorted(owner.model_fields) if owner else []
            close = difflib.get_close_matches(str(loc[-1]), valid, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else f" (valid: {', '.join(valid)})"
            lines.append(f"{where}: unknown key '{key}'{hint}")
        elif e["type"] == "missing":
            lines.append(f"{where}: missing required key '{key}'")
        else:
            lines.append(f"{where}: key '{key}': {e['msg']} (got {e.get('input')!r})")
    return "; ".join(lines)


def apply_override(raw: dict, assignment: str) -> None:
    """Apply one ``dotted.key=value`` override to raw params in place.

    The value is parsed as YAML (so ``3``, ``true``, ``[0, 2]``, ``null`` work).

    Raises:
        ParamsError: no ``=`` in the assignment, or a path through a non-mapping.
    """
    if "=" not in assignment:
        raise ParamsError(f"override '{assignment}' is not key=value")
    key, value = assignment.split("=", 1)
    parts = key.strip().split(".")
    cur = raw
    for p in parts[:-1]:
        nxt = cur.setdefault(p, {})
        if not isinstance(nxt, dict):
            raise ParamsError(f"override '{key}': '{p}' is not a section")
        cur = nxt
    cur[parts[-1]] = yaml.safe_load(value) if value.strip() else None


#: the machine's own overlay (gitignored), written by ``make workstation-envs``: merged over any
#: params file before the overrides, so ``params/ling3-flash.yaml`` needs no edit on a workstation.
LOCAL_OVERLAY = PARAMS_DIR / "local.yaml"
#: environment variable naming another overlay file; set to "" for none.
OVERLAY_ENV = "NVFP4STUDY_OVERLAY"


def overlay_path() -> Path | None:
    """The overlay in force: ``$NVFP4STUDY_OVERLAY`` when set ("" = none), else
    :data:`LOCAL_OVERLAY` when it exists, else None."""
    import os

    env = os.environ.get(OVERLAY_ENV)
    if env is not None:
        return Path(env).expanduser() if env else None
    return LOCAL_OVERLAY if LOCAL_OVERLAY.is_file() else None


def _merge(base: dict, over: dict) -> dict:
    """``over`` merged into ``base`` key by key (mappings recursively, everything else replaced)."""
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _read_yaml(p: Path) -> dict:
    try:
        raw = yaml.safe_load(p.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ParamsError(f"{p}: cannot read params: {exc}") from exc
    if not isinstance(raw, dict):
        raise ParamsError(f"{p}: top level must be a mapping, got {type(raw).__name__}")
    return raw


def load_params(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = (),
                overlay: str | Path | None | bool = True) -> Params:
    """Read, overlay, override and validate a params YAML file.

    Args:
        path: the YAML file; ``None`` means ``params/default.yaml``.
        overrides: ``dotted.key=value`` strings, applied before validation (after the overlay).
        overlay: True = :func:`overlay_path` (``params/local.yaml`` or ``$NVFP4STUDY_OVERLAY``);
            a path = that file (must exist); False or None = no overlay.

    Returns:
        The validated :class:`Params`.

    Raises:
        ParamsError: missing/unreadable file, invalid YAML, unknown key, wrong type; the message
            names the file and the key.
    """
    p = Path(path) if path else DEFAULT_PARAMS
    if not p.is_file():
        raise ParamsError(f"params file not found: {p}")
    raw = _read_yaml(p)
    ov = overlay_path() if overlay is True else (Path(overlay) if overlay else None)
    if ov is not None:
        if not ov.is_file():
            raise ParamsError(f"params overlay not found: {ov} (unset {OVERLAY_ENV} or run make workstation-envs)")
        raw = _merge(raw, _read_yaml(ov))
        p = Path(f"{p} + overlay {ov}")
    for o in overrides:
        apply_override(raw, o)
    try:
        return Params.model_validate(raw)
    except ValidationError as exc:
        keys = tuple(o.split("=", 1)[0].strip() for o in overrides)
        raise ParamsError(_explain(exc, str(p), keys)) from None


def dump_params(params: Params, path: str | Path) -> Path:
    """Write the resolved params as YAML (what a run actually used). Returns the path."""

    text = yaml.safe_dump(params.model_dump(mode="json"), sort_keys=False)
    return atomic_write(Path(path), lambda tmp: tmp.write_text(text))

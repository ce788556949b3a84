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
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .errors import ParamsError, ShapeInvalid
from .files import atomic_write
from .kinds import Engine, LauncherKind, unsupported_pair
from .params_keys import flat_keys, is_operational
from .params_yaml import apply_override, read_yaml_mapping
from .shape_rules import shape_problems

REPO_ROOT = Path(__file__).resolve().parents[3]
PARAMS_DIR = REPO_ROOT / "params"
DEFAULT_PARAMS = PARAMS_DIR / "default.yaml"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def _int(default: int | None, ge: int | None = None, le: int | None = None) -> Any:
    """A strict int field (``true`` or ``2.0`` is not an int) in ``[ge, le]``."""
    return Field(default, strict=True, ge=ge, le=le)


def _float(default: float, *, gt: float | None = None, ge: float | None = None,
           le: float | None = None) -> Any:
    """A finite float field (an int is accepted, a bool is not) with the given bounds."""
    return Field(default, strict=True, allow_inf_nan=False, gt=gt, ge=ge, le=le)


def _bool(default: bool) -> Any:
    """A strict bool field (``1`` or ``"yes"`` is not a bool)."""
    return Field(default, strict=True)


_SIZE = 1 << 20  # upper bound of a model dimension (the real ones are <= 157,184)
_SECONDS = 7 * 24 * 3600.0  # upper bound of any time-out (a week)
#: a clamp-list entry: layer index >= 0 -> limit >= 0 (0 = no clamp), finite.
_Layer = Annotated[int, Field(ge=0, le=4096)]
_Limit = Annotated[float, Field(strict=True, ge=0, allow_inf_nan=False)]


# --- checkpoint --------------------------------------------------------------------
class LingShape(_Strict):
    """Ling-3.0-flash sizes. The defaults are the real model's, as the code that loads it reads
    them (SGLang 0.5.23 ``srt/models/bailing_moe_v3.py``, ``srt/configs/bailing_hybrid.py``);
    a checkpoint's own ``config.json`` overrides them wherever the study reads one.

    Validated as a whole on construction and on assignment (:func:`.shape_rules.shape_problems`).

    Raises:
        ShapeInvalid: a rule of :func:`shape_problems` is broken (every broken rule named).
    """

    vocab_size: int = _int(157184, 1, _SIZE)
    hidden_size: int = _int(2560, 1, _SIZE)
    intermediate_size: int = _int(6144, 1, _SIZE)
    num_hidden_layers: int = _int(42, 1, _SIZE)
    num_attention_heads: int = _int(32, 1, _SIZE)
    num_key_value_heads: int = _int(32, 1, _SIZE)
    head_dim: int = _int(128, 1, _SIZE)
    layer_group_size: int = _int(6, 1, _SIZE)
    num_experts: int = _int(512, 1, _SIZE)
    num_experts_per_tok: int = _int(8, 1, _SIZE)
    num_shared_experts: int = _int(1, 0, _SIZE)
    n_group: int = _int(8, 1, _SIZE)
    topk_group: int = _int(4, 1, _SIZE)
    moe_intermediate_size: int = _int(768, 1, _SIZE)
    moe_shared_expert_intermediate_size: int = _int(768, 1, _SIZE)
    first_k_dense_replace: int = _int(2, 0, _SIZE)
    kv_lora_rank: int = _int(512, 1, _SIZE)
    qk_nope_head_dim: int = _int(128, 1, _SIZE)
    qk_rope_head_dim: int = _int(64, 1, _SIZE)
    v_head_dim: int = _int(128, 1, _SIZE)
    short_conv_kernel_size: int = _int(4, 1, _SIZE)
    num_nextn_predict_layers: int = _int(1, 0, _SIZE)
    # Clamp lists: {layer: limit}; unlisted layers are 0 (no clamp). Real model's by default.
    expert_swiglu_limits: dict[_Layer, _Limit] = Field(
        default_factory=lambda: {i: 4.0 for i in range(35, 42)}
    )
    share_expert_swiglu_limits: dict[_Layer, _Limit] = Field(
        default_factory=lambda: {**{i: 5.0 for i in range(34, 40)}, 40: 7.0, 41: 7.0}
    )

    @model_validator(mode="after")
    def _consistent(self) -> LingShape:
        # ShapeInvalid is not a ValueError: pydantic lets it through unwrapped (load_params adds
        # the file and key).
        problems = shape_problems(self)
        if problems:
            raise ShapeInvalid("invalid Ling shape: " + "; ".join(problems))
        return self


class HubSource(_Strict):
    """A Hub repository at a revision (branch, tag or commit; a branch is resolved to its commit,
    which is what the run records and a re-run reuses). Read through huggingface_hub, honouring
    HF_ENDPOINT, HF_HUB_CACHE, HF_HUB_OFFLINE and HF_TOKEN (:mod:`nvfp4study.core.hub`)."""

    repo_id: str
    revision: str = "main"


class CheckpointParams(_Strict):
    source: Literal["generate", "path", "hub"] = "generate"
    source_path: str | None = None  # BF16 source checkpoint when source == "path"
    source_hub: HubSource | None = None  # BF16 source on the Hub when source == "hub" (downloaded)
    # the card's NVFP4 checkpoint on the Hub: 02 audits it by range requests beside ours (None: not run)
    card_checkpoint: HubSource | None = None
    shape: LingShape = Field(default_factory=LingShape)
    shards: int = _int(4, 1, 100_000)
    seed: int = _int(0, 0, 2**63 - 1)  # torch.Generator.manual_seed range
    quantized_path: str | None = None  # audit this existing quantized checkpoint instead
    # what 02 audits and 04-07 serve: ours = 01 quantizes the BF16 source; card = 01 downloads
    # card_checkpoint (the card's NVFP4 files, its revision resolved to a commit and recorded) and
    # nothing is quantized
    serve: Literal["ours", "card"] = "ours"


# --- quantize ----------------------------------------------------------------------
class QuantizeParams(_Strict):
    enabled: bool = _bool(True)
    scheme: Literal["NVFP4A16"] = "NVFP4A16"
    device: str = "cpu"
    max_workers: int = _int(1, 1, 1024)
    share_gate_up_global_scale: bool = _bool(True)
    serving_rewrite: bool = _bool(True)  # add input_global_scale = 1.0 and the W4A4 config block
    python: str | None = None  # interpreter of a separate quantizer environment
    roundtrip_experts: int = _int(8, 0, _SIZE)  # experts dequantized for the round-trip check
    compare_unshared: bool = _bool(True)  # also quantize without the gate/up rule to measure the scale mismatch (2x time)
    redo: bool = _bool(False)  # quantize again even when this run folder holds an identical earlier output
    assumed_mb_per_s: float = _float(150.0, gt=0)  # for the time printed before quantizing (bench_quantize, 2 CPU cores)


# --- sglang ------------------------------------------------------------------------
class SGLangParams(_Strict):
    version: str = "0.5.23"
    source: Literal["wheel", "installed", "path"] = "wheel"
    path: str | None = None  # an SGLang tree (the folder holding sglang/srt) when source == path
    # "bailing-releases": every release whose wheel carries models/bailing_moe_v3.py (found from the
    # wheels by nvfp4study.sglang.releases; the shipped result is used without a network query)
    audit_versions: list[str] = Field(default_factory=lambda: ["bailing-releases"])
    # "card" (the model card's own patch) exists for 0.5.19/0.5.20 only (0.5.21+ contain its edits);
    # modes a version lacks are skipped
    patch_modes: list[Literal["stock", "none", "exact", "card"]] = Field(
        default_factory=lambda: ["stock", "none", "exact"]
    )
    deterministic_patch: bool = _bool(True)
    apply_to_install: bool = _bool(False)  # True: patch the serving install in place (GPU profile)
    # the card's own sglang_patch/*.patch: from its Hub repo, or a local folder (None: not run,
    # our reconstruction in patches/0.5.20/card stands in); replayed on each release below
    card_patches: HubSource | None = None
    card_patch_dir: str | None = None
    card_patch_versions: list[str] = Field(default_factory=lambda: ["0.5.20", "0.5.21", "0.5.22", "0.5.23"])


# --- serving -----------------------------------------------------------------------
class SpeculativeParams(_Strict):
    algorithm: Literal["NEXTN"] | None = "NEXTN"
    num_steps: int = _int(2, 1, 64)
    eagle_topk: int = _int(1, 1, 64)
    num_draft_tokens: int = _int(3, 1, 1024)


class DockerParams(_Strict):
    """``server.launcher: docker``: SGLang from a published image (``lmsysorg/sglang:<tag>``).

    The container runs ``docker run --rm --name <prefix>-<unique> --gpus <gpus> --ipc=host
    --network host`` with the checkpoint and the patched SGLang files mounted read-only
    (:mod:`nvfp4study.serving.docker`); ``extra_args`` go before the image name."""

    image: str | None = None  # e.g. lmsysorg/sglang:v0.5.23 (its sglang must be sglang.version)
    gpus: str = "all"  # docker run --gpus value ("all", "device=0", "2")
    extra_args: list[str] = Field(default_factory=list)  # more docker run options (-e K=V, -v ...)
    container_name_prefix: str = Field("nvfp4study-sglang", pattern=r"^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,100}$")


class TrainedStandinParams(_Strict):
    # the trained stand-in (nvfp4study.trained, committed with its hash) served on the CPU engine:
    # 05 its clamp arms x weight arms on the first `prompts` HumanEval prompts (greedy,
    # `max_new_tokens`, the HumanEval stop sequences); 06 its NEXTN head at mtp.depths
    enabled: bool = _bool(True)
    prompts: int = _int(10, 1, 164)
    max_new_tokens: int = _int(48, 1, 1024)
    clamps: list[Literal["released", "approx", "exact"]] = Field(
        default_factory=lambda: ["released", "approx", "exact"], min_length=1)
    weights: list[Literal["bf16", "nvfp4"]] = Field(default_factory=lambda: ["bf16", "nvfp4"], min_length=1)

    @model_validator(mode="after")
    def _reference_arm(self) -> TrainedStandinParams:
        if "exact" not in self.clamps or "bf16" not in self.weights:
            raise ParamsError("server.cpu.trained: the exact clamp with BF16 weights is the reference arm "
                              "every other arm is compared with; keep 'exact' in clamps and 'bf16' in weights")
        if len(set(self.clamps)) != len(self.clamps) or len(set(self.weights)) != len(self.weights):
            raise ParamsError("server.cpu.trained: clamps and weights must not repeat")
        return self


class CpuEngineParams(_Strict):
    # what the CPU engine (server.engine: cpu) serves and asks; the GPU profile ignores it
    standin_seed: int = _int(0, 0, 2**31 - 1)  # seed of the served stand-in's random weights
    corruption_tasks: int = _int(2, 0, 100_000)  # 05 on the CPU engine: first N tasks sent per sampling config
    # 06 on the CPU engine: stand-ins whose draft acceptance is known by construction, served at
    # control_depth: "agree" (accept length k+1), "disagree" (1.00, rate 0.00: the broken-draft signature)
    control_drafts: list[Literal["agree", "disagree"]] = Field(default_factory=lambda: ["agree", "disagree"])
    control_depth: int = _int(3, 1, 64)
    # 04 on the CPU engine: the clamp probe (checkpoint.served.probe_shape): the stand-in served
    # with this limit on every MoE layer's routed experts, on its shared expert, or nowhere (twice),
    # to read dynamically what the native MoE path does with Ling's routed limit; 0: off
    clamp_probe_limit: float = _float(0.001, ge=0, le=1e6)
    clamp_probe_prompts: int = _int(6, 1, 10)  # prompts sent to each probe launch: the first N of the 10 in serving_prompts.yaml
    clamp_probe_max_tokens: int = _int(8, 1, 4096)  # greedy tokens per probe request
    # 04 with the clamp probe: the routed-scaling probe (checkpoint.served SCALING_PROBES), two more
    # launches of the probe's no-limit model: routed_scaling_factor x ratio (config only), and the
    # routed experts' down_proj x ratio (positive control); a power of two keeps both exact in BF16
    scaling_probe_ratio: float = _float(4.0, gt=1, le=1024)
    # the native MoE path's patches (sglang.patch.NATIVE_AXES), put on the run's overlay of SGLang
    # for every CPU-engine launch and reverted after it (with sglang.apply_to_install): released =
    # as shipped (moe_forward_native drops the routed clamp); approx = the pre-SiLU (GPT-OSS) form;
    # exact = Ling's post-SiLU form min(silu(g), L) * clamp(u, -L, L)
    moe_clamp: Literal["released", "approx", "exact"] = "released"
    # released = as shipped (the native path applies routed_scaling_factor nowhere); applied = the
    # routed output multiplied by it once (patch native-routed-scaling)
    routed_scaling: Literal["released", "applied"] = "released"
    # fork each server from one preloaded interpreter per launching process (serving/forkserver.py:
    # the third-party imports, about 7 of a launch's 9 CPU-s, are paid once); false: exec each
    fork_server: bool = _bool(True)
    trained: TrainedStandinParams = Field(default_factory=TrainedStandinParams)


class ServerParams(_Strict):
    enabled: bool = _bool(False)  # False: stages 04/06/07 record "not run" (no NVFP4-capable GPU)
    # gpu: the card's NVFP4 checkpoint on a GPU; cpu: SGLang's real engine on this CPU
    # (serving/cpu_engine: its flags and environment), serving the stand-in of checkpoint/served.py
    engine: Engine = Engine.GPU
    cpu: CpuEngineParams = Field(default_factory=CpuEngineParams)
    python: str | None = None  # interpreter of the SGLang environment (a relative path is from the repo root)
    model_path: str | None = None  # served checkpoint; None = this run's quantized checkpoint
    host: str = "127.0.0.1"
    port: int = _int(30013, 0, 65535)  # 0: a free port chosen at each launch (recorded in the launch record)
    tp_size: int = _int(1, 1, 1024)
    ep_size: int = _int(1, 1, 1024)
    mem_fraction_static: float = _float(0.75, gt=0, le=1)
    context_length: int = _int(32768, 1, 1 << 24)
    max_running_requests: int = _int(1, 1, 1 << 20)
    chunked_prefill_size: int = _int(2048, -1, 1 << 24)  # -1: SGLang's "no chunking"
    disable_shared_experts_fusion: bool = _bool(True)
    tool_call_parser: str | None = "glm45"
    reasoning_parser: str | None = None
    speculative: SpeculativeParams = Field(default_factory=SpeculativeParams)
    enable_metrics: bool = _bool(True)
    extra_args: list[str] = Field(default_factory=list)
    startup_timeout_s: float = _float(1800.0, gt=0, le=_SECONDS)
    request_timeout_s: float = _float(600.0, gt=0, le=_SECONDS)
    trust_remote_code: bool = _bool(True)  # the card's command passes --trust-remote-code
    clamp_mode: Literal["stock", "none", "exact"] = "exact"  # clamp mode served in 04/06/07
    require_gpu: bool = _bool(True)  # refuse to launch below compute capability 10 (tests: False)
    check_version: bool = _bool(True)  # the interpreter's sglang must be sglang.version
    shutdown_grace_s: float = _float(30.0, ge=0, le=_SECONDS)  # SIGTERM -> SIGKILL grace for the server's process group
    health_poll_s: float = _float(2.0, gt=0, le=3600)  # seconds between /health_generate polls while loading
    # launches of one install state that load at the same time; each then serves its requests
    # alone while the others wait idle (measure._sessions). 1 on a GPU (one model fills it); 2
    # on the CPU engine, where loading is mostly one core's Python imports. Needs port 0 (a
    # free port per launch); with a fixed port launches load one at a time.
    parallel_loads: int = _int(1, 1, 16)
    env: dict[str, str] = Field(default_factory=dict)  # extra environment for the server
    # local: server.python runs SGLang here; docker: server.docker.image runs it in a container
    launcher: LauncherKind = LauncherKind.LOCAL
    docker: DockerParams = Field(default_factory=DockerParams)

    @model_validator(mode="after")
    def _supported_pair(self) -> ServerParams:
        """Refuse an (engine, launcher) pair the study cannot run (:data:`~.kinds.SUPPORTED`)."""
        why = unsupported_pair(self.engine, self.launcher)
        if why:
            raise ValueError(why)
        return self


# --- corruption --------------------------------------------------------------------
class SamplingConfig(_Strict):
    name: str
    temperature: float = Field(strict=True, allow_inf_nan=False, ge=0, le=100)
    top_p: float = _float(1.0, gt=0, le=1)
    top_k: int = _int(-1, -1, 1 << 24)  # -1: all tokens (0 is refused below)
    thinking: bool = _bool(False)
    max_tokens: int = _int(2048, 1, 1 << 24)

    @model_validator(mode="after")
    def _top_k(self) -> SamplingConfig:
        if self.top_k == 0:
            raise ValueError("top_k must be -1 (all tokens) or >= 1, got 0")
        return self


def _card_sampling() -> list[SamplingConfig]:
    return [
        SamplingConfig(name="t0-off-a", temperature=0.0, thinking=False),
        SamplingConfig(name="t0-off-b", temperature=0.0, thinking=False),
        SamplingConfig(name="t06-on", temperature=0.6, top_p=0.95, top_k=20, thinking=True),
        SamplingConfig(name="t06-off", temperature=0.6, top_p=0.95, top_k=20, thinking=False),
    ]


class SandboxParams(_Strict):
    timeout_s: float = _float(10.0, gt=0, le=_SECONDS)  # wall clock per program; the whole sandbox is killed after it
    memory_mb: int = _int(1024, 16, 1 << 24)  # RLIMIT_AS per process, and the sandbox's total RSS (watchdog)
    cpu_s: int = _int(10, 1, int(_SECONDS))  # RLIMIT_CPU per process (SIGXCPU)
    file_size_mb: int = _int(16, 1, 1 << 24)  # RLIMIT_FSIZE
    # bwrap: fail closed when bubblewrap cannot be set up; subprocess-unsafe (only by this name):
    # a plain subprocess with the harness user's file and network access (codeeval/isolation.py)
    isolation: Literal["bwrap", "subprocess-unsafe"] = "bwrap"
    max_processes: int = _int(32, 1, 4096)  # processes in the sandbox before the watchdog kills it
    tmp_size_mb: int = _int(64, 1, 1 << 24)  # size of the sandbox's private /tmp (tmpfs)
    output_tail_bytes: int = _int(2000, 0, 1 << 30)  # stdout/stderr kept per run (the rest is counted, dropped)
    python: str | None = None  # interpreter run in the sandbox; None = this one's base interpreter


class CorruptionParams(_Strict):
    humaneval_count: int = _int(164, 0, 164)  # first N HumanEval problems (0..164)
    card_tasks: bool = _bool(True)  # include the card-style algorithmic prompts
    sampling: list[SamplingConfig] = Field(default_factory=_card_sampling)
    clamp_modes: list[Literal["stock", "none", "exact"]] = Field(
        default_factory=lambda: ["none", "exact"]
    )
    validate_detector: bool = _bool(True)
    junk_variants_per_kind: int = _int(1, 0, 1000)  # junk-injected variants per canonical solution and kind
    junk_seed: int = _int(0, 0, 2**63 - 1)  # seed of the junk injection (detector validation); same seed, same variants
    validation_execute: bool = _bool(True)  # detector validation also runs every variant in the sandbox
    validation_timeout_s: float = _float(5.0, gt=0, le=_SECONDS)  # wall clock per program in the detector validation (<= sandbox.timeout_s)
    sandbox: SandboxParams = Field(default_factory=SandboxParams)
    # The card's claim sets: a claim of n tasks uses the first n ids of this list (n from
    # claims.yaml: 15 for corruption.t0-off-15, 10 for the others); [] = the card-style tasks
    # in tasks.py order (requires card_tasks: true), else the first n loaded tasks.
    claim_tasks: list[str] = Field(default_factory=list)
    before_mode: Literal["stock", "none", "exact"] = "none"  # the card's "before patch" state
    after_mode: Literal["stock", "none", "exact"] = "exact"  # the card's "after patch" state
    executed_n: int = _int(8, 0, 100_000)  # corruption.executed: first n claim tasks, first sampling, after_mode
    reasoning_probe_parser: str | None = "ling3"  # serve.reasoning-parser probe; None = skip
    reasoning_probe_tasks: int = _int(5, 0, 100_000)  # thinking-off requests per stream mode in the probe
    # parallel sandboxed executions when classifying. A run waits more than it computes (bwrap's
    # namespaces and the pids cgroup are made and torn down per run): 05's detector validation,
    # 1,163 runs, took 60 s of wall for 11 s of CPU with 2 at a time and 38 s with 4 on two cores
    max_workers: int = _int(4, 1, 1024)
    # requests in flight on the corruption sweep's servers (--max-running-requests of those
    # launches); 1 = the card's --max-running-requests 1. >1 runs the sweep batched as its own
    # server configuration (``nvfp4study plan`` shows the saving).
    concurrency: int = _int(1, 1, 1024)
    # which requests the served sweep sends per clamp mode: card = the card's protocol, each
    # sampling config asks only the tasks of its claim (claims.yaml n: 15 + 10 + 10 + 10 = 45 per
    # mode); extended = every loaded task (humaneval_count + card tasks) with every sampling config
    protocol: Literal["card", "extended"] = "extended"


# --- MTP and determinism -----------------------------------------------------------
class MTPParams(_Strict):
    # 0 = speculation off; a depth is NEXTN's --speculative-num-steps
    depths: list[Annotated[int, Field(strict=True, ge=0, le=64)]] = Field(
        default_factory=lambda: [0, 1, 2, 3])
    prompts: int = _int(10, 1, 100_000)
    max_tokens: int = _int(512, 1, 1 << 24)
    warmup_requests: int = _int(1, 0, 1000)
    thinking: bool = _bool(False)  # chat_template_kwargs enable_thinking for the timed prompts
    flush_cache: bool = _bool(True)  # POST /flush_cache before each 06/07 request (no prefix-cache reuse)
    broken_model_path: str | None = None  # a checkpoint with layer 42 mis-declared (mtp.broken-draft)


class DeterminismParams(_Strict):
    prompts: int = _int(5, 1, 100_000)
    repeats: int = _int(2, 1, 1000)  # runs per prompt and configuration (1: only across configurations)
    max_tokens: int = _int(512, 1, 1 << 24)
    deterministic_mode: bool = _bool(True)
    spec_depth: int = _int(2, 1, 64)  # the NEXTN depth compared with speculation off (the card's k=2)


# --- the whole profile -----------------------------------------------------------------------
class Params(_Strict):
    profile: str
    description: str = ""
    execution_timeout_s: int = _int(1800, 1, int(_SECONDS))  # per notebook cell; a timeout fails the run
    replay_from: str | None = None  # a recorded run folder: re-analyse its raw files, no server
    checkpoint: CheckpointParams = Field(default_factory=CheckpointParams)
    quantize: QuantizeParams = Field(default_factory=QuantizeParams)
    sglang: SGLangParams = Field(default_factory=SGLangParams)
    server: ServerParams = Field(default_factory=ServerParams)
    corruption: CorruptionParams = Field(default_factory=CorruptionParams)
    mtp: MTPParams = Field(default_factory=MTPParams)
    determinism: DeterminismParams = Field(default_factory=DeterminismParams)

    def result_fields(self) -> dict[str, Any]:
        """``{dotted key: value}`` of every key that can change a result: the flattened
        validated params (:func:`flat_keys`) without the :data:`.params_keys.OPERATIONAL_KEYS`."""
        return {k: v for k, v in flat_keys(self.model_dump(mode="json")).items() if not is_operational(k)}

    def digest(self) -> str:
        """SHA-256 (hex, first 16 chars) of the canonical JSON of :meth:`result_fields`: two
        params with the same digest give the same results (the operational keys are left out)."""
        blob = json.dumps(self.result_fields(), sort_keys=True).encode()
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
            got = repr(e.get("input"))
            got = got if len(got) <= 80 else got[:77] + "..."
            lines.append(f"{where}: key '{key}': {e['msg']} (got {got})")
    return "; ".join(lines)


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
        ShapeInvalid (a ParamsError): the checkpoint shape breaks a rule of
            :func:`.shape_rules.shape_problems` (names the file or override).
        ParamsError: missing/unreadable file, bytes that are not UTF-8, invalid YAML, a duplicate
            key (with its line), unknown key, wrong type or out-of-range value; the message names
            the file (or the ``-p`` override) and the key.
    """
    p = Path(path) if path else DEFAULT_PARAMS
    if not p.is_file():
        raise ParamsError(f"params file not found: {p}")
    raw = read_yaml_mapping(p)
    ov = overlay_path() if overlay is True else (Path(overlay) if overlay else None)
    if ov is not None:
        if not ov.is_file():
            raise ParamsError(f"params overlay not found: {ov} (unset {OVERLAY_ENV} or run make workstation-envs)")
        raw = _merge(raw, read_yaml_mapping(ov))
        p = Path(f"{p} + overlay {ov}")
    for o in overrides:
        apply_override(raw, o)
    try:
        return Params.model_validate(raw)
    except ShapeInvalid as exc:
        over = [o for o in overrides if o.split("=", 1)[0].strip().startswith("checkpoint")]
        where = f"-p {over[0].split('=', 1)[0].strip()}" if over else str(p)
        raise ShapeInvalid(f"{where}: key 'checkpoint.shape': {exc}") from None
    except ValidationError as exc:
        keys = tuple(o.split("=", 1)[0].strip() for o in overrides)
        raise ParamsError(_explain(exc, str(p), keys)) from None


def dump_params(params: Params, path: str | Path) -> Path:
    """Write the resolved params as YAML (what a run actually used). Returns the path."""

    text = yaml.safe_dump(params.model_dump(mode="json"), sort_keys=False)
    return atomic_write(Path(path), lambda tmp: tmp.write_text(text))

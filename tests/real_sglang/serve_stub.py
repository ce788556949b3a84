"""SGLang 0.5.23's real HTTP/OpenAI layer over a stub engine (test code; run by .venv-sglang).

Usage: ``python serve_stub.py --data OUTPUTS.json serve <sglang serve flags>``. The flags are
parsed by SGLang's own parser (``ServerArgs.add_cli_args``, ``sglang/srt/server_args.py`` 351)
and published with SGLang's test hook ``get_context().override_server_args(...)``
(``runtime_context.py`` 1177). Everything a client sees is SGLang's: ``http_server.app``
(its lifespan builds ``OpenAIServingChat``, the ``/metrics`` mount from
``add_prometheus_middleware``), the pydantic protocol models, the reasoning parser, and
``TokenizerMetricsCollector`` for the Prometheus counters. The per-request spec fields are made
by SGLang's ``TokenizerManager._calculate_spec_decoding_metrics`` (``tokenizer_manager.py``
3138-3203) from raw counts, as the real tokenizer manager does with the scheduler's counts.

Only the engine is ours (:class:`StubTokenizerManager`): it answers from canned outputs in a
JSON file (see ``outputs.json``): per output the token ids and their text, and the tokens each
forward pass produced (``steps``: the prefill's token, then 1 + accepted drafts per verify pass).

Two import shims: torchvision (PyPI's wheel is built for CUDA torch) is stubbed after
transformers has cached that it is absent; Triton is covered by SGLang's own platform stub.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.abc
import importlib.machinery
import json
import sys
import time
import types
from http import HTTPStatus
from pathlib import Path
from types import SimpleNamespace


# --- import shims ----------------------------------------------------------------------------
class _Anything:
    def __init__(self, *a, **k):
        pass

    def __call__(self, *a, **k):
        return _Anything()

    def __getattr__(self, name):
        return _Anything()

    def __mro_entries__(self, bases):
        return (object,)


class _StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything()


class _TorchvisionStub(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``import torchvision[.x]`` gives inert modules: SGLang's multimodal code imports it at
    module level, and nothing this server runs uses it."""

    def find_spec(self, name, path=None, target=None):
        if name == "torchvision" or name.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        m = _StubModule(spec.name)
        m.__path__ = []
        return m

    def exec_module(self, module):
        pass


def install_shims() -> None:
    from transformers.utils import import_utils

    # transformers caches this (lru_cache): False now, so it never asks the stub's version
    assert not import_utils.is_torchvision_available()
    sys.meta_path.insert(0, _TorchvisionStub())


# --- the canned outputs ----------------------------------------------------------------------
def load_outputs(path: str) -> dict:
    """Read and check the canned-output file (see ``outputs.json``)."""
    data = json.loads(Path(path).read_text())
    for o in data["outputs"]:
        for v in (o, o.get("thinking") or o):
            if len(v["token_ids"]) != len(v["texts"]) or sum(v["steps"]) != len(v["token_ids"]):
                raise ValueError(f"output {o['name']!r}: token_ids, texts and steps disagree")
    return data


def pick_output(data: dict, last_user: str) -> dict:
    """The first output whose ``match`` occurs in the last user message ("" matches all)."""
    for o in data["outputs"]:
        if o.get("match", "") in last_user:
            return o
    raise ValueError(f"no canned output matches {last_user[:80]!r}")


def forward_passes(out: dict, n_tokens: int, draft_tokens: int | None) -> list[int]:
    """Tokens per forward pass for the first ``n_tokens`` tokens: with speculation the output's
    ``steps``, each split into passes of at most ``draft_tokens`` (a verify pass yields at most
    draft_tokens - 1 accepted drafts + 1 bonus token) and cut at ``n_tokens``; without, one
    token per pass."""
    if not draft_tokens:
        return [1] * n_tokens
    steps, done = [], 0
    for s in out["steps"]:
        while s > 0 and done < n_tokens:
            steps.append(min(s, draft_tokens, n_tokens - done))
            s -= steps[-1]
            done += steps[-1]
    return steps


# --- the tokenizer ---------------------------------------------------------------------------
# The chat template renders thinking on/off the way Ling-3's does in effect: the generation
# prompt opens a <think> block, closed at once when ``enable_thinking`` is false.
CHAT_TEMPLATE = (
    "{% for m in messages %}<role>{{ m['role'] }}</role>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<role>assistant</role>"
    "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% else %}<think>{% endif %}"
    "{% endif %}")


def make_tokenizer():
    """A byte-level tokenizer (any text round-trips) with ``<think>``/``</think>`` as added
    tokens and :data:`CHAT_TEMPLATE`; built in memory, nothing downloaded."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>")
    fast.add_tokens(["<think>", "</think>"])
    fast.chat_template = CHAT_TEMPLATE
    return fast


# --- the stub engine -------------------------------------------------------------------------
class _ModelConfig(SimpleNamespace):
    """The few ``ModelConfig`` fields the HTTP layer reads; any other optional one is None."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return None


class StubTokenizerManager:
    """What SGLang's HTTP layer calls on its ``TokenizerManager``, answered from canned data.

    ``generate_request`` yields the dicts the real one yields (``tokenizer_manager.py``
    2507-2560, 2740-2760): cumulative ``text`` and ``output_ids``, ``meta_info`` with ``id``,
    ``finish_reason``, ``prompt_tokens``, ``completion_tokens``, ``cached_tokens``,
    ``reasoning_tokens``, ``weight_version``, and on the last output ``e2e_latency`` and the spec
    fields computed by SGLang's own ``_calculate_spec_decoding_metrics``.
    """

    is_generation = True
    gracefully_exit = False

    def __init__(self, server_args, data: dict, step_s: float):
        from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat
        from sglang.srt.managers.tokenizer_manager import ServerStatus, TokenizerManager
        from sglang.srt.runtime_context import get_context

        self._tm_cls, self._status = TokenizerManager, ServerStatus
        # SGLang's own lookup: manager-owned fields from self, the rest from the published config
        type(self).config_value = TokenizerManager.config_value
        leaf = get_context().config_leaf
        self.serving_chat_class = OpenAIServingChat
        self.server_args, self.data, self.step_s = server_args, data, step_s
        self.tokenizer, self.processor = make_tokenizer(), None
        self.model_path = leaf("model_path")
        self.served_model_name = leaf("served_model_name") or self.model_path
        hf = SimpleNamespace(model_type="bailing_moe_v3", architectures=["BailingMoeV3ForCausalLM"],
                             id2label={0: "LABEL_0"})  # the classify handler's init reads it
        self.model_config = _ModelConfig(
            hf_config=hf, is_multimodal=False, is_image_understandable_model=False,
            is_audio_understandable_model=False, get_default_sampling_params=lambda: {})
        self.server_status = ServerStatus.Starting
        self.last_receive_tstamp = 0.0
        self.rid_to_state: dict = {}
        self.request_logger = SimpleNamespace(log_requests=False)
        self.startup_time = time.time()
        self.metrics_collector = None
        if leaf("enable_metrics"):
            from sglang.srt.observability.metrics_collector import (
                TokenizerMetricsCollector,
                tokenizer_metric_labels,
            )
            self.metrics_collector = TokenizerMetricsCollector(
                server_args=server_args, labels=tokenizer_metric_labels())

    def is_ready(self) -> bool:
        return self.server_status == self._status.Up

    def create_abort_task(self, obj):
        return None

    async def get_internal_state(self):
        return [{"avg_spec_accept_length": None, "last_gen_throughput": None}]

    async def flush_cache(self, timeout_s: float = 0.0):
        return SimpleNamespace(success=True, message="")

    async def generate_request(self, obj, request=None):
        from sglang.srt.runtime_context import get_spec

        t0 = time.time()
        obj.normalize_batch_and_arguments() if hasattr(obj, "normalize_batch_and_arguments") else None
        prompt_ids = obj.input_ids if obj.input_ids is not None else self.tokenizer.encode(obj.text)
        prompt = self.tokenizer.decode(prompt_ids)
        last = prompt.rsplit("<role>user</role>", 1)[-1]
        thinking = not prompt.endswith("<think></think>")
        out = pick_output(self.data, last) if len(prompt_ids) > 1 else self.data["outputs"][0]
        if thinking and "thinking" in out:  # what the model writes with the <think> block open
            out = {**out, **out["thinking"]}
        max_new = (obj.sampling_params or {}).get("max_new_tokens") or len(out["token_ids"])
        n = min(max_new, len(out["token_ids"]))
        draft = get_spec().speculative_num_draft_tokens if get_spec().speculative_algorithm else None
        steps = forward_passes(out, n, draft)
        abort_at = out.get("abort_after_passes")
        text, ids, done = "", [], 0
        for k, step in enumerate(steps):
            await asyncio.sleep(self.step_s)
            self.last_receive_tstamp = time.time()
            ids += out["token_ids"][done:done + step]
            text += "".join(out["texts"][done:done + step])
            done += step
            final = done == n
            finish = None
            if abort_at is not None and k + 1 >= abort_at:
                finish = {"type": "abort", "message": out.get("abort_message", "Generation aborted."),
                          "status_code": HTTPStatus.INTERNAL_SERVER_ERROR}
            elif final:
                finish = ({"type": "stop", "matched": out.get("matched_stop")} if n == len(out["token_ids"])
                          else {"type": "length", "length": n})
            meta = {"id": obj.rid, "finish_reason": finish, "prompt_tokens": len(prompt_ids),
                    "weight_version": self.config_value("weight_version"), "num_retractions": 0,
                    "reasoning_tokens": 0, "completion_tokens": done, "cached_tokens": 0}
            if finish is not None:
                meta["e2e_latency"] = time.time() - t0
                self._finish(meta, obj, steps[:k + 1], done, len(prompt_ids), t0)
            if finish is not None and finish["type"] == "abort" and not obj.stream:
                # what TokenizerManager._handle_abort_finish_reason does (tokenizer_manager.py
                # 1916-1921): a non-streamed abort with an error status is an HTTP error
                import fastapi

                raise fastapi.HTTPException(status_code=finish["status_code"], detail=finish["message"])
            if obj.stream or finish is not None:
                yield {"text": text, "output_ids": list(ids), "meta_info": meta}
            if finish is not None:
                return

    def _finish(self, meta: dict, obj, steps: list[int], n: int, n_prompt: int, t0: float) -> None:
        """Raw counts -> SGLang's own spec fields and Prometheus counters."""
        from sglang.srt.runtime_context import get_spec

        draft = get_spec().speculative_num_draft_tokens or 1
        verify = steps[1:]  # the first pass is the prefill's; each later one is a verify pass
        hist = [0] * max(draft, 1)
        for s in verify:
            hist[s - 1] += 1
        recv = SimpleNamespace(
            spec_verify_ct=[len(verify)] if get_spec().speculative_algorithm else [0],
            spec_num_correct_drafts=[sum(s - 1 for s in verify)], completion_tokens=[n],
            spec_correct_drafts_histogram=[hist], spec_num_cap_tokens=None,
            spec_num_block_accept_tokens=None, spec_cap_lens_histogram=None)
        if get_spec().speculative_algorithm:
            self._tm_cls._calculate_spec_decoding_metrics(self, meta, recv, 0)
        if self.metrics_collector is not None and getattr(obj, "log_metrics", True):
            from sglang.srt.observability.metrics_collector import tokenizer_metric_labels

            self.metrics_collector.observe_one_finished_request(
                tokenizer_metric_labels(), n_prompt, n, 0, time.time() - t0, False, None,
                spec_verify_ct=recv.spec_verify_ct[0], is_streaming=bool(obj.stream))


# --- the server ------------------------------------------------------------------------------
# ServerArgs fields taken from the command line; the rest keep SGLang's defaults.
PUBLISHED = ("model_path", "served_model_name", "host", "port", "tp_size", "ep_size",
             "context_length", "enable_metrics", "reasoning_parser", "tool_call_parser",
             "speculative_algorithm", "speculative_num_steps", "speculative_eagle_topk",
             "speculative_num_draft_tokens", "enable_deterministic_inference", "weight_version",
             "disable_shared_experts_fusion", "mem_fraction_static", "max_running_requests",
             "chunked_prefill_size")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="serve_stub")
    ap.add_argument("--data", required=True)
    ap.add_argument("--step-s", type=float, default=0.002)
    ap.add_argument("rest", nargs=argparse.REMAINDER)
    a = ap.parse_args(argv)
    if a.rest[:1] != ["serve"]:
        print("serve_stub: expected 'serve <flags>'", file=sys.stderr)
        return 2
    data = load_outputs(a.data)
    install_shims()
    from sglang.srt.utils.common import set_prometheus_multiproc_dir

    set_prometheus_multiproc_dir()  # before prometheus_client is imported, as launch_server does
    import uvicorn
    from sglang.srt.entrypoints import http_server
    from sglang.srt.parser.template_manager import TemplateManager
    from sglang.srt.runtime_context import get_context
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)  # SGLang's own flag definitions: an unknown flag exits 2
    raw = parser.parse_args(a.rest[1:])
    fields = {k: getattr(raw, k) for k in PUBLISHED if getattr(raw, k, None) is not None}
    if fields.get("speculative_algorithm") == "NEXTN":  # server_args.py resolves NEXTN to EAGLE
        fields["speculative_algorithm"] = "EAGLE"
    fields["skip_server_warmup"] = True
    server_args = get_context().override_server_args(**fields).install()
    print(f"server_args=ServerArgs({', '.join(f'{k}={v!r}' for k, v in fields.items())})", flush=True)

    tm = StubTokenizerManager(server_args, data, a.step_s)
    template_manager = TemplateManager()
    template_manager.initialize_templates(tokenizer_manager=tm, model_path=tm.model_path)
    http_server.set_global_state(http_server._GlobalState(
        tokenizer_manager=tm, template_manager=template_manager,
        scheduler_info={"max_req_input_len": 32768}))
    app = http_server.app
    app.is_single_tokenizer_mode = True
    app.server_args = server_args
    app.warmup_thread_kwargs = {"server_args": server_args}  # skip_server_warmup: marks Up
    print("Load weight end. elapsed=0.00 s, type=BailingMoeV3ForCausalLM (stub engine)", flush=True)
    leaf = get_context().config_leaf
    uvicorn.run(app, host=leaf("host"), port=leaf("port"), log_level="warning",
                timeout_keep_alive=5)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

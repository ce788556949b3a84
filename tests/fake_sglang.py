"""A fake SGLang 0.5.23 server for tests (test code only; the study never uses it).

Run as an "interpreter": :func:`make_interpreter` writes an executable script that the study's
``server.python`` can point at. It answers the three ways the study calls an interpreter:
``-c <version probe>`` (prints the sglang version), ``-c <GPU probe>`` (prints a capability or
None) and ``-c <serve code> serve --model-path ... --port ...`` (serves HTTP on 127.0.0.1).

The served protocol follows 0.5.23's source: ``/health_generate`` and ``/health`` answer 503
while starting; ``/v1/chat/completions`` streams SSE with chunked transfer encoding (as uvicorn
does): role chunk, text chunks with continuous usage, finish chunk, a ``choices: []`` chunk with
``sglext`` (``spec_tokens_details``, ``output_ids``), a ``choices: []`` usage chunk, then
``data: [DONE]``; ``/metrics`` in Prometheus text with the tokenizer counters; ``/server_info``,
``/model_info``, ``/flush_cache``. ``tests/test_real_vs_fake.py`` checks every response shape
against SGLang's real HTTP layer (``tests/real_sglang``) for the same answer. Its stdout is the "log": lines in SGLang's format, including
the card's clamp lines.

Per-request faults are triggered by a marker in the last user message: ``[[fake:cut=N]]`` (drop
the connection mid-chunk after N text chunks), ``[[fake:nodone]]`` (end cleanly without
``[DONE]``), ``[[fake:nousage]]``, ``[[fake:nofinish]]``, ``[[fake:errorchunk]]``,
``[[fake:http500]]``, ``[[fake:die]]`` (the server exits mid-stream).

Scripted answers (``replies``): the first rule whose ``mode`` is the clamp mode this launch
served (``None`` = any; the mode is the one its clamp lines show, so with ``clamp_form:
install`` the mode the study's patcher put in the install) and whose ``match`` occurs in the
last user message answers with ``content`` (finish reason ``stop``); no rule, the word stream.
With ``strand_with_parser`` a launch with ``--reasoning-parser`` puts a thinking-off answer in
``reasoning_content`` and leaves ``content`` empty (the card's ``serve.reasoning-parser``
observation). ``request_log`` names a file that gets one JSON line per chat request.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

DEFAULTS = {
    "version": "0.5.23",
    "gpu": [10, 0, "NVIDIA Fake Blackwell", 128_000_000_000],
    "listen_delay_s": 0.2,      # before the HTTP server listens (connection refused meanwhile)
    "starting_s": 0.5,          # /health_generate answers 503 for this long after listening
    "die_during_load": False,   # print a traceback and exit 1 while loading
    "never_healthy": False,     # /health_generate stays 503 forever
    "ignore_sigterm": False,    # needs SIGKILL to stop
    "spawn_child": True,        # a "scheduler" child process in the same process group
    "daemonize": None,          # "keep_env"/"clear_env": leave a double-forked setsid daemon
                                # (ignores SIGTERM; "clear_env" also empties its environment)
    "step_s": 0.002,            # seconds per decode step
    "prefill_s": 0.01,
    "accept_rate": 0.8,         # probability a draft token is accepted (deterministic per prompt)
    "verify_cost": 0.25,        # a speculative step costs step_s * (1 + verify_cost * draft tokens)
    "diverge_spec": True,       # with speculation (not deterministic mode) some prompts diverge
    "background_traffic": False,  # another client's tokens keep moving the counters (F-10)
    "clamp_form": "card",       # "card": the card's line; "exact"/"none": the study's patch lines;
                                # "stock": no lines; "install": read the mode from sglang_origin's tree
    "sglang_origin": None,      # what find_spec('sglang').origin reports (an installed tree)
    "expert_limits": {str(i): 4 for i in range(35, 42)},
    "num_layers": 42,
    "first_dense": 2,
    "mem_usage_gb": 71.80,
    "load_elapsed_s": 297.5,
    "gate_up_warning": False,
    "replies": [],              # [{"mode": str|None, "match": str|None, "content": str}], first match
    "strand_with_parser": False,  # --reasoning-parser + thinking off: answer in reasoning_content
    "request_log": None,        # a file: one JSON line per chat request (counts them across launches)
    "packages": {},             # preflight's probe: {distribution: version} (sglang: "version")
    "torch_cuda": "13.0",       # preflight's probe: torch.version.cuda
}

WORDS = ("the quick brown fox jumps over a lazy dog while binary search splits sorted arrays "
         "into halves and a stack pushes items then pops them back in reverse order").split()


def make_interpreter(folder: str | Path, **behaviour) -> Path:
    """Write ``folder/python`` (executable) running this fake with ``behaviour`` overrides."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    cfg = folder / "fake.json"
    cfg.write_text(json.dumps({**DEFAULTS, **behaviour}))
    exe = folder / "python"
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} {Path(__file__).resolve()} --fake-config {cfg} \"$@\"\n")
    exe.chmod(0o755)
    return exe


def log(msg: str, rank: str = " TP0") -> None:
    print(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}{rank}] {msg}", flush=True)


class Fake:
    def __init__(self, cfg: dict, args: dict, mode: str = "card"):
        self.cfg, self.args, self.mode = cfg, args, mode
        self.started = None
        self.lock = threading.Lock()
        self.counters = {"sglang:generation_tokens_total": 0.0, "sglang:spec_verify_calls_total": 0.0,
                         "sglang:prompt_tokens_total": 0.0, "sglang:num_requests_total": 0.0}
        self.depth = int(args["--speculative-num-steps"]) if "--speculative-algorithm" in args else 0
        self.draft = int(args.get("--speculative-num-draft-tokens", self.depth + 1)) if self.depth else 0
        self.deterministic = "--enable-deterministic-inference" in args

    # text generation: deterministic per prompt; speculation may change it (F-09)
    def tokens_for(self, prompt: str, n: int) -> list[int]:
        seed = int(hashlib.sha256(prompt.encode()).hexdigest(), 16)
        ids = [(seed >> (i % 200)) % len(WORDS) for i in range(n)]
        if self.depth and self.cfg["diverge_spec"] and not self.deterministic and seed % 3 != 0:
            k = 5 + seed % 7
            if k < n:
                ids[k] = (ids[k] + 1) % len(WORDS)
        return ids

    def reply_for(self, last: str) -> str | None:
        """The scripted answer to a request (module docstring), or None."""
        for rule in self.cfg["replies"]:
            if rule.get("mode") in (None, self.mode) and (rule.get("match") or "") in last:
                return rule["content"]
        return None

    def metrics_text(self) -> str:
        lines = []
        for name, v in self.counters.items():
            base = name[: -len("_total")]
            lines += [f"# HELP {base} fake", f"# TYPE {base} counter",
                      f'{name}{{model_name="default",is_streaming="true"}} {v}',
                      f'{name}{{model_name="default",is_streaming="false"}} 0.0']
        lines += ["# HELP sglang:spec_accept_length fake", "# TYPE sglang:spec_accept_length gauge",
                  f'sglang:spec_accept_length{{model_name="default",tp_rank="0"}} {1.0 + self.depth * 0.5}',
                  "# HELP sglang:e2e_request_latency_seconds fake",
                  "# TYPE sglang:e2e_request_latency_seconds histogram",
                  'sglang:e2e_request_latency_seconds_bucket{le="1.0",model_name="default"} 3.0',
                  'sglang:e2e_request_latency_seconds_bucket{le="+Inf",model_name="default"} 3.0',
                  'sglang:e2e_request_latency_seconds_count{model_name="default"} 3.0',
                  'sglang:e2e_request_latency_seconds_sum{model_name="default"} 1.5']
        return "\n".join(lines) + "\n"

    def background(self) -> None:
        while True:
            time.sleep(0.05)
            with self.lock:
                self.counters["sglang:generation_tokens_total"] += 7
                self.counters["sglang:spec_verify_calls_total"] += 3


def handler_for(fake: Fake):
    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *a):  # keep the "server log" to SGLang-like lines
            pass

        def _send(self, code: int, body: bytes = b"", ctype: str = "application/json") -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def healthy(self) -> bool:
            return (not fake.cfg["never_healthy"]) and time.monotonic() - fake.started >= fake.cfg["starting_s"]

        def do_GET(self):
            p = self.path.split("?")[0]
            if p in ("/health", "/health_generate"):
                self._send(200 if self.healthy() else 503)
            elif p == "/ready":
                self._send(200 if self.healthy() else 503)
            elif p == "/metrics":
                with fake.lock:
                    self._send(200, fake.metrics_text().encode(), "text/plain; version=0.0.4")
            elif p == "/server_info":
                a = fake.args
                info = {"model_path": a.get("--model-path"), "tp_size": int(a.get("--tp-size", 1)),
                        "speculative_algorithm": "EAGLE" if fake.depth else None,
                        "speculative_num_steps": fake.depth or None,
                        "speculative_num_draft_tokens": fake.draft or None,
                        "enable_deterministic_inference": fake.deterministic,
                        "disable_shared_experts_fusion": "--disable-shared-experts-fusion" in a,
                        "tool_call_parser": a.get("--tool-call-parser"),
                        "reasoning_parser": a.get("--reasoning-parser"),
                        "launch_command": sys.argv, "version": fake.cfg["version"],
                        "internal_states": [{"avg_spec_accept_length": 1.0 + fake.depth * 0.5}]}
                self._send(200, json.dumps(info).encode())
            elif p == "/model_info":
                self._send(200, json.dumps({"model_path": fake.args.get("--model-path"),
                                            "reasoning_parser": fake.args.get("--reasoning-parser"),
                                            "tool_call_parser": fake.args.get("--tool-call-parser"),
                                            "architectures": ["BailingMoeV3ForCausalLM"]}).encode())
            else:
                self._send(404, b'{"detail":"Not Found"}')

        def do_POST(self):
            n = int(self.headers.get("Content-Length", 0))
            raw = self.rfile.read(n) if n else b""
            p = self.path.split("?")[0]
            if p == "/flush_cache":
                self._send(200, b"Cache flushed.\n", "text/plain")
            elif p == "/v1/chat/completions":
                self.chat(json.loads(raw or b"{}"))
            elif p == "/generate":
                self.generate(json.loads(raw or b"{}"))
            else:
                self._send(404, b'{"detail":"Not Found"}')

        def chunk(self, text: str) -> None:
            data = text.encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def generate(self, req: dict) -> None:
            """SGLang's native ``/generate`` with ``input_ids`` (the fields ``client.generate``
            reads): greedy word ids fixed by the input ids, each with logprob -0.5; with
            ``return_logprob`` the input tokens' logprobs from ``logprob_start_len`` on (None at
            the first position, as SGLang gives), each -0.25."""
            if not self.healthy():
                self._send(503)
                return
            ids_in = [int(x) for x in req.get("input_ids") or []]
            n = int((req.get("sampling_params") or {}).get("max_new_tokens") or 16)
            out = fake.tokens_for(json.dumps(ids_in), n)
            start = int(req.get("logprob_start_len") or 0)
            meta = {"finish_reason": {"type": "length"}, "completion_tokens": len(out),
                    "output_token_logprobs": [[-0.5, t, None] for t in out],
                    "input_token_logprobs": [[None if i == 0 else -0.25, t, None]
                                             for i, t in enumerate(ids_in[start:])]}
            body = {"text": "".join(" " + WORDS[t] for t in out), "meta_info": meta}
            self._send(200, json.dumps(body).encode())

        def chat(self, req: dict) -> None:
            if not self.healthy():
                self._send(503)
                return
            msgs = req.get("messages") or []
            prompt = json.dumps(msgs, sort_keys=True)
            last = msgs[-1]["content"] if msgs else ""
            faults = dict(re.findall(r"\[\[fake:(\w+)(?:=(\d+))?\]\]", last))
            if "http500" in faults:
                self._send(500, b'{"object":"error","message":"boom","type":"InternalServerError","code":500}')
                return
            max_toks = int(req.get("max_completion_tokens") or req.get("max_tokens") or 16)
            ids = fake.tokens_for(prompt, max_toks)
            text_parts, finish = [" " + WORDS[t] for t in ids], "length"
            reply = fake.reply_for(last)
            if reply is not None:  # token-like pieces: a word with the whitespace after it
                text_parts, finish = re.findall(r"\S+\s*|\s+", reply), "stop"
                ids = [sum(map(ord, t)) % 50_000 for t in text_parts]
            thinking = (req.get("chat_template_kwargs") or {}).get("enable_thinking", True)
            field = ("reasoning_content" if fake.cfg["strand_with_parser"] and not thinking
                     and fake.args.get("--reasoning-parser") else "content")
            if fake.cfg["request_log"]:
                with fake.lock, open(fake.cfg["request_log"], "a") as fh:
                    fh.write(json.dumps({"pid": os.getpid(), "mode": fake.mode, "stream": bool(req.get("stream")),
                                         "reasoning_parser": fake.args.get("--reasoning-parser"),
                                         "thinking": thinking, "scripted": reply is not None,
                                         "field": field, "last": last}) + "\n")
            # speculative steps: tokens per step = 1 + accepted drafts (deterministic per prompt)
            steps, correct, hist = [], 0, [0] * max(fake.draft, 1)
            seed = int(hashlib.sha256(prompt.encode()).hexdigest()[:8], 16)
            produced = 1  # the prefill's token
            steps.append(1)
            i = 0
            while produced < len(ids):
                if fake.depth:
                    acc = 0
                    while acc < fake.draft - 1 and ((seed >> ((i + acc) % 24)) & 0xFF) / 256 < fake.cfg["accept_rate"]:
                        acc += 1
                    acc = min(acc, len(ids) - produced - 1)
                    correct += acc
                    hist[acc] += 1
                    steps.append(acc + 1)
                    produced += acc + 1
                else:
                    steps.append(1)
                    produced += 1
                i += 1
            verify_ct = len(steps) - 1 if fake.depth else 0
            prompt_tokens = len(prompt) // 4
            stream = req.get("stream", False)
            rid = "chatcmpl-" + hashlib.md5(f"{prompt}{time.time()}".encode()).hexdigest()[:12]
            spec = None
            if fake.depth and req.get("return_spec_tokens_details"):
                proposed = verify_ct * (fake.draft - 1)
                spec = {"spec_accept_rate": correct / proposed if proposed else 0.0,
                        "spec_accept_length": len(ids) / verify_ct if verify_ct else 0.0,
                        "spec_cap_length": 0.0, "spec_block_accept_length": 0.0,
                        "spec_num_correct_drafts": correct, "spec_num_proposed_drafts": proposed,
                        "spec_verify_ct": verify_ct, "spec_correct_drafts_histogram": hist,
                        "spec_cap_lens_histogram": []}

            def account():
                with fake.lock:
                    fake.counters["sglang:generation_tokens_total"] += len(ids)
                    fake.counters["sglang:spec_verify_calls_total"] += verify_ct
                    fake.counters["sglang:prompt_tokens_total"] += prompt_tokens
                    fake.counters["sglang:num_requests_total"] += 1
                # SGLang's decode log line (managers/scheduler_components/metrics_reporter.py:963 the
                # head, :1005 accept len/rate, :1039-1043 graph, throughput, queue; usage parts of a
                # hybrid (mamba) model: pool_stats_observer.py:128-137), one per request here (the
                # real server: one per --decode-log-interval steps)
                acc = ""
                if fake.depth and verify_ct:
                    acc = (f"accept len: {len(ids) / verify_ct:.2f}, "
                           f"accept rate: {correct / (verify_ct * (fake.draft - 1)):.2f}, ")
                tps = len(ids) / max(fake.cfg["step_s"] * len(steps), 1e-6)
                log(f"Decode batch, #running-req: 1, #full token: {len(ids)}, full token usage: 0.01, "
                    f"mamba num: 2, mamba usage: 0.01, {acc}cuda graph: True, "
                    f"gen throughput (token/s): {tps:.2f}, #queue-req: 0")

            usage_final = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + len(ids),
                           "completion_tokens": len(ids), "prompt_tokens_details": None,
                           "reasoning_tokens": 0, "completion_tokens_details": None}
            if not stream:
                time.sleep(fake.cfg["prefill_s"] + fake.cfg["step_s"] * len(steps))
                account()
                body = {"id": rid, "object": "chat.completion", "created": int(time.time()),
                        "model": req.get("model", "default"),
                        "choices": [{"index": 0, "message": {"role": "assistant", "content": "",
                                                             "reasoning_content": None,
                                                             field: "".join(text_parts)},
                                     "logprobs": None, "finish_reason": finish, "matched_stop": None}],
                        "usage": usage_final, "metadata": {"weight_version": "default"}}
                ext = {}
                if spec:
                    ext["spec_tokens_details"] = spec
                if req.get("return_output_ids_in_sglext"):
                    ext["output_ids"] = [ids]
                if ext:
                    body["sglext"] = ext
                self._send(200, json.dumps(body).encode())
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            base = {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()),
                    "model": req.get("model", "default")}

            def sse(obj) -> None:
                self.chunk("data: " + json.dumps(obj) + "\n\n")

            sse({**base, "choices": [{"index": 0, "delta": {"reasoning_content": None, "role": "assistant",
                                                            "content": ""}, "logprobs": None,
                                      "finish_reason": None, "matched_stop": None}]})
            time.sleep(fake.cfg["prefill_s"])
            pos = 0
            for n_chunk, step in enumerate(steps):
                if "cut" in faults and n_chunk >= int(faults["cut"] or 0):
                    self.wfile.write(b"40\r\ndata: {\"id\": \"trunc")  # half a chunk, then drop
                    self.wfile.flush()
                    self.connection.shutdown(2)
                    self.close_connection = True
                    return
                if "die" in faults and n_chunk >= 3:
                    os._exit(3)
                if "errorchunk" in faults and n_chunk >= 2:
                    sse({"error": {"object": "error", "message": "Generation aborted.",
                                   "type": "InternalServerError", "param": None, "code": 500}})
                    self.chunk("data: [DONE]\n\n")
                    self.chunk("")
                    return
                if n_chunk:
                    time.sleep(fake.cfg["step_s"] * (1 + fake.cfg["verify_cost"] * fake.draft))
                delta = "".join(text_parts[pos:pos + step])
                pos += step
                sse({**base, "choices": [{"index": 0, "delta": {"reasoning_content": None, "content": None,
                                                                field: delta},
                                          "logprobs": None, "finish_reason": None, "matched_stop": None}],
                     "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": pos,
                               "total_tokens": prompt_tokens + pos, "prompt_tokens_details": None,
                               "reasoning_tokens": 0, "completion_tokens_details": None}})
            account()
            if "nofinish" not in faults:
                sse({**base, "choices": [{"index": 0, "delta": {"reasoning_content": None}, "logprobs": None,
                                          "finish_reason": finish, "matched_stop": None}]})
            ext = {}
            if spec:
                ext["spec_tokens_details"] = spec
            if req.get("return_output_ids_in_sglext"):
                ext["output_ids"] = [ids]
            if ext:
                sse({**base, "choices": [], "usage": None, "sglext": ext})
            if "nousage" not in faults:
                sse({**base, "choices": [], "usage": usage_final})
            if "nodone" not in faults:
                self.chunk("data: [DONE]\n\n")
            self.chunk("")  # terminating chunk

    return H


def parse_serve_args(argv: list[str]) -> dict:
    args, i = {}, 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("--") and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            args[a], i = argv[i + 1], i + 2
        else:
            args[a], i = True, i + 1
    return args


def log_clamp(form: str, lim, layer: int) -> None:
    """One clamp line in the card's form or the study's patch form (patches/0.5.23/*)."""
    lim_s = "None" if not lim else f"{float(lim):g}"
    if form == "card":
        log(f"[swiglu-clamp-patch] cutlass nvfp4 limit={lim_s}")
    elif form == "exact":
        log(f"[swiglu-clamp-patch] cutlass nvfp4 limit={lim_s} mode=exact "
            f"form={'SwigluStep' if lim else 'Swiglu'} layer={layer}")
    elif form == "none":
        log(f"[swiglu-clamp-patch] cutlass nvfp4 limit=None mode=none config_limit={lim_s} layer={layer}")


def model_shape(cfg: dict, args: dict) -> dict:
    """Layers and clamp list from ``<model-path>/config.json`` when it exists, else the fake's."""
    conf = Path(str(args.get("--model-path", ""))) / "config.json"
    if conf.is_file():
        c = json.loads(conf.read_text())
        lst = c.get("expert_swiglu_limit_list") or []
        out = {"num_layers": c["num_hidden_layers"], "first_dense": c.get("first_k_dense_replace", 0),
               "expert_limits": {str(i): v for i, v in enumerate(lst) if v}}
        if c.get("fake_broken_draft"):  # a test checkpoint whose draft layer drafts garbage (F-08)
            out["accept_rate"] = 0.0
        return out
    return {k: cfg[k] for k in ("num_layers", "first_dense", "expert_limits", "accept_rate")}


def startup_log(cfg: dict, args: dict) -> str:
    """Print the load log; returns the clamp form it showed (for ``install``: the mode found)."""
    cfg = {**cfg, **model_shape(cfg, args)}
    # the real lines' format strings, SGLang 0.5.23 (sglang/srt/...): model_executor/model_runner.py:1274
    log("Load weight begin. avail mem=120.00 GB")
    if cfg["gate_up_warning"]:
        log("w1_weight_global_scale must match w3_weight_global_scale. Accuracy may be affected.")
    if args.get("--reasoning-parser") == "auto":
        log("Auto-detected --reasoning-parser as 'ling3' from model architecture 'BailingMoeV3ForCausalLM'", "")
    limits = {int(k): v for k, v in cfg["expert_limits"].items()}
    form = cfg["clamp_form"]
    if form == "install":  # the mode the study's patch put in the "installed" tree, if any
        src = (Path(cfg["sglang_origin"]).parent / "srt/layers/quantization/compressed_tensors/schemes/"
               "compressed_tensors_w4a4_nvfp4_moe.py").read_text()
        form = next((m for m in ("exact", "none") if f"mode={m} " in src or f"mode={m}:" in src), "stock")
        log(f"fake: install clamp mode {form}")
    for layer in range(cfg["first_dense"], cfg["num_layers"]):
        log_clamp(form, limits.get(layer), layer)
    # model_executor/model_runner.py:1373-1380 (quant_str: configs/model_config.py:1899-1916)
    log(f"Load weight end. elapsed={cfg['load_elapsed_s']:.2f} s, type=BailingMoeV3ForCausalLM, "
        f"quant=compressed-tensors, avail mem=48.20 GB, mem usage={cfg['mem_usage_gb']:.2f} GB.")
    if "--speculative-algorithm" in args:
        log_clamp(form, None, 0)  # the NEXTN draft is built with layer_id=0: unclamped
        log("Load weight end. elapsed=4.10 s, type=BailingMoeForCausalLMNextN, avail mem=45.10 GB, mem usage=3.10 GB.")
    log("Memory pool end. avail mem=20.00 GB")  # mem_cache/kv_cache_configurator.py:498-501
    return form


DAEMON = """
import os, signal, sys, time  # fake-sglang-daemon {session}
if os.fork():
    os._exit(0)  # double fork (the first was started in a new session): an orphan
os.setsid()  # and in a session of its own again
signal.signal(signal.SIGTERM, signal.SIG_IGN)
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGHUP, signal.SIG_IGN)
if {clear}:
    os.execve(sys.executable, [sys.executable, "-c", "import time  # fake-sglang-daemon {session}\\nwhile True: time.sleep(0.2)"], {{}})
while True:
    time.sleep(0.2)
"""


#: what the study's stop sends first (SIGINT for SGLang launches, SIGTERM for others)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def spawn_daemon(clear_env: bool) -> None:
    """Start a daemon that leaves the server's session and process group (setsid + double fork),
    ignores SIGTERM and SIGINT and, with ``clear_env``, drops its environment (no inherited marker)."""
    code = DAEMON.format(session=os.environ.get("NVFP4STUDY_TEST_SESSION", "-"), clear=clear_env)
    subprocess.Popen([sys.executable, "-c", code], start_new_session=True).wait()


def probe_answer(cfg: dict, names: list[str], want_torch: bool) -> dict:
    """What ``workstation/probes.py``'s PROBE_CODE prints in an interpreter holding SGLang
    ``version`` with ``packages`` and a CUDA torch that sees ``gpu``."""
    pk = {"sglang": cfg["version"], **cfg["packages"]}
    out = {"python": "3.12.3", "executable": sys.argv[0], "packages": {n: pk.get(n) for n in names},
           "requires": {}, "sglang_origin": cfg["sglang_origin"]}
    if want_torch and pk.get("torch"):
        major, minor, name, total = cfg["gpu"] or (0, 0, "", 0)
        out.update(torch_cuda=cfg["torch_cuda"], cuda_available=bool(cfg["gpu"]),
                   gpus=[{"index": 0, "name": name, "capability": [major, minor], "total_bytes": total,
                          "free_bytes": total}] if cfg["gpu"] else [])
    return out


def main(argv: list[str]) -> int:
    cfg = dict(DEFAULTS)
    if argv[:1] == ["--fake-config"]:
        cfg.update(json.loads(Path(argv[1]).read_text()))
        argv = argv[2:]
    if argv[:1] != ["-c"] or len(argv) < 2:
        print("fake sglang interpreter: expected -c CODE", file=sys.stderr)
        return 2
    code, rest = argv[1], argv[2:]
    if "sglang_origin" in code and "importlib.metadata" in code:  # preflight's probe (probes.PROBE_CODE)
        print(json.dumps(probe_answer(cfg, json.loads(rest[0]), rest[1:2] == ["1"])))
        return 0
    if "find_spec" in code:
        print(cfg["sglang_origin"] or "")
        return 0 if cfg["sglang_origin"] else 1
    if "importlib.metadata" in code:
        print(cfg["version"])
        return 0
    if "torch" in code:
        print(repr(tuple(cfg["gpu"]) if cfg["gpu"] else None))
        return 0
    if "sglang.cli.main" not in code or rest[:1] != ["serve"]:
        print(f"fake sglang interpreter: unsupported -c code {code!r}", file=sys.stderr)
        return 2
    args = parse_serve_args(rest[1:])
    if cfg["ignore_sigterm"]:  # and SIGINT: the study stops SGLang with either (serving.server)
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
    child = None
    if cfg["spawn_child"]:
        child = subprocess.Popen([sys.executable, "-c", "import time  # fake-sglang-scheduler\nwhile True: time.sleep(0.2)"],
                                 preexec_fn=(lambda: [signal.signal(x, signal.SIG_IGN) for x in STOP_SIGNALS])
                                 if cfg["ignore_sigterm"] else None)
    if not cfg["ignore_sigterm"]:
        def on_term(signum, frame):  # like a server's graceful exit: stop the child, then itself
            if child is not None:
                with contextlib.suppress(OSError):
                    os.kill(child.pid, signal.SIGTERM)
                    os.waitpid(child.pid, 0)
            os._exit(0)
        for sig in STOP_SIGNALS:
            signal.signal(sig, on_term)
    if cfg["daemonize"]:
        spawn_daemon(cfg["daemonize"] == "clear_env")
    log(f"server_args=ServerArgs(model_path={args.get('--model-path')!r}, port={args.get('--port')})", "")
    mode = startup_log(cfg, args)
    if cfg["die_during_load"]:
        print("Traceback (most recent call last):\n  File \"model_runner.py\", line 1, in load_model\n"
              "ValueError: Current platform does not support NVFP4 quantization. Please use Blackwell and above.",
              flush=True)
        return 1
    time.sleep(cfg["listen_delay_s"])
    fake = Fake({**cfg, **model_shape(cfg, args)}, args, mode)
    class Server(ThreadingHTTPServer):
        def handle_error(self, request, client_address):  # a client hanging up is not news
            if not isinstance(sys.exc_info()[1], ConnectionError):
                super().handle_error(request, client_address)

    srv = Server((args.get("--host", "127.0.0.1"), int(args.get("--port", 30000))), handler_for(fake))
    srv.daemon_threads = True
    fake.started = time.monotonic()
    log(f"Uvicorn running on http://{args.get('--host')}:{args.get('--port')} (Press CTRL+C to quit)", "")
    if cfg["background_traffic"]:
        threading.Thread(target=fake.background, daemon=True).start()
    # entrypoints/http_server.py:2600
    threading.Timer(cfg["starting_s"], lambda: log("The server is fired up and ready to roll!", "")).start()
    srv.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Boot hook of the CPU engine's server processes (this folder is first on their PYTHONPATH).

It changes nothing on disk: SGLang's installed files stay as released. It installs

- :class:`_TorchvisionStub`: ``import torchvision`` gives inert modules. Server-args resolution
  imports it at module level (``srt/arg_groups/kv_shard_hook.py`` 17 -> ``srt/configs/__init__.py``
  71 -> ``srt/configs/nano_nemotron_vl.py`` 22 -> ``srt/multimodal/internvl_utils.py`` 5), so the
  launch dies with ``No module named 'torchvision'`` without it, and PyPI's torchvision is built
  for CUDA torch (``operator torchvision::nms does not exist`` on the CPU build); nothing a text
  model runs uses it. It is switched on only after transformers has cached that torchvision is
  absent (``transformers/utils/import_utils.py`` ``is_torchvision_available``), so transformers
  never takes the stand-in for a real torchvision.
- :data:`PATCHES`: in-memory monkeypatches applied right after the SGLang module they change is
  imported (a post-import hook, :class:`_PatchFinder`). Each names the SGLang 0.5.23 file:line
  (relative to ``sglang/srt/``) it works around and why.

The list is mirrored, for reports, by ``nvfp4study.serving.cpu_engine.describe()``.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types

#: the model modules the CPU engine serves (BailingMoeV3 and its NEXTN draft): the registry scan
#: imports only these (``SERVED_MODELS_ENV`` may name others, comma-separated)
SERVED_MODELS_ENV = "NVFP4STUDY_CPU_ENGINE_MODELS"
SERVED_MODELS = ("bailing_moe_v3", "bailing_moe_nextn")


def _registry_skips_unserved_models() -> None:
    # srt/models/registry.py 117-150: the model registry imports every module of srt/models
    # (about 250) to find each one's EntryClass, about 1.7 s of a 13 s CPU launch here.
    # SGLang's own SGLANG_DISABLED_MODEL_ARCHS (srt/environ.py 294, read at registry.py 123)
    # skips the named modules in that scan; an explicit import (bailing_moe_v3 importing another
    # model's module) is unaffected. Set only when the user has not set it.
    if "SGLANG_DISABLED_MODEL_ARCHS" in os.environ:
        return
    spec = importlib.util.find_spec("sglang")  # finds the package without running it
    if spec is None or not spec.submodule_search_locations:
        return
    keep = set(filter(None, os.environ.get(SERVED_MODELS_ENV, ",".join(SERVED_MODELS)).split(",")))
    folder = os.path.join(list(spec.submodule_search_locations)[0], "srt", "models")
    with contextlib.suppress(OSError):
        names = sorted(n[:-3] for n in os.listdir(folder)
                       if n.endswith(".py") and not n.startswith("_") and n[:-3] not in keep)
        os.environ["SGLANG_DISABLED_MODEL_ARCHS"] = ",".join(names)


if os.environ.get("SGLANG_USE_CPU_ENGINE") == "1":  # only the server processes run the hook
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
    _registry_skips_unserved_models()


# --- torchvision ------------------------------------------------------------------------------
class _Anything:
    def __init__(self, *a, **k):
        pass

    def __call__(self, *a, **k):
        return _Anything()

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything()

    def __mro_entries__(self, bases):
        return (object,)


class _StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything()


class _TorchvisionStub(importlib.abc.MetaPathFinder, importlib.abc.Loader):
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


def _after_transformers_import_utils(mod) -> None:
    mod.is_torchvision_available()  # lru_cache: False now (no torchvision installed)
    if not any(isinstance(f, _TorchvisionStub) for f in sys.meta_path):
        sys.meta_path.insert(0, _TorchvisionStub())


# --- SGLang patches ---------------------------------------------------------------------------
@contextlib.contextmanager
def _no_cuda_sync():
    import torch

    saved = torch.cuda.synchronize
    torch.cuda.synchronize = lambda *a, **k: None
    try:
        yield
    finally:
        torch.cuda.synchronize = saved


def _patch_bailing_nextn(mod) -> None:
    # models/bailing_moe_nextn.py 289: set_embed_and_head() calls torch.cuda.synchronize()
    # unconditionally; on a CPU-only torch that raises "Torch not compiled with CUDA enabled"
    # when the EAGLE worker shares the target's embedding and head with the draft.
    cls = mod.BailingMoeForCausalLMNextN
    orig = cls.set_embed_and_head

    @functools.wraps(orig)
    def set_embed_and_head(self, embed, head):
        with _no_cuda_sync():
            return orig(self, embed, head)

    cls.set_embed_and_head = set_embed_and_head


def _patch_mla_dispatch(mod) -> None:
    # models/deepseek_common/attention_backend_handler.py 46-52, 254-265: "torch_native" has no
    # registered handler, so get_handler() falls back to the Triton one, which sends an extend
    # without prefix to the MHA branch; torch-native attention then reads the MLA pool's
    # compressed latent as if it held full K/V ("Expected size [4, 48] but got [4, 80]").
    # Register torch_native to the absorbed-MLA branch (_dispatch_mla_subtype, 61-72), the
    # one it can serve (decode always goes there already).
    reg = mod.AttentionBackendRegistry
    if "torch_native" not in reg._handlers:
        reg.register("torch_native", lambda attn, fb: mod._dispatch_mla_subtype(attn, fb))


class _AmxPlatform:
    """Forwards to SGLang's platform facts, except ``has_amx``, which it answers True."""

    def __init__(self, real):
        self._real = real

    def __getattr__(self, name):
        return True if name == "has_amx" else getattr(self._real, name)


def _patch_amx_fallback(mod) -> None:
    # arg_groups/overrides.py 1300-1310 (run from arg_groups/attention_hook.py 272):
    # _attention_backend_platform_fallbacks swaps --attention-backend intel_amx for
    # torch_native unless get_platform().has_amx, and torch_native cannot run EAGLE/NEXTN
    # (speculative/draft_utils.py 64: "EAGLE is not supported in decode attention backend
    # torch_native"). intel_amx's attention calls only the stand-in torch ops
    # (decode/extend_attention_cpu). The module's get_platform() answers has_amx=True: line
    # 1305 is the only has_amx read in overrides.py, so this claims AMX for that check only;
    # every other AMX probe (utils/common.py cpu_has_amx_support, weight packing) still sees
    # the machine as it is.
    real = mod.get_platform
    mod.get_platform = lambda: _AmxPlatform(real())


def _patch_start_method(mod) -> None:
    # entrypoints/engine.py 1995: _set_envs_and_config() forces the "spawn" start method, so the
    # scheduler and detokenizer processes each import SGLang again (about 5 s of a 2-core
    # machine's CPU each, the same modules the launching process has just imported). Spawn is
    # there for CUDA, which cannot be used in a forked child; a CPU-only server has no CUDA
    # context, so "fork" is set right after: the children start from the imported modules. Each
    # child still builds its own scheduler/detokenizer, ZMQ sockets and model, as under spawn
    # (measured: the same output ids, ready after 13 s instead of 20 s).
    import multiprocessing

    orig = mod._set_envs_and_config

    @functools.wraps(orig)
    def _set_envs_and_config(*args, **kwargs):
        out = orig(*args, **kwargs)
        multiprocessing.set_start_method("fork", force=True)
        return out

    mod._set_envs_and_config = _set_envs_and_config


#: module -> (patch function, SGLang file:line it works around). ``NVFP4STUDY_CPU_ENGINE_SKIP``
#: (comma-separated module names) leaves patches out, to show what each one answers.
PATCHES = {
    "transformers.utils.import_utils": (_after_transformers_import_utils,
                                        "multimodal/internvl_utils.py:5"),
    "sglang.srt.models.bailing_moe_nextn": (_patch_bailing_nextn, "models/bailing_moe_nextn.py:289"),
    "sglang.srt.models.deepseek_common.attention_backend_handler": (
        _patch_mla_dispatch, "models/deepseek_common/attention_backend_handler.py:46"),
    "sglang.srt.arg_groups.overrides": (_patch_amx_fallback, "arg_groups/overrides.py:1300"),
    "sglang.srt.entrypoints.engine": (_patch_start_method, "entrypoints/engine.py:1995"),
}
for _name in filter(None, os.environ.get("NVFP4STUDY_CPU_ENGINE_SKIP", "").split(",")):
    PATCHES.pop(_name.strip(), None)


class _PatchFinder(importlib.abc.MetaPathFinder):
    """Finds a patched module with the other finders and runs its patch after it executes."""

    def find_spec(self, name, path=None, target=None):
        if name not in PATCHES:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        exec_module = loader.exec_module
        patch = PATCHES[name][0]

        def exec_and_patch(module):
            exec_module(module)
            patch(module)

        loader.exec_module = exec_and_patch
        return spec


def install() -> None:
    """Install the finder (once); a patched module imported before this is patched now."""
    if os.environ.get("SGLANG_USE_CPU_ENGINE") != "1":
        return
    if not any(isinstance(f, _PatchFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchFinder())
    for name, (patch, _) in PATCHES.items():
        if name in sys.modules:
            patch(sys.modules[name])


install()

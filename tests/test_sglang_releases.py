"""Release ranges rendered from the release-keyed facts (``sglang.releases.version_span``,
``checkpoint.quant_rules.NVFP4_MOE_SCHEMES``): today's five releases give today's strings.

The end-to-end case of a new release (a copy registered as 0.5.99) is in
``tests/test_sglang_audit.py`` (``test_a_new_release_needs_only_its_keys``), beside the expected
verdicts it extends.
"""

from __future__ import annotations

import pytest

from nvfp4study.checkpoint import quant_rules as qr
from nvfp4study.sglang.releases import release_key, version_span
from sglang_fixtures import VERSIONS, scheme_messages

#: the messages as they were typed before the ranges were rendered (issue 22 part 5)
TODAY = {
    "W4A16": "weight-only NVFP4 config (input_activations: null): SGLang 0.5.20-0.5.21 crash "
             "(AttributeError 'NoneType' ... 'num_bits'); 0.5.22-0.5.23 serve it through the W4A16 "
             "Marlin MoE scheme on sm80+ (SwiGLU clamp dropped, gate/up scales must match); the W4A4 "
             "CUTLASS path is never taken",
    "W4A4": "W4A4 NVFP4 config (input_activations 4-bit float tensor_group 16, dynamic ['local']): "
            "SGLang's CompressedTensorsW4A4Nvfp4MoE on Blackwell (sm100+), all of 0.5.20-0.5.23; "
            "below Blackwell 0.5.20-0.5.21 refuse, 0.5.22-0.5.23 fall back to W4A16 Marlin",
}
SOURCES_TODAY = {
    "w4a4-fallback": "compressed_tensors.py 962-975 (0.5.22+: below sm100 -> W4A16 Marlin, "
                     "activation quantization ignored)",
    "w4a16-crash": "0.5.20-0.5.21 compressed_tensors.py _is_static_tensor_w8a8 reads input_quant.num_bits "
                   "with no None guard (AttributeError: 'NoneType' object has no attribute 'num_bits')",
    "w4a16-marlin": "0.5.22+ compressed_tensors.py 959-961 CompressedTensorsW4A16Nvfp4MoE; "
                    "schemes/compressed_tensors_w4a16_nvfp4_moe.py 186-202 refuses gate/up global scales that differ, "
                    "get_min_capability 80",
}


def test_todays_messages_are_unchanged():
    assert scheme_messages() == TODAY
    assert {k: qr.SERVING_SOURCES[k] for k in SOURCES_TODAY} == SOURCES_TODAY
    assert qr.serving_releases() == ["0.5.20", "0.5.21", "0.5.22", "0.5.23"]


@pytest.mark.parametrize("versions,among,want", [
    (["0.5.22", "0.5.23"], None, "0.5.22-0.5.23"),
    (["0.5.23", "0.5.22"], None, "0.5.22-0.5.23"),  # order of the input does not matter
    (["0.5.19", "0.5.21", "0.5.22", "0.5.23"], None, "0.5.19, 0.5.21-0.5.23"),
    (["0.5.22"], None, "0.5.22"),
    ([], None, "none"),
    (["0.5.20", "0.5.22"], ["0.5.20", "0.5.22"], "0.5.20-0.5.22"),  # adjacent among those given
    (["0.5.9", "0.5.10"], ["0.5.9", "0.5.10", "0.5.11"], "0.5.9-0.5.10"),  # numbers, not text
    (["0.5.23", "0.5.24"], None, "0.5.23-0.5.24"),  # a release not yet discovered still shows
])
def test_version_span(versions, among, want):
    assert version_span(versions, among) == want


def test_release_key_orders_numerically():
    assert sorted(["0.5.10", "0.5.9", "0.5.10.post1"], key=release_key) == ["0.5.9", "0.5.10", "0.5.10.post1"]


def test_serving_facts_cover_the_discovered_releases():
    """Every discovered release from the first one read has its serving facts (a new one is named)."""
    assert qr.unkeyed_releases(list(VERSIONS)) == []
    assert qr.unkeyed_releases([*VERSIONS, "0.5.99"]) == ["0.5.99"]
    assert qr.unkeyed_releases(["0.5.19"]) == []  # older than the first release read: not required


# --- prefetch (make envs): the releases stage 03 audits, unpacked ahead ---------------------------
def _prefetch(*args: str, env_cache=None):
    import os
    import subprocess
    import sys

    env = os.environ | ({"NVFP4STUDY_CACHE": str(env_cache)} if env_cache else {})
    return subprocess.run([sys.executable, "-m", "nvfp4study.sglang.releases", *args],
                          capture_output=True, text=True, timeout=600, env=env)


def test_prefetch_unpacks_the_params_releases(tmp_path):
    """The default params' releases (every BailingMoeV3 release) end up unpacked in the cache;
    a second run finds them there."""
    from nvfp4study.core.params import REPO_ROOT, load_params
    from nvfp4study.sglang.releases import expand_versions, prefetch
    from nvfp4study.sglang.source import cache_dir

    want = expand_versions(load_params(REPO_ROOT / "params" / "default.yaml").sglang.audit_versions)
    r = _prefetch("--prefetch", str(REPO_ROOT / "params" / "default.yaml"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith(f"unpacked in {cache_dir() / 'src'}") and ", ".join(want) in r.stdout
    assert all((cache_dir() / "src" / f"sglang-{v}" / "sglang").is_dir() for v in want)
    assert prefetch(["0.5.23", "0.5.23"]) == ["0.5.23"]


@pytest.mark.parametrize("content, error", [
    (None, "ParamsError: params file not found"),
    ("profile: x\nsglang:\n  audit_versions: ['0.5.23; rm -rf /']\n", "SGLangSourceError: '0.5.23; rm -rf /' is not an SGLang release"),
])
def test_prefetch_fails_with_one_named_line(tmp_path, content, error):
    f = tmp_path / "p.yaml"
    if content is not None:
        f.write_text(content)
    r = _prefetch("--prefetch", str(f), env_cache=tmp_path / "cache")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith(f"prefetch: {error}") and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "cache" / "src").exists()  # nothing half-written


def test_prefetch_usage():
    r = _prefetch("--prefetch")
    assert r.returncode == 2 and r.stderr.startswith("usage:")

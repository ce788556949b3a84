"""Which SGLang releases carry BailingMoeV3 (``sglang/srt/models/bailing_moe_v3.py``), found
from the released wheels rather than typed in.

:func:`discover` lists the releases on the package index (``pip index versions sglang``, pip's
ordinary client), then walks them newest first, opening each wheel (downloaded once into the
study cache by :func:`nvfp4study.sglang.source.wheel_path`) and looking for the model file; it
stops at the first release below a carrying one that lacks it (the model was added once and
kept). The result is cached in ``<cache>/bailing_releases.json``; the package ships the result
of one such run (``data/bailing_releases.json``) so the default study needs no index query:
:func:`bailing_releases` reads the cache when present, else the shipped copy.

``audit_versions`` entries equal to :data:`ALL_BAILING` stand for every such release.
:func:`version_span` renders a set of releases as ranges over the discovered ones, so messages
that name "0.5.22-0.5.23" grow with a new release instead of being retyped.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import zipfile
from collections.abc import Iterable
from importlib import resources
from typing import Any

from ..core.errors import SGLangSourceError, StudyError
from ..core.files import write_json
from .source import cache_dir, wheel_path

MODEL_MEMBER = "sglang/srt/models/bailing_moe_v3.py"
ALL_BAILING = "bailing-releases"


def _key(v: str) -> tuple:
    return tuple(int(x) if x.isdigit() else -1 for x in re.split(r"[.]|post", v) if x)


def release_key(version: str) -> tuple:
    """Sort key of a release number (``0.5.9`` < ``0.5.10`` < ``0.5.10.post1``)."""
    return _key(version)


def index_versions() -> list[str]:
    """SGLang release numbers on the package index, newest first (``pip index versions``).

    Raises:
        SGLangSourceError: pip cannot reach the index or prints no version list.
    """
    cmd = [sys.executable, "-m", "pip", "index", "versions", "sglang"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    m = re.search(r"Available versions:\s*(.+)", proc.stdout)
    if proc.returncode != 0 or not m:
        raise SGLangSourceError(f"pip index versions sglang failed: {(proc.stderr or proc.stdout).strip()[-200:]}")
    return sorted((v.strip() for v in m.group(1).split(",")), key=_key, reverse=True)


def wheel_has_model(version: str) -> bool:
    """Does the released wheel of ``version`` contain :data:`MODEL_MEMBER`? (downloads once)"""
    with zipfile.ZipFile(wheel_path(version)) as zf:
        return MODEL_MEMBER in zf.namelist()


def discover(versions: list[str] | None = None) -> dict[str, Any]:
    """Walk ``versions`` (default: :func:`index_versions`) newest first; write the cache.

    Returns ``{"member", "checked": {version: bool}, "releases": [carrying versions, ascending]}``.
    """
    versions = sorted(versions or index_versions(), key=_key, reverse=True)
    checked: dict[str, bool] = {}
    for v in versions:
        if not re.fullmatch(r"\d+(\.\d+)*(\.post\d+)?", v):
            continue  # pre-releases are not audited
        checked[v] = wheel_has_model(v)
        if not checked[v] and any(checked.values()):
            break
    out = {"member": MODEL_MEMBER, "checked": checked,
           "releases": sorted((v for v, ok in checked.items() if ok), key=_key)}
    write_json(cache_dir() / "bailing_releases.json", out)
    return out


def shipped() -> dict[str, Any]:
    """The discovery result shipped with the package (``data/bailing_releases.json``)."""
    return json.loads(resources.files(__package__).joinpath("data/bailing_releases.json").read_text())


def bailing_releases() -> list[str]:
    """Releases with BailingMoeV3, ascending: the cached discovery, else the shipped one."""
    f = cache_dir() / "bailing_releases.json"
    data = json.loads(f.read_text()) if f.is_file() else shipped()
    return list(data["releases"])


def expand_versions(versions: list[str]) -> list[str]:
    """``audit_versions`` with :data:`ALL_BAILING` replaced by :func:`bailing_releases` (order
    kept, duplicates dropped)."""
    out: list[str] = []
    for v in versions:
        for x in (bailing_releases() if v == ALL_BAILING else [v]):
            if x not in out:
                out.append(x)
    return out


def version_span(versions: Iterable[str], among: Iterable[str] | None = None) -> str:
    """``versions`` as ranges over ``among`` (default: :func:`bailing_releases`), ascending.

    Releases next to each other in ``among`` form one range: ``0.5.20-0.5.21``; a lone one is
    itself; runs are joined by ", " (``0.5.19, 0.5.21-0.5.23``); no release gives ``"none"``.
    ``versions`` missing from ``among`` are placed by release number, so a release keyed in a fact
    table but not (yet) discovered still shows. A new release that behaves like the last one
    extends the last range: ``0.5.22-0.5.23`` becomes ``0.5.22-0.5.24``.
    """
    want = set(versions)
    order = sorted(set(bailing_releases() if among is None else among) | want, key=_key)
    runs: list[list[str]] = []
    prev = False
    for v in order:
        if v in want:
            if prev:
                runs[-1].append(v)
            else:
                runs.append([v])
        prev = v in want
    return ", ".join(r[0] if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs) or "none"


def prefetch(versions: list[str]) -> list[str]:
    """Download and unpack every release of ``versions`` (``audit_versions`` entries,
    :func:`expand_versions`) into the study cache (:func:`nvfp4study.sglang.source.unpack_wheel`;
    a release already there costs nothing). ``make study`` and ``make test`` run it while the
    SGLang environment builds, so stage 03 finds the releases it audits unpacked instead of
    downloading them one after the other. Returns the releases, in order.

    Raises:
        SGLangSourceError: a download, the unpacking or the cache failed (the first one).
    """
    from .source import unpack_wheel

    out = expand_versions(versions)
    for v in out:
        unpack_wheel(v)
    return out


def main(argv: list[str] | None = None) -> int:  # pragma: no cover - network
    """``python -m nvfp4study.sglang.releases``: rerun the discovery and print it;
    ``... --prefetch PARAMS``: :func:`prefetch` the params file's ``sglang.audit_versions``
    (exit 2 with the error on one line when the params or a release fail)."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m nvfp4study.sglang.releases",
                                 description="Rediscover the BailingMoeV3 releases, or prefetch a params file's.")
    ap.add_argument("--prefetch", metavar="PARAMS", help="unpack the params file's sglang.audit_versions")
    args = ap.parse_args(argv)
    if args.prefetch is not None:
        from ..core.params import load_params

        try:
            got = prefetch(load_params(args.prefetch).sglang.audit_versions)
        except (StudyError, OSError) as exc:  # a bad params file, a failed download
            print(f"prefetch: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 2
        print(f"prefetch: SGLang {', '.join(got)} unpacked in {cache_dir() / 'src'}")
        return 0
    print(json.dumps(discover(), indent=1))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

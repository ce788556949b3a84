"""Reading params YAML strictly: UTF-8 only, no duplicate key, named errors, ``-p`` overrides.

PyYAML's ``safe_load`` silently keeps the last of two equal keys; a params file is checked with a
loader that refuses them, so a typo'd second ``port:`` cannot win unnoticed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from .errors import ParamsError


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's SafeLoader, except that a mapping with the same key twice is an error (PyYAML
    keeps the last value silently; YAML 1.2 section 3.2.1.1 requires unique keys)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # "<<" merges: explicit keys override merged ones by design
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: SafeLoader's own error follows
                continue
            if first is not None:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first on line {first})", key_node.start_mark)
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def _yaml(text: str) -> Any:
    """Parse YAML text with :class:`_UniqueKeyLoader` (raises ``yaml.YAMLError``)."""
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """``"line N, column M: problem"`` of a PyYAML error (its own text names no file)."""
    mark = getattr(exc, "problem_mark", None)
    problem = " ".join(str(getattr(exc, "problem", None) or exc).split())
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}" if mark else problem


def apply_override(raw: dict, assignment: str) -> None:
    """Apply one ``dotted.key=value`` override to raw params in place.

    The value is parsed as YAML (so ``3``, ``true``, ``[0, 2]``, ``null`` work).

    Raises:
        ParamsError: no ``=`` in the assignment, an empty key part, a value that is not YAML
            (``-p a=[``), or a path through a non-mapping; the message names the override.
    """
    if "=" not in assignment:
        raise ParamsError(f"override '{assignment}' is not key=value")
    key, value = assignment.split("=", 1)
    parts = key.strip().split(".")
    if not all(p.strip() for p in parts):
        raise ParamsError(f"override '{assignment}': the key has an empty part")
    try:
        parsed = _yaml(value) if value.strip() else None
    except yaml.YAMLError as exc:
        raise ParamsError(f"-p {key.strip()}: the value {value!r} is not valid YAML "
                          f"({_yaml_problem(exc)})") from None
    cur = raw
    for p in parts[:-1]:
        nxt = cur.setdefault(p, {})
        if not isinstance(nxt, dict):
            raise ParamsError(f"override '{key}': '{p}' is not a section")
        cur = nxt
    cur[parts[-1]] = parsed


#: the machine's own overlay (gitignored), written by ``make workstation-envs``: merged over any
#: params file before the overrides, so ``params/ling3-flash.yaml`` needs no edit on a workstation.


def read_yaml_mapping(p: Path) -> dict:
    """One params YAML file as a mapping: UTF-8 only, no duplicate key (strict loader).

    Raises:
        ParamsError: unreadable, not UTF-8 (line and byte named), invalid YAML, a duplicate key,
            or a top level that is not a mapping.
    """
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise ParamsError(f"{p}: cannot read params: {exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise ParamsError(f"{p}: line {line}: not UTF-8 text (byte {data[exc.start]:#04x} at "
                          f"offset {exc.start})") from None
    try:
        raw = _yaml(text)
    except yaml.YAMLError as exc:
        raise ParamsError(f"{p}: cannot read params: invalid YAML at {_yaml_problem(exc)}") from None
    raw = {} if raw is None else raw
    if not isinstance(raw, dict):
        raise ParamsError(f"{p}: top level must be a mapping, got {type(raw).__name__}")
    return raw

"""Reading the YAML file: `load_config`, `parse_config`; errors name FILE:LINE, field, value."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from provisioner.config.base import ConfigError
from provisioner.config.document import Config
from provisioner.config.site import KNOWN_BACKENDS


def _loc_path(loc: tuple[int | str, ...], sub: str = "") -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    if sub:
        out += sub if sub.startswith("[") or not out else f".{sub}"
    return out or "(top level)"


def _sub_loc(sub: str) -> list[int | str]:
    parts: list[int | str] = []
    for token in sub.replace("[", ".[").split("."):
        if not token:
            continue
        if token.startswith("[") and token.endswith("]"):
            parts.append(int(token[1:-1]))
        else:
            parts.append(token)
    return parts


def _node_line(root: yaml.Node | None, loc: list[int | str]) -> int | None:
    """1-based line of the YAML node at `loc` (or its deepest existing parent)."""
    node = root
    line = None if node is None else node.start_mark.line + 1
    for part in loc:
        if isinstance(node, yaml.MappingNode) and isinstance(part, str):
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode) and key.value == part:
                    node, line = value, value.start_mark.line + 1
                    break
            else:
                return line
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            if part >= len(node.value):
                return line
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            return line
    return line


#: Discriminated unions put the chosen member's tag into an error's location.
_UNION_TAGS = frozenset({*KNOWN_BACKENDS, "local", "ssh"})


#: An allocation's period: a calendar name or dates.
_PERIOD_TAGS = frozenset({"calendar", "dates"})


def _without_tags(loc: tuple[int | str, ...]) -> tuple[int | str, ...]:
    """('sites', 0, 'slurm-cli', 'executor', 'ssh', 'port') -> ('sites', 0, 'executor', 'port')."""
    out: list[int | str] = []
    for part in loc:
        if isinstance(part, str) and part in _UNION_TAGS and out and (
                isinstance(out[-1], int) or out[-1] == "executor"):
            continue
        if isinstance(part, str) and part in _PERIOD_TAGS and out and out[-1] == "period":
            continue
        out.append(part)
    return tuple(out)


def _consequences(errors: list[Any]) -> set[int]:
    """The errors that only follow from others: a list too short because its items
    failed (`sites` empty once its only site is refused) says nothing new."""
    locs = [tuple(e["loc"]) for e in errors]
    return {i for i, e in enumerate(errors) if e["type"] == "too_short"
            and any(len(other) > len(locs[i]) and other[:len(locs[i])] == locs[i]
                    for other in locs)}


def _iter_errors(
    exc: ValidationError, source: str, root: yaml.Node | None
) -> Iterator[str]:
    errors = exc.errors()
    skip = _consequences(errors)
    for i, err in enumerate(errors):
        if i in skip:
            continue
        loc = _without_tags(tuple(err["loc"]))
        ctx: dict[str, Any] = dict(err.get("ctx") or {})
        sub = str(ctx.get("field", ""))
        path = _loc_path(loc, sub)
        full_loc = [*loc, *_sub_loc(sub)]
        line = _node_line(root, full_loc)
        where = f"{source}:{line}" if line is not None else source
        if err["type"] == "missing":
            yield f"{where}: {path}: field required"
            continue
        if err["type"] in ("union_tag_invalid", "union_tag_not_found"):
            # A discriminated union: sites[].backend or an executor's type.
            key = str(ctx.get("discriminator", "")).strip("'") or "type"
            path = _loc_path(loc, key)
            line = _node_line(root, [*loc, key])
            where = f"{source}:{line}" if line is not None else source
            known = ctx.get("expected_tags", "")
            if err["type"] == "union_tag_not_found":
                yield f"{where}: {path}: field required (one of {known})"
            else:
                kind = "backend" if key == "backend" else f"{key}"
                yield f"{where}: {path}: unknown {kind} {ctx.get('tag')!r}; known: {known}"
            continue
        value = ctx["value"] if "value" in ctx else err.get("input")
        yield f"{where}: {path}: {err['msg']} (got {value!r})"


def parse_config(text: str, source: str = "<string>") -> Config:
    """Validate YAML text; `source` names it in error messages."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{source}{line}: malformed YAML: {problem}") from exc
    if data is None:
        raise ConfigError(f"{source}: empty configuration (need at least 'sites')")
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: top level must be a mapping, got {type(data).__name__}")
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        messages = list(_iter_errors(exc, source, root))
        raise ConfigError("\n".join(messages)) from exc


def field_location(path: str | os.PathLike[str], field: str) -> str:
    """"FILE:LINE" of a field (e.g. ``sites[1].template``) in a YAML file, or "FILE"."""
    try:
        root = yaml.compose(Path(path).read_text(encoding="utf-8"), Loader=yaml.SafeLoader)
    except (OSError, yaml.YAMLError):
        return str(path)
    line = _node_line(root, _sub_loc(field))
    return f"{path}:{line}" if line is not None else str(path)


def load_config(path: str | os.PathLike[str]) -> Config:
    """Read and validate the YAML file at `path`; ConfigError on any problem."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read configuration: {exc.strerror or exc}") from exc
    return parse_config(text, str(p))

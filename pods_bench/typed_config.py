"""Plain data (a YAML file's content, run.json, `--set` values) to typed dataclasses: each value
coerced to its field's declared type, nested sections built recursively, and every mistake (unknown
key, wrong type, a section's own check) one `PodsBenchError` line naming the dotted key.

The training config (config.py) is built with it, and so is a plugin's own settings section (an
engine's options, engines/vllm.py): `section_from_dict(cls, data, "engine.vllm")`.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from typing import Any, Literal

from pods_bench.errors import PodsBenchError


def is_dataclass_type(tp) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _type_name(tp) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(tp, value, key: str):
    """`value` as field type `tp`, or a one-line error naming `key`."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        for option in options:
            try:
                return _coerce(option, value, key)
            except PodsBenchError:
                if option is options[-1]:
                    raise
    if origin is Literal:
        if value not in args:
            raise PodsBenchError(f"config key {key} must be one of {list(args)}, got {value!r}")
        return value
    if is_dataclass_type(tp):
        return section_from_dict(tp, value, key)
    if origin in (list, tuple):
        if isinstance(value, str):  # --set eval.benchmarks=gsm8k,math500
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise PodsBenchError(f"config key {key} must be a list, got {value!r}")
        if origin is tuple and len(args) != len(value):
            raise PodsBenchError(f"config key {key} must have {len(args)} items, got {value!r}")
        item_types = args if origin is tuple else [args[0]] * len(value)
        items = [_coerce(t, v, f"{key}[{i}]") for i, (t, v) in enumerate(zip(item_types, value))]
        return tuple(items) if origin is tuple else items
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise PodsBenchError(f"config key {key} must be a mapping, got {value!r}")
        if len(args) == 2 and is_dataclass_type(args[1]):  # named sections, e.g. an experiment's arms
            return {name: section_from_dict(args[1], v, f"{key}.{name}") for name, v in value.items()}
        return dict(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads "1e-6" (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
    elif tp is str:
        if isinstance(value, str):
            return value
    raise PodsBenchError(f"config key {key} must be {_type_name(tp)}, got {value!r}")


def unknown_config_key(key: str, known, prefix: str) -> PodsBenchError:
    """The one-line error for config key <prefix><key>, which is none of `known` (the closest of
    them as a hint)."""
    close = difflib.get_close_matches(key, list(known), n=1)
    hint = f" (did you mean {prefix}{close[0]}?)" if close else ""
    return PodsBenchError(f"unknown config key {prefix}{key}{hint}")


def unknown_key(cls, key: str, prefix: str) -> PodsBenchError:
    """`unknown_config_key` for a key of dataclass `cls`'s section."""
    return unknown_config_key(key, [f.name for f in dataclasses.fields(cls)], prefix)


def section_from_dict(cls, data, key: str = ""):
    """A `cls` dataclass from plain `data`, typed and checked like the config section at `key`. A
    class with a reader of its own (`from_config_dict(data, key)`, plugins.PluginChoice) reads it."""
    if isinstance(data, cls):
        return data
    reader = getattr(cls, "from_config_dict", None)
    if reader is not None:
        return reader(data, key)
    return typed_fields(cls, data, key)


def typed_fields(cls, data, key: str = ""):
    """`section_from_dict` without a class's own reader: every key of `data` a field of `cls`."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise PodsBenchError(f"config key {key or '<root>'} must be a mapping, got {data!r}")
    prefix = f"{key}." if key else ""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for name, value in data.items():
        if name not in names:
            raise unknown_key(cls, str(name), prefix)
        kwargs[name] = _coerce(hints[name], value, prefix + name)
    try:
        return cls(**kwargs)
    except PodsBenchError as e:  # a section's own checks in __post_init__
        if str(e).startswith(("config key ", "unknown config key ")):  # already names its key in full
            raise
        raise PodsBenchError(f"config key {key or '<root>'}: {e}") from None  # e.g. RewardConfig's


# --- a dataclass as a JSON schema: the keys, types, defaults and limits declared once, in code ------
# (jsonschema and Snakemake read a schema file; none of the field's libraries writes one from a
# dataclass with its own limits and descriptions, hence these few lines)


def config_key(
    default=dataclasses.MISSING, *, default_factory=dataclasses.MISSING, description=None, schema=None, **limits
):
    """A dataclass field that documents itself for `json_schema`: its `description`, JSON-schema
    `limits` (minimum, pattern, minItems, items={...}, ...) added to the schema its type gives, or a
    whole `schema` in its place (a mapping the dataclass keeps as plain data)."""
    meta = {"description": description, "schema": schema, "limits": limits}
    return dataclasses.field(default=default, default_factory=default_factory, metadata={"json_schema": meta})


_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean"}


def _type_schema(tp) -> dict:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return {}
    if tp is dict:
        return {"type": "object"}
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        (inner,) = [a for a in args if a is not type(None)]
        if is_dataclass_type(inner):  # null first: filling in defaults descends into the first branch that fits
            return {"anyOf": [{"type": "null"}, _type_schema(inner)]}
        schema = _type_schema(inner)
        schema["type"] = [schema["type"], "null"]
        if "enum" in schema:
            schema["enum"] = [*schema["enum"], None]
        return schema
    if origin is Literal:
        return {"type": _JSON_TYPES[type(args[0])], "enum": list(args)}
    if origin is list:
        return {"type": "array", "items": _type_schema(args[0])}
    if origin is dict:
        schema = {"type": "object"}
        if is_dataclass_type(args[1]):
            schema["additionalProperties"] = _type_schema(args[1])
        return schema
    if is_dataclass_type(tp):
        return json_schema(tp)
    return {"type": _JSON_TYPES[tp]}


def json_schema(cls) -> dict:
    """The JSON schema of dataclass `cls`: an object of exactly its fields, those without a default
    required, each typed by its annotation and documented by its `config_key(...)` metadata."""
    hints = typing.get_type_hints(cls)
    properties, required = {}, []
    for f in dataclasses.fields(cls):
        meta = f.metadata.get("json_schema", {})
        schema = dict(meta["schema"]) if meta.get("schema") else _type_schema(hints[f.name])
        for name, limit in meta.get("limits", {}).items():
            schema[name] = {**schema[name], **limit} if isinstance(limit, dict) and name in schema else limit
        if meta.get("description"):
            schema = {"description": meta["description"], **schema}
        if f.default is not dataclasses.MISSING:
            schema["default"] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
            schema["default"] = {} if is_dataclass_type(type(value)) else value
        else:
            required.append(f.name)
        properties[f.name] = schema
    out = {"type": "object", "additionalProperties": False}
    if required:
        out["required"] = required
    return {**out, "properties": properties}

"""The run config as ``npm run run -- start`` reads it, so a run started from Python gets the same one.

The TypeScript client parses the YAML with the ``yaml`` package (YAML 1.2, core schema) and validates
it with zod (protocol/run-config.ts), which fills in every default. Here: PyYAML restricted to YAML
1.2's core scalars, the numbers and keys JavaScript would make of them, the JSON Schema zod generates
(run_config.schema.json, written by scripts/python-schema.ts), and its defaults. ``run_config_json``
writes the result as JavaScript's ``JSON.stringify`` does: the workflow input is byte for byte the
TypeScript client's (test/unit/python-client-config.test.ts checks both).
"""

from __future__ import annotations

import copy
import json
import math
import re
from pathlib import Path
from typing import Any

import jsonschema
import yaml
from jsonschema import validators

SCHEMA_FILE = Path(__file__).with_name("run_config.schema.json")

# Our keyword in the schema for zod's `trainer: none` preprocess: a string `s` means `{key: s}`.
STRING_SHORTHAND = "x-string-shorthand"

# JavaScript numbers are doubles: a larger integer is a rounded double there, and zod's `.int()`
# accepts only integers up to this.
_MAX_SAFE_INTEGER = 2**53 - 1


class ConfigError(Exception):
    """A run config error naming the key that is wrong (``run.name``), as the TypeScript client does."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key
        self.detail = message


# --- YAML 1.2 core schema ------------------------------------------------------------------------


class _Yaml12Loader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2's core scalars instead of YAML 1.1's.

    YAML 1.1 reads ``yes``/``on``/``off`` as booleans, ``0o17`` as a string, ``010`` as octal, dates
    as dates and ``<<`` as a merge: the TypeScript client reads them as strings, 15, 10, strings and a
    key. The resolvers and constructors below are those of the ``yaml`` package's core schema.
    """

    yaml_implicit_resolvers: dict = {}


_NULL = re.compile(r"^(?:~|[Nn]ull|NULL)?\Z")
_BOOL = re.compile(r"^(?:[Tt]rue|TRUE|[Ff]alse|FALSE)\Z")
_INT = re.compile(r"^(?:0o[0-7]+|[-+]?[0-9]+|0x[0-9a-fA-F]+)\Z")
_FLOAT = re.compile(
    r"^(?:[-+]?\.(?:inf|Inf|INF)|\.nan|\.NaN|\.NAN"
    r"|[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)[eE][-+]?[0-9]+"
    r"|[-+]?(?:\.[0-9]+|[0-9]+\.[0-9]*))\Z"
)
# Order matters: the first resolver that matches wins, as in the yaml package's core schema.
_Yaml12Loader.add_implicit_resolver("tag:yaml.org,2002:null", _NULL, ["~", "n", "N", ""])
_Yaml12Loader.add_implicit_resolver("tag:yaml.org,2002:bool", _BOOL, list("tTfF"))
_Yaml12Loader.add_implicit_resolver("tag:yaml.org,2002:int", _INT, list("-+0123456789"))
_Yaml12Loader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT, list("-+.0123456789"))


def _construct_bool(loader: yaml.SafeLoader, node: yaml.Node) -> bool:
    return loader.construct_scalar(node)[:1] in ("t", "T")  # type: ignore[index]


def _construct_int(loader: yaml.SafeLoader, node: yaml.Node) -> int:
    value = str(loader.construct_scalar(node))
    if value.startswith("0o"):
        return int(value[2:], 8)
    if value.startswith("0x"):
        return int(value[2:], 16)
    return int(value, 10)  # leading zeros are decimal in YAML 1.2


def _construct_float(loader: yaml.SafeLoader, node: yaml.Node) -> float:
    value = str(loader.construct_scalar(node))
    lower = value.lower()
    if lower.endswith("nan"):
        return math.nan
    if lower.endswith("inf"):
        return -math.inf if value.startswith("-") else math.inf
    return float(value)


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    if not isinstance(node, yaml.MappingNode):
        raise yaml.constructor.ConstructorError(None, None, f"expected a mapping, found {node.id}", node.start_mark)
    out: dict[str, Any] = {}
    seen: set = set()
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if isinstance(key, (dict, list)):
            raise yaml.constructor.ConstructorError(None, None, "a key must be a scalar", key_node.start_mark)
        # The yaml package refuses a key twice (by value and type); PyYAML would keep the last.
        if (type(key), key) in seen:
            raise yaml.constructor.ConstructorError(None, None, f"map keys must be unique: {key!r} twice", key_node.start_mark)
        seen.add((type(key), key))
        out[_js_key(key)] = loader.construct_object(value_node, deep=deep)
    return out


_Yaml12Loader.add_constructor("tag:yaml.org,2002:bool", _construct_bool)
_Yaml12Loader.add_constructor("tag:yaml.org,2002:int", _construct_int)
_Yaml12Loader.add_constructor("tag:yaml.org,2002:float", _construct_float)
_Yaml12Loader.add_constructor("tag:yaml.org,2002:map", lambda loader, node: _construct_mapping(loader, node, deep=True))


# --- JavaScript values ---------------------------------------------------------------------------


def _js_number_text(x: float) -> str:
    """ECMAScript's Number::toString (what JSON.stringify writes) of a finite double."""
    if x == 0:
        return "0"
    sign = "-" if x < 0 else ""
    mantissa, _, exp = repr(abs(x)).partition("e")  # repr: the shortest digits that round-trip, as in JS
    whole, _, frac = mantissa.partition(".")
    digits = whole + frac
    point = len(whole) + (int(exp) if exp else 0)
    stripped = digits.lstrip("0")
    point -= len(digits) - len(stripped)
    s = stripped.rstrip("0") or "0"
    k, n = len(s), point
    if k <= n <= 21:
        return sign + s + "0" * (n - k)
    if 0 < n <= 21:
        return sign + s[:n] + "." + s[n:]
    if -6 < n <= 0:
        return sign + "0." + "0" * -n + s
    e = f"e{'+' if n - 1 >= 0 else '-'}{abs(n - 1)}"
    return sign + (s if k == 1 else s[0] + "." + s[1:]) + e


def _js_key(key: Any) -> str:
    """The property name JavaScript gives a YAML key (String(key); null → '')."""
    if key is None:
        return ""
    if isinstance(key, bool):
        return "true" if key else "false"
    if isinstance(key, (int, float)):
        value = _js_number(key)
        if isinstance(value, float):
            if math.isnan(value):
                return "NaN"
            if math.isinf(value):
                return "Infinity" if value > 0 else "-Infinity"
            return _js_number_text(value)
        return str(value)
    return str(key)


def _js_number(x: int | float) -> int | float:
    """The number as JavaScript holds it: an integer within 2^53 as an int, anything else a float."""
    if isinstance(x, int):
        return x if abs(x) <= 2**53 else float(x)
    if math.isfinite(x) and x.is_integer() and abs(x) <= 2**53:
        return int(x)
    return x


def _as_js(value: Any, path: list[str]) -> Any:
    """The value as JavaScript would hold it; NaN and infinities fail here, as every zod number refuses them."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float)):
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(_key(path), "Invalid input: expected a finite number")
        return _js_number(value)
    if isinstance(value, dict):
        return {_js_key(k): _as_js(v, [*path, _js_key(k)]) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_as_js(v, [*path, str(i)]) for i, v in enumerate(value)]
    raise ConfigError(_key(path), f"Invalid input: {type(value).__name__} is not a JSON value")


def _json_text(value: Any, indent: int | None, depth: int) -> str:
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        value = _js_number(value)
        return str(value) if isinstance(value, int) else _js_number_text(value)
    if isinstance(value, float):
        return _js_number_text(value) if math.isfinite(value) else "null"
    if isinstance(value, str):
        # The same escapes as JSON.stringify: quotes, backslash, control characters; the rest as is.
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, dict):
        items = [f"{json.dumps(str(k), ensure_ascii=False)}:{' ' if indent else ''}{_json_text(v, indent, depth + 1)}" for k, v in value.items()]
        return _container("{", "}", items, indent, depth)
    if isinstance(value, (list, tuple)):
        return _container("[", "]", [_json_text(v, indent, depth + 1) for v in value], indent, depth)
    raise TypeError(f"not a JSON value: {type(value).__name__}")


def _container(open_: str, close: str, items: list[str], indent: int | None, depth: int) -> str:
    if not items:
        return open_ + close
    if not indent:
        return open_ + ",".join(items) + close
    inner = "\n" + " " * (indent * (depth + 1))
    return open_ + inner + ("," + inner).join(items) + "\n" + " " * (indent * depth) + close


def to_json(value: Any, indent: int | None = None) -> str:
    """``JSON.stringify(value, null, indent)``: the same bytes as the TypeScript side writes."""
    return _json_text(value, indent, 0)


def run_config_json(config: dict) -> str:
    """The parsed run config as the workflow receives it from the TypeScript client (``JSON.stringify``)."""
    return to_json(config)


# --- the schema ----------------------------------------------------------------------------------

_JS_DOLLAR = re.compile(r"(\\.)|(\[(?:\\.|[^\]])*\])|\$")


def _js_pattern(pattern: str) -> re.Pattern[str]:
    """A JavaScript regex (no flags) in Python: there `$` is the end of input, here it also matches before a final newline."""
    return re.compile(_JS_DOLLAR.sub(lambda m: m.group(0) if m.group(1) or m.group(2) else r"\Z", pattern), re.ASCII)


def _pattern(validator: Any, pattern: str, instance: Any, schema: dict) -> Any:
    if validator.is_type(instance, "string") and not _js_pattern(pattern).search(instance):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


_Validator = validators.extend(jsonschema.Draft202012Validator, {"pattern": _pattern})
_schema: dict | None = None


def run_config_schema() -> dict:
    """run_config.schema.json (checked against its own meta-schema once)."""
    global _schema
    if _schema is None:
        schema = json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))
        _Validator.check_schema(schema)
        _schema = schema
    return _schema


def _key(path: list[str]) -> str:
    return ".".join(path) or "(root)"


def _sub(schema: dict, key: str) -> dict:
    """The schema of an object's property (or a record's value, an array's item)."""
    props = schema.get("properties", {})
    if key in props:
        return props[key]
    extra = schema.get("additionalProperties", schema.get("items"))
    return extra if isinstance(extra, dict) else {}


def _expand_shorthands(schema: dict, value: Any) -> Any:
    """zod's preprocess runs before validation: ``trainer: none`` becomes ``trainer: {kind: none}``."""
    if isinstance(value, str) and STRING_SHORTHAND in schema:
        return {schema[STRING_SHORTHAND]: value}
    if isinstance(value, dict):
        return {k: _expand_shorthands(_sub(schema, k), v) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand_shorthands(_sub(schema, "items"), v) for v in value]
    return value


def _fill_defaults(schema: dict, value: Any) -> Any:
    """What zod's parse returns: an object's keys in the schema's order, each absent one with its default."""
    if isinstance(value, dict) and "properties" in schema:
        out: dict[str, Any] = {}
        for key, sub in schema["properties"].items():
            if key in value:
                out[key] = _fill_defaults(sub, value[key])
            elif "default" in sub:
                # zod 4 returns a default as it is, without parsing it.
                out[key] = copy.deepcopy(sub["default"])
        for key, v in value.items():
            if key not in out:
                out[key] = _fill_defaults(_sub(schema, key), v)
        return out
    if isinstance(value, dict) and isinstance(schema.get("additionalProperties"), dict):
        return {k: _fill_defaults(schema["additionalProperties"], v) for k, v in value.items()}
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [_fill_defaults(schema["items"], v) for v in value]
    for branch in schema.get("anyOf", []):
        if _Validator(branch).is_valid(value):
            return _fill_defaults(branch, value)
    return value


def _error_path(error: jsonschema.ValidationError) -> tuple[list[str], str]:
    """The key an error is about and what is wrong there, in the TypeScript client's words where it has them."""
    path = [str(p) for p in error.absolute_path]
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        allowed = error.schema.get("properties", {})
        unknown = next(k for k in error.instance if k not in allowed)
        return [*path, unknown], f"unknown key (allowed keys are listed in the docs of {_key(path) if path else 'the file'})"
    if error.validator == "required" and isinstance(error.instance, dict):
        missing = next(k for k in error.validator_value if k not in error.instance)
        return [*path, missing], "Invalid input: required, but missing"
    if error.validator == "anyOf" and error.context:
        # `positive.nullable()`: say what is wrong with the number, not that it is not null either.
        branches = error.validator_value
        nullable = any(b.get("type") == "null" for b in branches)
        best = jsonschema.exceptions.best_match(e for e in error.context if branches[e.relative_schema_path[0]].get("type") != "null")
        if best is not None:
            return path, f"{best.message} (null is allowed too)" if nullable else best.message
    return path, error.message


def _order(schema: dict, value: Any, path: list[str]) -> list[int]:
    """Where a key comes in zod's walk (an object's keys in schema order, unknown keys after them): zod reports its first issue."""
    out = []
    for key in path:
        props = list(schema.get("properties", {}))
        keys = list(value) if isinstance(value, dict) else []
        out.append(props.index(key) if key in props else len(props) + (keys.index(key) if key in keys else len(keys)))
        schema = _sub(schema, key)
        value = value.get(key) if isinstance(value, dict) else value[int(key)] if isinstance(value, list) and key.isdigit() and int(key) < len(value) else None
    return out


def parse_run_config(raw: Any) -> dict:
    """The run config with every default applied, as ``RunConfigSchema.parse`` returns it; ConfigError names the first wrong key."""
    schema = run_config_schema()
    value = _expand_shorthands(schema, _as_js(raw, []))
    errors = [_error_path(e) for e in _Validator(schema).iter_errors(value)]
    if errors:
        path, message = min(errors, key=lambda e: _order(schema, value, e[0]))
        raise ConfigError(_key(path), message)
    return _fill_defaults(schema, value)


def load_run_config(file: str | Path) -> dict:
    """Reads and parses a run config YAML file (examples/run.yaml) as ``npm run run -- start`` does."""
    try:
        with open(file, encoding="utf-8") as f:
            raw = yaml.load(f, Loader=_Yaml12Loader)  # noqa: S506 (a safe loader)
    except (OSError, yaml.YAMLError, ValueError) as err:
        raise ConfigError(str(file), f"cannot read run config: {' '.join(str(err).split())}") from None
    return parse_run_config(raw)

"""Settings as files: the presets, ``--config`` files and ``RUN_DIR/config.yaml``, read with the
types the fields declare (a YAML value is checked as a flag's would be) and written back."""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml

from impactrl.config.renamed import renamed_settings
from impactrl.config.settings import TrainConfig
from impactrl.errors import UserError

PRESET_DIR = Path(__file__).parent.parent / "configs"


def preset_files(algo: str, family: str, env: str = "") -> list[Path]:
    """The preset YAML files for an algorithm on an env family, in the order they apply.

    ``env-{family}.yaml``: what the family needs whatever the algorithm (preprocessing, reward
    clipping, network, normalisation); ``{algo}.yaml``: the algorithm's own defaults;
    ``{algo}-{family}.yaml``: the algorithm's tuning for the family; ``suite-{env}.yaml`` when
    ``env`` names a task suite (its envs and step budget). Any may be missing.
    """
    names = (f"env-{family}.yaml", f"{algo}.yaml", f"{algo}-{family}.yaml", f"suite-{env}.yaml")
    return [PRESET_DIR / name for name in names if (PRESET_DIR / name).exists()]


def preset_values(algo: str, family: str, env: str = "") -> dict[str, Any]:
    values: dict[str, Any] = {}
    for path in preset_files(algo, family, env):
        values.update(load_yaml(path))
    return values


def field_names() -> set[str]:
    return {f.name for f in dataclasses.fields(TrainConfig)}


def integer_settings() -> set[str]:
    """The settings of type int (or int | None)."""
    return {name for name, hint in typing.get_type_hints(TrainConfig).items()
            if hint is int or int in typing.get_args(hint) and typing.get_origin(hint) is not tuple}


# What a YAML list may hold for a tuple[int, ...], tuple[float, ...] or tuple[str, ...] setting.
TUPLE_ITEM_NAMES = {int: "integers", float: "numbers", str: "strings"}


def is_whole(value: Any) -> bool:
    """An integer, or a float with an integer value: YAML's ``1e6`` and ``--total-env-steps 1e6``."""
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or isinstance(value, float) and value.is_integer()


def fits(value: Any, kind: type) -> bool:
    """Whether a YAML scalar can be a setting (or a list item) of type ``kind``: int, float or str."""
    if kind is int:
        return is_whole(value)
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, kind)


def type_problem(name: str, value: Any, annotation: Any) -> str | None:
    """Why ``value`` (from YAML) cannot be the setting ``name`` of type ``annotation``, or None."""
    options = typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, types.UnionType) else (annotation,)
    for option in options:
        origin = typing.get_origin(option)
        if option is type(None) and value is None:
            return None
        if origin is Literal and value in typing.get_args(option):
            return None
        if origin is tuple and isinstance(value, (list, tuple)) and all(fits(v, typing.get_args(option)[0]) for v in value):
            return None
        if option is bool and isinstance(value, bool) or option in (int, float, str) and fits(value, option):
            return None
        if option is Path and isinstance(value, (str, Path)):
            return None
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string", Path: "a path",
             type(None): "null"}
    wanted = " or ".join(
        "one of " + ", ".join(map(str, typing.get_args(o))) if typing.get_origin(o) is Literal
        else f"a list of {TUPLE_ITEM_NAMES[typing.get_args(o)[0]]}" if typing.get_origin(o) is tuple
        else names[o] for o in options)
    return f"{name} must be {wanted}, got {value!r}"


def coerce(values: dict[str, Any], source: str, warn_renamed: bool = False) -> dict[str, Any]:
    """Check names and types of settings from a YAML file like flags; take renamed settings under
    their new names (``warn_renamed``: with a warning each); turn lists into tuples and
    integer-valued floats of integer settings into ints."""
    values = renamed_settings(values, source, warn_renamed)
    unknown = sorted(set(values) - field_names())
    if unknown:
        raise UserError(f"{source}: unknown setting(s) {', '.join(unknown)}")
    hints = typing.get_type_hints(TrainConfig)
    wrong = [problem for name, value in values.items() if (problem := type_problem(name, value, hints[name]))]
    if wrong:
        raise UserError(f"{source}: {'; '.join(wrong)}")
    out = dict(values)
    for name, value in out.items():
        if isinstance(value, list) and typing.get_origin(hints[name]) is tuple:
            out[name] = tuple(value)
    for name, value in out.items():
        if int in typing.get_args(hints[name]) + (hints[name],) and isinstance(value, float):
            out[name] = int(value)
    if isinstance(out.get("hidden_sizes"), tuple):
        out["hidden_sizes"] = tuple(int(size) for size in out["hidden_sizes"])
    if out.get("out") is not None:
        out["out"] = Path(out["out"])
    return out


class NumbersLoader(yaml.SafeLoader):
    """PyYAML's safe loader, reading numbers as users write them: YAML 1.1, which PyYAML follows,
    makes ``1e-3`` and ``1E5`` strings (its floats need a dot and a signed exponent), where YAML 1.2
    reads floats."""


NumbersLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."))


class ConfigLoader(NumbersLoader):
    """The loader of settings files: a key given twice in one mapping is refused, where PyYAML keeps
    the last silently (and the user's first value, perhaps the one meant, is lost)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        lines: dict[Any, int] = {}  # key -> the line it is first given on
        for key_node, _ in node.value:
            # ``<<: *defaults`` merges a mapping in, whose keys those beside it may override.
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key, line = self.construct_object(key_node), key_node.start_mark.line + 1
            if key in lines:
                where = f"line {line}" if lines[key] == line else f"lines {lines[key]} and {line}"
                raise yaml.constructor.ConstructorError(None, None, f"the key {key!r} is given twice ({where})",
                                                        key_node.start_mark)
            lines[key] = line
        return super().construct_mapping(node, deep)


def load_yaml(path: Path) -> dict[str, Any]:
    """A ``--config`` file or preset: its settings, type-checked; UserError (one line) when it cannot be read."""
    try:
        data = yaml.load(Path(path).read_text(encoding="utf-8"), Loader=ConfigLoader)
    except FileNotFoundError:
        raise UserError(f"config file {path} does not exist") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        raise UserError(f"cannot read config file {path}: {str(error).splitlines()[0]}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"config file {path} must hold a mapping of setting: value")
    return coerce(data, str(path), warn_renamed=True)


def to_yaml(config: TrainConfig) -> str:
    values = dataclasses.asdict(config)
    values.update({name: list(value) for name, value in values.items() if isinstance(value, tuple)})
    values["out"] = str(config.out) if config.out is not None else None
    return yaml.safe_dump(values, sort_keys=False)


def with_values(config: TrainConfig, values: dict[str, Any]) -> TrainConfig:
    return dataclasses.replace(config, **values)



"""Loading, overriding, validating and dumping run configs.

A config is a YAML mapping whose shape is declared in `distfl.schema`; `section.key=value` overrides
are applied on top. Every problem is reported as a `ConfigError` before any work starts.
"""
from __future__ import annotations

import ast
import copy
import dataclasses
import difflib
import io
import math
import re
import struct
import sys
import tokenize
import typing
import warnings
from pathlib import Path

import yaml

from distfl import schema
from distfl.errors import ConfigError
from distfl.schema import (APPLIES_ONLY_TO, CHOICES, FEATURE_DIM_MODELS, HEAD_SPLIT, NUM_CLASSES, PERSONALISED, PLUGIN_KEYS,
                           Config)

__all__ = [
    "ConfigWarning",
    "apply_overrides",
    "config_from_dict",
    "config_keys",
    "config_reference_markdown",
    "config_to_dict",
    "dump_config",
    "load_config",
    "load_sweep_block",
    "validate",
]


class ConfigWarning(UserWarning):
    """A key was set explicitly but the current choice of another key ignores it."""


# Keys that may change when a run is resumed: they do not alter what the finished model will be.
# Keys of the phases after training (calibration.*, tct.*) may change until their phase starts:
# calibrate a finished run (`distfl calibrate RUN_DIR`), or try other stage-2 settings on a copy of a
# TCT run directory whose stage 1 is done. The runner refuses them once the phase has begun.
PHASE_KEYS = ("calibration.", "tct.")
RESUMABLE_KEYS = ("train.rounds", "eval.", "checkpoint.", "output.progress", "output.tensorboard",
                  "runtime.device", "runtime.threads", "runtime.deterministic", *PHASE_KEYS)
# eval.* keys that may not change on resume: a holdout split removes samples from the clients' training data.
HOLDOUT_KEYS = ("eval.client_split", "eval.client_holdout")
# Keys whose default changed after they were added: the value a saved config that lacks the key ran with
# (it predates the key), where that differs from today's default.
PREVIOUS_DEFAULTS = {"tct.coordinate_order": "drawn"}

def flatten_dict(d: dict, prefix: str = "") -> dict:
    """{"train": {"rounds": 5}} -> {"train.rounds": 5}."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten_dict(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def saved_values(saved: dict) -> dict:
    """A saved run's config (nested, as in its config.yaml or checkpoint), flat, with every key it
    predates at the value it ran with: today's default, or its `PREVIOUS_DEFAULTS` entry."""
    return {**flatten_dict(config_to_dict(Config())), **PREVIOUS_DEFAULTS, **flatten_dict(saved)}


def resume_blockers(saved: dict, now: dict) -> list[str]:
    """Dotted keys whose values differ between two config dicts and may not change on resume."""
    saved, now = saved_values(saved), flatten_dict(now)
    # A cosine lr is a function of train.rounds: more rounds would change the lr of rounds already trained.
    # eval.client_split and eval.client_holdout decide which samples the clients train on.
    fixed = ("train.rounds",) if "cosine" in (now["train.lr_schedule"], now["server.lr_schedule"]) else ()
    fixed += HOLDOUT_KEYS
    return [k for k in now if k != "output.dir" and saved.get(k) != now[k]
            and (k in fixed or not k.startswith(RESUMABLE_KEYS))]


# Valid ranges: ">= x", "> x", "[0, 1)", "[0, 1]", "(0, 1]" or "(0, 1)".
RANGES = {
    "seed": ">= 0",
    "data.synthetic_train": ">= 1",
    "data.synthetic_test": ">= 1",
    "data.synthetic_classes": ">= 2",
    "data.synthetic_image_size": ">= 1",
    "data.synthetic_channels": ">= 1",
    "partition.num_clients": ">= 1",
    "partition.alpha": "> 0",
    "partition.classes_per_client": ">= 1",
    "partition.shards_per_client": ">= 1",
    "partition.min_size": ">= 0",
    "partition.max_attempts": ">= 0",
    "partition.imbalance_ratio": "(0, 1]",
    "partition.subsample": "(0, 1]",
    "partition.seed": ">= -1",
    "model.gn_groups": ">= 1",
    "model.mlp_hidden": ">= 1",
    "model.feature_dim": ">= 0",
    "model.head_seed": ">= 0",
    "calibration.ridge": ">= 0",
    "tct.p": ">= 1",
    "tct.coordinate_seed": ">= 0",
    "tct.head_seed": ">= 0",
    "tct.rounds": ">= 1",
    "tct.local_steps": ">= 1",
    "tct.lr": "> 0",
    "tct.chunk_size": ">= 1",
    "tct.memory_limit_gb": ">= 0",
    "calibration.batch_size": ">= 1",
    "algorithm.mu": ">= 0",
    "algorithm.alpha": "> 0",
    "algorithm.beta_local": "[0, 1)",
    "algorithm.beta_global": "[0, 1)",
    "algorithm.server_alpha": "> 0",
    "algorithm.kd_lambda": "[0, 1]",
    "algorithm.kd_temperature": "> 0",
    "algorithm.fedfor_alpha": ">= 0",
    "algorithm.head_epochs": ">= 0",
    "algorithm.body_epochs": ">= 0",
    "algorithm.finetune_epochs": ">= 0",
    "algorithm.ditto_lambda": ">= 0",
    "algorithm.apfl_alpha": "[0, 1]",
    "algorithm.apfl_alpha_lr": ">= 0",
    "aggregation.tau": "[0, 1]",
    "server.lr": "> 0",
    "server.momentum": "[0, 1)",
    "server.lr_warmup_rounds": ">= 0",
    "server.lr_min": ">= 0",
    "server.lr_step_every": ">= 1",
    "server.lr_gamma": "> 0",
    "server.beta1": "[0, 1)",
    "server.beta2": "[0, 1)",
    "server.eps": "> 0",
    "train.rounds": ">= 1",
    "train.clients_per_round": ">= 1",
    "train.local_epochs": ">= 1",
    "train.local_steps": ">= 0",
    "train.batch_size": ">= 1",
    "train.lr": "> 0",
    "train.weight_decay": ">= 0",
    "train.momentum": "[0, 1)",
    "train.lr_warmup_rounds": ">= 0",
    "train.lr_min": ">= 0",
    "train.lr_step_every": ">= 1",
    "train.lr_gamma": "> 0",
    "eval.every": ">= 1",
    "eval.batch_size": ">= 1",
    "eval.client_test_size": ">= 0",
    "eval.client_holdout": "(0, 1)",
    "checkpoint.every": ">= 0",
    "checkpoint.keep": ">= 1",
    "runtime.threads": ">= 1",
    "runtime.pack_size": ">= 0",
    "tct.threads": ">= 0",
}

# The largest seed each key's consumer accepts: the partition's numpy RandomState takes 32 bits,
# torch's generators 64.
SEED_MAX = {"seed": 2**32 - 1, "partition.seed": 2**32 - 1, "model.head_seed": 2**64 - 1, "tct.coordinate_seed": 2**64 - 1,
            "tct.head_seed": 2**64 - 1}


# --- schema introspection ---------------------------------------------------------------------------

def _sections() -> dict[str, type]:
    """Top-level field name -> section dataclass, in schema order."""
    hints = typing.get_type_hints(Config)
    return {f.name: hints[f.name] for f in dataclasses.fields(Config)
            if dataclasses.is_dataclass(hints[f.name])}


def _leaf_types() -> dict[str, type]:
    """Dotted key -> field type (int, float, bool or str), in schema order."""
    hints = typing.get_type_hints(Config)
    out = {}
    for f in dataclasses.fields(Config):
        typ = hints[f.name]
        if dataclasses.is_dataclass(typ):
            sub_hints = typing.get_type_hints(typ)
            for sf in dataclasses.fields(typ):
                out[f"{f.name}.{sf.name}"] = sub_hints[sf.name]
        else:
            out[f.name] = typ
    return out


_SECTIONS = _sections()
_TYPES = _leaf_types()
_TOP_LEVEL = [f.name for f in dataclasses.fields(Config)]
# A plugin method's options: `algorithm.options.KEY`, checked against its Options dataclass in `validate`.
OPTIONS_KEY = "algorithm.options"


def config_keys() -> list[str]:
    """Every dotted key, in schema order: "seed", "data.dataset", ..."""
    return list(_TYPES)


# --- errors -----------------------------------------------------------------------------------------

def _unknown_key_error(key: str, where: str) -> ConfigError:
    section = key.rpartition(".")[0]
    if section in _SECTIONS:
        names = [f.name for f in dataclasses.fields(_SECTIONS[section])]
        candidates = [f"{section}.{n}" for n in names]
        listing = f"valid keys in {section!r}: {', '.join(names)}"
    else:
        candidates = _TOP_LEVEL if not section else config_keys()
        listing = f"valid top-level keys: {', '.join(_TOP_LEVEL)}"
    msg = f"unknown key {key!r} in {where}"
    close = difflib.get_close_matches(key, candidates, n=1)
    if close:
        msg += f"; did you mean {close[0]!r}?"
    return ConfigError(f"{msg} {listing}" if close else f"{msg}; {listing}")


def _choice_error(key: str, value: str, valid: list[str] | None = None, more: str = "") -> ConfigError:
    valid = CHOICES[key] if valid is None else valid
    close = difflib.get_close_matches(str(value), valid, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ";"
    return ConfigError(f"{key}: unknown choice {value!r}{hint} valid: {', '.join(valid)}{more}")


# --- type conversion --------------------------------------------------------------------------------

def _convert(key: str, value, typ: type):
    """Return `value` as `typ`, or raise ConfigError naming the key."""
    got = f"got {value!r} ({type(value).__name__})"
    if typ is bool:
        # 0/1 are accepted because an override "download=0" parses as the integer 0.
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        raise ConfigError(f"{key} must be true or false, {got}")
    if typ is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{key} must be an integer, {got}")
    if typ is float:
        if isinstance(value, bool):
            raise ConfigError(f"{key} must be a number, {got}")
        if isinstance(value, (int, float)):
            number = float(value)
        elif isinstance(value, str):
            # PyYAML (YAML 1.1) reads 1e-3 as the string "1e-3".
            try:
                number = float(value)
            except ValueError:
                raise ConfigError(f"{key} must be a number, {got}") from None
        else:
            raise ConfigError(f"{key} must be a number, {got}")
        if not math.isfinite(number):
            raise ConfigError(f"{key} must be a finite number, {got}")
        return number
    if typ is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{key} must be a string, {got}")
    if typ is dict:
        if value is None:
            return {}
        if isinstance(value, dict):
            return value
        raise ConfigError(f"{key} must be a mapping of keys to values, {got}")
    raise TypeError(f"unsupported schema type {typ!r} for {key}")  # a schema bug, not a user error


# --- overrides --------------------------------------------------------------------------------------

def _split_override(item: str) -> tuple[str, str]:
    if not isinstance(item, str) or "=" not in item:
        raise ConfigError(f"bad override {item!r}: expected the form section.key=value, "
                          "e.g. train.rounds=50")
    key, _, text = item.partition("=")
    key = key.strip()
    if not key:
        raise ConfigError(f"bad override {item!r}: missing key; expected the form section.key=value")
    return key, text.strip()


def _parse_override_value(key: str, text: str):
    """Parse like YAML, so `train.lr=1e-3`, `seed=3` and `data.download=false` work."""
    try:
        value = yaml.load(text, Loader=ConfigLoader)
    except yaml.YAMLError:
        value = text
    # A string key keeps its text even when it reads as another YAML type: output.dir=2024.
    if _TYPES.get(key) is str and not isinstance(value, str):
        value = text
    return value


def apply_overrides(d: dict, overrides) -> dict:
    """Return a copy of the nested dict `d` with each "section.key=value" override applied."""
    if isinstance(overrides, str):
        overrides = [overrides]
    out = copy.deepcopy(d) if d else {}
    for item in overrides:
        key, text = _split_override(item)
        where = f"override {item!r}"
        if key in _SECTIONS:
            first = dataclasses.fields(_SECTIONS[key])[0].name
            raise ConfigError(f"{where}: {key!r} is a section, not a key; set one of its keys, "
                              f"e.g. {key}.{first}=...")
        option = key[len(OPTIONS_KEY) + 1:] if key.startswith(OPTIONS_KEY + ".") else None
        if key not in _TYPES and not option:
            raise _unknown_key_error(key, where)
        value = _parse_override_value(key, text)
        if option:  # one option of a plugin method, checked against its Options dataclass in `validate`
            section = out.get("algorithm")
            options = section.get("options") if isinstance(section, dict) else None
            key, value = OPTIONS_KEY, {**(options if isinstance(options, dict) else {}), option: value}
        section, _, leaf = key.rpartition(".")
        if not section:
            out[leaf] = value
            continue
        sub = out.get(section)
        if sub is None:
            sub = out[section] = {}
        if not isinstance(sub, dict):
            raise ConfigError(f"cannot apply {where}: section {section!r} is "
                              f"{sub!r} ({type(sub).__name__}), not a mapping")
        sub[leaf] = value
    return out


# --- building ---------------------------------------------------------------------------------------

def _check_shape(d: dict, where: str) -> None:
    """Reject unknown keys and sections that are not mappings."""
    for name, sub in d.items():
        name = str(name)
        if name not in _TOP_LEVEL:
            raise _unknown_key_error(name, where)
        if name not in _SECTIONS or sub is None:
            continue
        if not isinstance(sub, dict):
            raise ConfigError(f"section {name!r} in {where} must be a mapping of keys, "
                              f"got {sub!r} ({type(sub).__name__})")
        for key in sub:
            if f"{name}.{key}" not in _TYPES:
                raise _unknown_key_error(f"{name}.{key}", where)


def _explicit_keys(d: dict) -> frozenset[str]:
    keys = set()
    for name, sub in d.items():
        if name in _SECTIONS:
            keys.update(f"{name}.{k}" for k in (sub or {}))
        else:
            keys.add(name)
    return frozenset(keys)


def _build(d: dict, origin: dict[str, str], source: str) -> Config:
    def conv(key, value):
        try:
            return _convert(key, value, _TYPES[key])
        except ConfigError as e:
            raise ConfigError(f"{e} in {origin.get(key, source)}") from None

    kwargs = {}
    for name, value in d.items():
        if name in _SECTIONS:
            fields = {k: conv(f"{name}.{k}", v) for k, v in (value or {}).items()}
            kwargs[name] = _SECTIONS[name](**fields)
        else:
            kwargs[name] = conv(name, value)
    return Config(**kwargs)


def config_from_dict(d: dict, overrides=(), source: str = "<dict>") -> Config:
    """Build a validated Config from a parsed YAML mapping plus overrides; see `load_config`."""
    if d is None:  # an empty YAML file
        d = {}
    if not isinstance(d, dict):
        raise ConfigError(f"the top level of {source} must be a mapping of sections, "
                          f"got {type(d).__name__}")
    if isinstance(overrides, str):
        overrides = [overrides]
    _check_shape(d, source)
    merged = apply_overrides(d, overrides)
    origin = {_split_override(item)[0]: f"override {item!r}" for item in overrides}
    cfg = _build(merged, origin, source)
    validate(cfg)
    explicit = _explicit_keys(merged)
    _warn_inapplicable(cfg, explicit)
    object.__setattr__(cfg, "_explicit", explicit)
    return cfg


def load_config(path: str | None, overrides: list[str] = ()) -> Config:
    """Load a YAML config (or all defaults when `path` is None), apply overrides, validate.

    The returned Config carries `_explicit`: the frozenset of dotted keys set by the YAML or overrides.
    """
    if path is None:
        return config_from_dict({}, overrides, source="<defaults>")
    d = _read_yaml(path)
    if isinstance(d, dict):
        # A top-level `sweep:` mapping describes a sweep over this config (`distfl sweep`, see
        # `load_sweep_block`); it is not part of a run's config, so training ignores it.
        d = {k: v for k, v in d.items() if k != SWEEP_BLOCK}
    return config_from_dict(d, overrides, source=str(path))


SWEEP_BLOCK = "sweep"


def load_sweep_block(path: str) -> dict:
    """The top-level `sweep:` mapping of a config file ({} when it has none); `load_config` strips it.

    Only its shape is checked here (a mapping); `distfl.sweep` validates what is in it.
    """
    d = _read_yaml(path)
    block = d.get(SWEEP_BLOCK) if isinstance(d, dict) else None
    if block is None:
        return {}
    if not isinstance(block, dict):
        raise ConfigError(f"{SWEEP_BLOCK!r} in {path} must be a mapping (grid, seeds, executor, slurm), "
                          f"got {block!r} ({type(block).__name__})")
    return copy.deepcopy(block)


def _read_yaml(path: str):
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read config file {path}: {e}") from None
    try:
        return yaml.load(text, Loader=ConfigLoader)
    except yaml.YAMLError as e:
        raise ConfigError(f"cannot parse config file {path} as YAML: {e}") from None


class ConfigLoader(yaml.SafeLoader):
    """`yaml.safe_load` without YAML 1.1's surprises, for config files and override values.

    - Only `true`/`false` are booleans, only plain decimals are integers (`1:30`, `0x10`, `010` stay
      strings, so an integer key refuses them instead of reading 90, 16 or 8), `1e-3` is a float, and
      dates stay strings; `yes`, `no`, `on` and `off` are strings.
    - Aliases (`*name`) are refused: a few lines of nested aliases expand to billions of nodes.
    - A key given twice in one mapping is refused instead of the last one silently winning.
    """

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, f"found the alias *{event.anchor}: YAML anchors and aliases are not accepted "
                "in distfl configs; write the value out", event.start_mark)
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):
        seen = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first given on line {seen[key] + 1}); "
                    "give each key once", key_node.start_mark)
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep)


ConfigLoader.yaml_implicit_resolvers = {}
for _tag, _pattern, _first in [
    ("bool", r"true|True|TRUE|false|False|FALSE", "tTfF"),
    ("int", r"[-+]?(?:0|[1-9][0-9_]*)", "-+0123456789"),
    ("float", r"[-+]?(?:[0-9][0-9_]*\.[0-9_]*|\.[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)?"
              r"|[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)", "-+0123456789."),
    ("null", r"~|null|Null|NULL|", ["~", "n", "N", ""]),
]:
    ConfigLoader.add_implicit_resolver(f"tag:yaml.org,2002:{_tag}", re.compile(f"^(?:{_pattern})$"), list(_first))


# --- validation -------------------------------------------------------------------------------------

def _range_text(spec: str) -> str:
    return f"in {spec}" if spec.startswith(("[", "(")) else spec


def _in_range(value, spec: str) -> bool:
    if spec == "[0, 1)":
        return 0 <= value < 1
    if spec == "[0, 1]":
        return 0 <= value <= 1
    if spec == "(0, 1]":
        return 0 < value <= 1
    if spec == "(0, 1)":
        return 0 < value < 1
    if spec.startswith(">="):
        return value >= float(spec[2:])
    if spec.startswith(">"):
        return value > float(spec[1:])
    raise ValueError(spec)


def _values(cfg: Config) -> dict[str, object]:
    """Dotted key -> type-checked value."""
    out = {}
    for key, typ in _TYPES.items():
        section, _, leaf = key.rpartition(".")
        obj = getattr(cfg, section) if section else cfg
        out[key] = _convert(key, getattr(obj, leaf), typ)
    return out


def _range_error(key: str, value, spec: str) -> ConfigError:
    return ConfigError(f"{key} must be {_range_text(spec)}, got {value!r}")


def _plugin(key: str, name: str):
    """The class or function a plugin name (import path or entry point) refers to; ConfigError naming `key`."""
    from distfl import plugins

    try:
        return plugins.load_plugin(key, name)
    except KeyError:
        what = "ClassName (a distfl.Algorithm subclass)" if key == "algorithm.name" else "build (a model builder)"
        raise _choice_error(key, name, CHOICES[key] + plugins.entry_point_names(key),
                            f", or an import path package.module:{what}") from None


def _algorithm_options(name: str, options: dict) -> dict:
    """A plugin method's `algorithm.options`, complete (defaults filled in) and converted to the types
    its `Options` dataclass declares, with ranges (`metadata={"range": "[0, 1)"}`) and choices
    (`metadata={"choices": [...]}`) checked like the built-in keys'."""
    from distfl import plugins

    cls = None if name in CHOICES["algorithm.name"] else _plugin("algorithm.name", name)
    fields = plugins.options_fields(cls) if cls is not None else []
    names = [f.name for f in fields]
    for option in options:
        if option not in names:
            key = f"{OPTIONS_KEY}.{option}"
            if not names:
                raise ConfigError(f"{key}: algorithm.name={name} declares no options (a plugin method "
                                  "declares them as a dataclass `Options` on its class)")
            close = difflib.get_close_matches(str(option), names, n=1)
            hint = f"; did you mean '{OPTIONS_KEY}.{close[0]}'?" if close else ";"
            raise ConfigError(f"unknown key {key!r}{hint} valid keys in {OPTIONS_KEY!r} for {name}: {', '.join(names)}")
    types = typing.get_type_hints(cls.Options) if fields else {}
    out = {}
    for f in fields:
        key = f"{OPTIONS_KEY}.{f.name}"
        if types[f.name] not in (bool, int, float, str):
            raise ConfigError(f"{name}: Options.{f.name} is declared as {types[f.name]!r}; plugin options "
                              "must be bool, int, float or str")
        if f.name in options:
            value = _convert(key, options[f.name], types[f.name])
        elif f.default is not dataclasses.MISSING:
            value = f.default
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
        else:
            raise ConfigError(f"{key} must be set: {name} gives it no default")
        if "choices" in f.metadata and value not in f.metadata["choices"]:
            raise _choice_error(key, value, list(f.metadata["choices"]))
        if "range" in f.metadata and not _plugin_in_range(name, f.name, value, f.metadata["range"]):
            raise _range_error(key, value, f.metadata["range"])
        out[f.name] = value
    return out


def _plugin_in_range(name: str, option: str, value, spec) -> bool:
    try:
        return _in_range(value, spec)
    except (ValueError, TypeError):
        raise ConfigError(f"{name}: Options.{option} has metadata range {spec!r}; valid forms: \">= x\", "
                          "\"> x\", \"[0, 1)\", \"[0, 1]\", \"(0, 1]\", \"(0, 1)\"") from None


def _check_files(v: dict) -> None:
    """data.path and partition.path exist when their choice needs them (read when the run loads data)."""
    needs = {"data.path": (v["data.dataset"] == "files", "data.dataset=files",
                           "an .npz with x_train, y_train, x_test, y_test, or a folder with train/ and test/ ImageFolder trees"),
             "partition.path": (v["partition.scheme"] == "file", "partition.scheme=file",
                                "an .npz with one index array per client, client_0 .. client_{N-1}")}
    for key, (needed, choice, what) in needs.items():
        if needed and not v[key]:
            raise ConfigError(f"{choice} needs {key}: {what}")
        if needed and not Path(v[key]).exists():
            raise ConfigError(f"{key}: {v[key]} does not exist (expected {what})")
    if v["partition.scheme"] == "file":
        from distfl.data.partition import file_client_count

        count = file_client_count(v["partition.path"])
        if count != v["partition.num_clients"]:
            raise ConfigError(f"partition.path {v['partition.path']} holds {count} clients but partition.num_clients="
                              f"{v['partition.num_clients']}; set partition.num_clients={count}")


def validate(cfg: Config) -> None:
    """Raise ConfigError for a wrong type, unknown choice, out-of-range value or impossible combination."""
    v = _values(cfg)
    for key, valid in CHOICES.items():
        if key in PLUGIN_KEYS and v[key] not in valid:
            _plugin(key, v[key])
        elif v[key] not in valid:
            raise _choice_error(key, v[key])
    for key, spec in RANGES.items():
        if not _in_range(v[key], spec):
            raise _range_error(key, v[key], spec)
    for key, largest in SEED_MAX.items():
        if v[key] > largest:
            raise ConfigError(f"{key} must be at most {largest} (numpy and torch refuse larger seeds), "
                              f"got {v[key]}")
    if not v["output.dir"].strip() or "\0" in v["output.dir"]:
        raise ConfigError(f"output.dir must name a directory (not empty, no NUL character), got {v['output.dir']!r}")
    if not 0 < _float32(v["server.eps"] ** 2) < math.inf:
        raise ConfigError(f"server.eps={v['server.eps']!r}: its square, the optimizer's initial second moment, "
                          "is 0 or inf in float32; use a value between 1e-22 and 1e19")
    cfg.algorithm.options = _algorithm_options(v["algorithm.name"], v[OPTIONS_KEY])
    _check_files(v)

    if v["train.clients_per_round"] > v["partition.num_clients"]:
        raise ConfigError(
            f"train.clients_per_round ({v['train.clients_per_round']}) > partition.num_clients "
            f"({v['partition.num_clients']}): a round cannot sample more clients than exist")

    if v["train.local_steps"] and v["train.local_epochs"] != 1:
        raise ConfigError(f"train.local_steps={v['train.local_steps']} fixes the local steps of a round, so "
                          f"train.local_epochs={v['train.local_epochs']} would be ignored: set one of them "
                          "(train.local_epochs=1 with local_steps, or train.local_steps=0)")

    check_feature_dim(v["model.name"], v["model.feature_dim"])

    if v["eval.client_split"] == "holdout" and not v["eval.clients"]:
        raise ConfigError("eval.client_split=holdout holds out part of every client's training data for per-client "
                          "evaluation, which is off: set eval.clients=true (or eval.client_split=test)")

    if v["algorithm.name"] == "tct":
        if v["calibration.method"] != "none":
            raise ConfigError("algorithm.name=tct replaces the network by a linear model on eNTK features; "
                              "calibration.method=ffc does not apply to it: set calibration.method=none")
        if v["model.head"] != "linear":
            raise ConfigError(f"algorithm.name=tct re-initialises a learnable linear head; model.head="
                              f"{v['model.head']} is fixed: use model.head=linear")

    _check_personalised(v)

    dataset = v["data.dataset"]
    classes = v["data.synthetic_classes"] if dataset == "synthetic" else NUM_CLASSES.get(dataset)
    # Only checked for n_classes: other schemes ignore the key, and sweeps vary the scheme. The class
    # count of data.dataset=files is known once its labels are read (partition checks it then).
    if v["partition.scheme"] == "n_classes" and classes is not None and v["partition.classes_per_client"] > classes:
        source = "data.synthetic_classes" if dataset == "synthetic" else f"data.dataset={dataset}"
        raise ConfigError(
            f"partition.classes_per_client ({v['partition.classes_per_client']}) > number of classes "
            f"({classes}, from {source}): a client cannot hold more distinct labels than exist")


def _check_personalised(v: dict) -> None:
    """The compositions of a personalised method (fedper, fedrep, fedbabu, ditto, apfl) that make no sense."""
    name = v["algorithm.name"]
    if name not in PERSONALISED:
        return
    if v["aggregation.fedbn"]:
        raise ConfigError(f"algorithm.name={name} keeps a personal model part per client already; aggregation.fedbn "
                          "(personal BatchNorm) does not compose with it: set aggregation.fedbn=false")
    if name in HEAD_SPLIT and v["model.head"] != "linear":
        raise ConfigError(f"algorithm.name={name} splits the model into a shared body and a learnable classifier head; "
                          f"model.head={v['model.head']} is fixed: use model.head=linear")
    if name in HEAD_SPLIT and v["calibration.method"] != "none":
        raise ConfigError(f"algorithm.name={name} keeps the head per client; calibration.method="
                          f"{v['calibration.method']} would replace it by one global head: set calibration.method=none")
    if name == "fedrep":
        if v["train.local_steps"] or v["train.local_epochs"] != 1:
            raise ConfigError("algorithm.name=fedrep trains algorithm.head_epochs epochs of the head, then "
                              "algorithm.body_epochs of the body; set those (and train.local_epochs=1, train.local_steps=0)")
        if v["algorithm.head_epochs"] + v["algorithm.body_epochs"] == 0:
            raise ConfigError("algorithm.name=fedrep with algorithm.head_epochs=0 and algorithm.body_epochs=0 trains "
                              "nothing; set one of them >= 1")


def check_feature_dim(model_name: str, feature_dim: int) -> None:
    """ConfigError unless model.feature_dim is 0 (the model's own width) or the model can change its width."""
    if feature_dim and model_name not in FEATURE_DIM_MODELS:
        raise ConfigError(f"model.feature_dim={feature_dim} is only supported by model.name in "
                          f"[{', '.join(FEATURE_DIM_MODELS)}]; model.name={model_name} has a fixed feature "
                          "width: set model.feature_dim=0")


def _float32(x: float) -> float:
    """`x` rounded to float32 (0 below its smallest subnormal, inf above its largest value)."""
    try:
        return struct.unpack("f", struct.pack("f", x))[0]
    except OverflowError:
        return math.inf


def _warn_inapplicable(cfg: Config, explicit: frozenset[str]) -> None:
    v = _values(cfg)
    defaults = _values(Config())
    for key, (controller, used_by) in APPLIES_ONLY_TO.items():
        # A key left at its default is not warned about: a dumped config (run dir, resume) sets
        # every key explicitly, and would otherwise warn for each one its choices ignore.
        if key in explicit and v[key] != defaults[key] and v[controller] not in used_by:
            warnings.warn(f"{key} is set but only used by {controller} in [{', '.join(used_by)}]; "
                          f"it is ignored for {v[controller]}", ConfigWarning,
                          stacklevel=_caller_stacklevel())


def _caller_stacklevel() -> int:
    """The warnings stacklevel of the first frame outside this module, so the warning points there."""
    level, frame = 1, sys._getframe(1)
    while frame is not None and frame.f_code.co_filename == __file__:
        level, frame = level + 1, frame.f_back
    return level


# --- output -----------------------------------------------------------------------------------------

def data_seed(cfg: Config) -> int:
    """The seed of the run's data (`partition.seed`, or the run's `seed` when that is -1)."""
    return cfg.seed if cfg.partition.seed < 0 else cfg.partition.seed


def config_to_dict(cfg: Config) -> dict:
    """A plain nested dict of the config, in schema order (YAML/JSON-dumpable)."""
    return dataclasses.asdict(cfg)


def dump_config(cfg: Config) -> str:
    """YAML text of the resolved config; `load_config` on it gives an equal Config."""
    return yaml.safe_dump(config_to_dict(cfg), sort_keys=False, default_flow_style=False)


def _field_comments() -> dict[str, str]:
    """Dotted key -> the trailing comment on its line in schema.py."""
    source = Path(schema.__file__).read_text()
    comments = {tok.start[0]: tok.string.lstrip("#").strip()
                for tok in tokenize.generate_tokens(io.StringIO(source).readline)
                if tok.type == tokenize.COMMENT}
    classes = {node.name: node for node in ast.parse(source).body if isinstance(node, ast.ClassDef)}
    line_of = {}
    for name, section in _SECTIONS.items():
        for node in classes[section.__name__].body:
            if isinstance(node, ast.AnnAssign):
                line_of[f"{name}.{node.target.id}"] = node.lineno
    for node in classes[Config.__name__].body:
        if isinstance(node, ast.AnnAssign) and node.target.id not in _SECTIONS:
            line_of[node.target.id] = node.lineno
    return {key: comments.get(line, "") for key, line in line_of.items()}


def _default_text(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def config_reference_markdown() -> str:
    """The text of docs/config.md, generated from the schema so the two cannot drift apart."""
    comments = _field_comments()
    defaults = {}
    for key in _TYPES:
        section, _, leaf = key.rpartition(".")
        obj = getattr(Config(), section) if section else Config()
        defaults[key] = getattr(obj, leaf)

    lines = [
        "# Config reference",
        "",
        "<!-- Generated by distfl.config.config_reference_markdown(); do not edit by hand.",
        "     Regenerate with: python -m distfl.config > docs/config.md -->",
        "",
        "A run is configured by a YAML file of the sections below (any key left out takes its default)",
        "and `section.key=value` overrides applied after it, e.g. `train.rounds=50 algorithm.name=fedprox`.",
        "Unknown keys, wrong types, unknown choices, out-of-range values and impossible combinations",
        "are errors reported before any work starts. Setting a key to a non-default value that the",
        "current choice of another key ignores (e.g. `algorithm.mu=0.1` with `algorithm.name=fedavg`)",
        "is a warning, not an error, since sweeps vary the controlling key.",
        "",
    ]
    groups = [("Top level", [k for k in _TYPES if "." not in k])]
    groups += [(f"`{name}`", [k for k in _TYPES if k.startswith(name + ".")]) for name in _SECTIONS]
    for title, keys in groups:
        lines += [f"## {title}", "",
                  "| key | type | default | valid | description |", "|---|---|---|---|---|"]
        for key in keys:
            if key in CHOICES:
                valid = ", ".join(CHOICES[key])
            elif key in RANGES:
                valid = _range_text(RANGES[key]) + (f", <= {SEED_MAX[key]}" if key in SEED_MAX else "")
            else:
                valid = ""
            description = comments[key]
            if key in APPLIES_ONLY_TO:
                controller, used_by = APPLIES_ONLY_TO[key]
                description += f" (only used when `{controller}` is {' or '.join(used_by)})"
            row = [f"`{key}`", _TYPES[key].__name__, f"`{_default_text(defaults[key])}`", valid, description]
            lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(config_reference_markdown(), end="")

"""Loading, overriding, validating and dumping run configs.

A config is a YAML mapping whose shape is declared in `distfl.schema`; `section.key=value` overrides
are applied on top. Every problem is reported as a `ConfigError` before any work starts.
"""
from __future__ import annotations

import copy
import dataclasses
import difflib
import math
import struct
import sys
import typing
import warnings
from pathlib import Path

import yaml

from distfl.errors import ConfigError
from distfl.config.renamed import RENAMED, caller_stacklevel, options_from_renamed, pop_renamed, renamed_hint
from distfl.schema import APPLIES_ONLY_TO, CHOICES, FEATURE_DIM_MODELS, NUM_CLASSES, PLUGIN_KEYS, RANGES, SEED_MAX, Config
from distfl.validate import check_numbers, float_error, number_from_text
from distfl.yaml_loader import ConfigLoader, read_yaml

__all__ = [
    "ConfigWarning",
    "apply_overrides",
    "config_from_dict",
    "config_keys",
    "config_to_dict",
    "dump_config",
    "load_config",
    "load_sweep_block",
    "validate",
]


class ConfigWarning(UserWarning):
    """A key was set explicitly but the current choice of another key ignores it."""


def flatten_dict(d: dict, prefix: str = "") -> dict:
    """{"train": {"rounds": 5}} -> {"train.rounds": 5}."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten_dict(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out



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

def _shown(value) -> str:
    """repr(value), cut short when long (a value pasted by mistake, nested thousands deep)."""
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:60]}... ({len(text)} characters)"


def _convert(key: str, value, typ: type, text: bool = True):
    """Return `value` as `typ`, or raise ConfigError naming the key. `text`: a string may spell a number
    or bool (YAML, overrides); a Config's own fields, which the run uses as they are, must hold the type."""
    got = f"got {_shown(value)} ({type(value).__name__})"
    if text and typ in (bool, int, float) and isinstance(value, str):  # quoted: read as the same text unquoted
        value = number_from_text(value, _unquoted_tag)
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
        if not isinstance(value, (int, float)):
            raise ConfigError(f"{key} must be a number, {got}")
        number = float(value)
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
        if key not in _TYPES and key not in RENAMED and not option:
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
            if f"{name}.{key}" not in _TYPES and f"{name}.{key}" not in RENAMED:
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
    origin = {_split_override(item)[0]: f"override {_shown(item)}" for item in overrides}
    renamed = pop_renamed(merged)
    cfg = _build(merged, origin, source)
    if renamed:
        def ignored(key, methods):
            warnings.warn(f"{key} is set but only used by algorithm.name in [{', '.join(methods)}]; it is ignored "
                          f"for {cfg.algorithm.name}", ConfigWarning, stacklevel=caller_stacklevel())

        cfg.algorithm.options = options_from_renamed(renamed, _method(cfg), cfg.algorithm.options, origin, ignored)
    try:
        validate(cfg)
    except ConfigError as e:
        raise ConfigError(renamed_hint(str(e), renamed)) from None
    explicit = _explicit_keys(merged) | ({OPTIONS_KEY} if renamed else set())
    _warn_inapplicable(cfg, explicit)
    object.__setattr__(cfg, "_explicit", explicit)
    return cfg


def load_config(path: str | None, overrides: list[str] = ()) -> Config:
    """Load a YAML config (or all defaults when `path` is None), apply overrides, validate.

    The returned Config carries `_explicit`: the frozenset of dotted keys set by the YAML or overrides.
    """
    if path is None:
        return config_from_dict({}, overrides, source="<defaults>")
    d = read_yaml(path)
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
    d = read_yaml(path)
    block = d.get(SWEEP_BLOCK) if isinstance(d, dict) else None
    if block is None:
        return {}
    if not isinstance(block, dict):
        raise ConfigError(f"{SWEEP_BLOCK!r} in {path} must be a mapping (grid, seeds, executor, slurm), "
                          f"got {block!r} ({type(block).__name__})")
    return copy.deepcopy(block)


def _unquoted_tag(text: str) -> str:
    """The YAML tag ConfigLoader gives `text` as an unquoted scalar (..:int, ..:float, ..:bool, ..:str)."""
    return ConfigLoader("").resolve(yaml.ScalarNode, text, (True, False))


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
        out[key] = _convert(key, getattr(obj, leaf), typ, text=False)
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
        raise _choice_error(key, name, _built_in(key) + plugins.entry_point_names(key),
                            f", or an import path package.module:{what}") from None


def _built_in(key: str) -> list[str]:
    if key == "algorithm.name":
        from distfl.algorithms import ALGORITHMS

        return list(ALGORITHMS)
    return CHOICES[key]


def _method(cfg: Config) -> type:
    """The class that trains the run's model (TCT: its stage 1), whose Options `algorithm.options` holds."""
    declared = _plugin_or_built_in(cfg.algorithm.name)
    try:
        return declared.trained_method(cfg)
    except KeyError:  # TCT's stage 1 is not a method
        raise _choice_error("tct.stage1", cfg.tct.stage1) from None


def _algorithm_options(cls: type, name: str, options: dict) -> dict:
    """`algorithm.options` of method `cls`, complete (defaults filled in) and converted to the types its
    `Options` dataclass declares, with ranges (`metadata={"range": "[0, 1)"}`) and choices
    (`metadata={"choices": [...]}`) checked like the other keys'."""
    from distfl import plugins

    fields = plugins.options_fields(cls)
    names = [f.name for f in fields]
    for option in options:
        if option not in names:
            key = f"{OPTIONS_KEY}.{option}"
            if not names:
                raise ConfigError(f"{key}: algorithm.name={name} declares no options (a method "
                                  "declares them as a dataclass `Options` on its class)")
            close = difflib.get_close_matches(str(option), names, n=1)
            hint = f"; did you mean '{OPTIONS_KEY}.{close[0]}'?" if close else ";"
            raise ConfigError(f"unknown key {key!r}{hint} valid keys in {OPTIONS_KEY!r} for {name}: {', '.join(names)}")
    types = typing.get_type_hints(cls.Options) if fields else {}
    out = {}
    for f in fields:
        key = f"{OPTIONS_KEY}.{f.name}"
        if types[f.name] not in (bool, int, float, str):
            raise ConfigError(f"{name}: Options.{f.name} is declared as {types[f.name]!r}; method options "
                              "must be bool, int, float or str")
        if f.name in options:
            value = _convert(key, options[f.name], types[f.name])
            if types[f.name] is float and float_error(key, value):
                raise float_error(key, value)
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
    check_numbers(_TYPES, v, SEED_MAX)
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
    method = _method(cfg)
    declared = _plugin_or_built_in(v["algorithm.name"])
    cfg.algorithm.options = _algorithm_options(method, v["algorithm.name"], v[OPTIONS_KEY])
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

    declared.check_config(cfg)
    _check_personalised(v, method)
    _check_finetune(v, method)

    dataset = v["data.dataset"]
    classes = v["data.synthetic_classes"] if dataset == "synthetic" else NUM_CLASSES.get(dataset)
    # Only checked for n_classes: other schemes ignore the key, and sweeps vary the scheme. The class
    # count of data.dataset=files is known once its labels are read (partition checks it then).
    if v["partition.scheme"] == "n_classes" and classes is not None and v["partition.classes_per_client"] > classes:
        source = "data.synthetic_classes" if dataset == "synthetic" else f"data.dataset={dataset}"
        raise ConfigError(
            f"partition.classes_per_client ({v['partition.classes_per_client']}) > number of classes "
            f"({classes}, from {source}): a client cannot hold more distinct labels than exist")

    from distfl.privacy import rules as privacy_rules

    privacy_rules.check(v, declared)


def _plugin_or_built_in(name: str) -> type:
    """The class that declares method `name`."""
    from distfl.algorithms import ALGORITHMS

    return ALGORITHMS[name] if name in ALGORITHMS else _plugin("algorithm.name", name)


def _check_personalised(v: dict, method: type) -> None:
    """The compositions of a personalised method (its own model part per client) that make no sense."""
    name = v["algorithm.name"]
    if not method.personalised:
        return
    if v["aggregation.fedbn"]:
        raise ConfigError(f"algorithm.name={name} keeps a personal model part per client already; aggregation.fedbn "
                          "(personal BatchNorm) does not compose with it: set aggregation.fedbn=false")
    if method.head_split and v["model.head"] != "linear":
        raise ConfigError(f"algorithm.name={name} splits the model into a shared body and a learnable classifier head; "
                          f"model.head={v['model.head']} is fixed: use model.head=linear")
    if method.head_split and v["calibration.method"] != "none":
        raise ConfigError(f"algorithm.name={name} keeps the head per client; calibration.method="
                          f"{v['calibration.method']} would replace it by one global head: set calibration.method=none")


def _check_finetune(v: dict, method: type) -> None:
    """eval.finetune_epochs fine-tunes the global model of a method that has one model for all clients."""
    epochs, name = v["eval.finetune_epochs"], v["algorithm.name"]
    if not epochs:
        return
    if not v["eval.clients"]:
        raise ConfigError(f"eval.finetune_epochs={epochs} fine-tunes each client's model before per-client "
                          "evaluation, which is off: set eval.clients=true (or eval.finetune_epochs=0)")
    if method.personalised:
        raise ConfigError(f"eval.finetune_epochs={epochs} fine-tunes the global model, but algorithm.name={name} "
                          f"is personalised: each client is scored with its own model; set eval.finetune_epochs=0")


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
        if key in explicit and v[key] != defaults[key] and not key_applies(key, v):
            warnings.warn(f"{key} is set but only used by {controller} in [{', '.join(used_by)}]; "
                          f"it is ignored for {v[controller]}", ConfigWarning,
                          stacklevel=caller_stacklevel())


def key_applies(key: str, values: dict) -> bool:
    """Whether a run with these flat config values reads `key` (APPLIES_ONLY_TO)."""
    if key not in APPLIES_ONLY_TO:
        return True
    controller, used_by = APPLIES_ONLY_TO[key]
    return values.get(controller) in used_by


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

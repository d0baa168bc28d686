"""Loading, overriding and dumping run configs: a YAML mapping whose shape is declared in
`distfl.config.schema`, with `section.key=value` overrides applied on top, validated
(`distfl.config.validate`) before any work starts.
"""
from __future__ import annotations

import copy
import dataclasses
import difflib
import warnings

import yaml

from distfl.config.options import FEATURE_OPTIONS_KEY
from distfl.config.renamed import RENAMED, SPELLINGS, options_from_renamed, pop_renamed, renamed_hint, respelled
from distfl.config.schema import KEYS, SECTIONS, Config
from distfl.config.validate import OPTIONS_KEY, ConfigWarning, _method, _warn_inapplicable, validate
from distfl.config.values import caller_stacklevel, convert, shown
from distfl.errors import ConfigError
from distfl.yaml_loader import ConfigLoader, read_yaml

_TOP_LEVEL = [f.name for f in dataclasses.fields(Config)]
_SECTIONS = SECTIONS
_TYPES = {name: key.type for name, key in KEYS.items()}


def config_keys() -> list[str]:
    """Every dotted key, in schema order: "seed", "data.dataset", ..."""
    return list(_TYPES)


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


def _split_override(item: str) -> tuple[str, str]:
    if not isinstance(item, str) or "=" not in item:
        raise ConfigError(f"bad override {item!r}: expected the form section.key=value, "
                          "e.g. train.rounds=50")
    key, _, text = item.partition("=")
    key = key.strip()
    if not key:
        raise ConfigError(f"bad override {item!r}: missing key; expected the form section.key=value")
    return SPELLINGS.get(key, key), text.strip()


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
        feature = key[len(FEATURE_OPTIONS_KEY) + 1:] if key.startswith(FEATURE_OPTIONS_KEY + ".") else None
        if key not in _TYPES and key not in RENAMED and not option and not feature:
            raise _unknown_key_error(key, where)
        value = _parse_override_value(key, text)
        if option:  # one option of a plugin method, checked against its Options dataclass in `validate`
            key, value = OPTIONS_KEY, {**_algorithm_mapping(out, "options"), option: value}
        elif feature:  # FEATURE.KEY (or FEATURE: all its options), checked against the feature's Options
            name, _, option = feature.partition(".")
            given = _algorithm_mapping(out, "feature_options")
            own = given.get(name) if isinstance(given.get(name), dict) else {}
            key, value = FEATURE_OPTIONS_KEY, {**given, name: {**own, option: value} if option else value}
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


def _algorithm_mapping(d: dict, name: str) -> dict:
    """d["algorithm"][name] where it is a mapping (options given so far), else {}."""
    section = d.get("algorithm")
    value = section.get(name) if isinstance(section, dict) else None
    return value if isinstance(value, dict) else {}


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
            return convert(key, value, _TYPES[key])
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
    d = respelled(d, source)
    _check_shape(d, source)
    merged = apply_overrides(d, overrides)
    origin = {_split_override(item)[0]: f"override {shown(item)}" for item in overrides}
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


def data_seed(cfg: Config) -> int:
    """The seed of the run's data (`partition.seed`, or the run's `seed` when that is -1)."""
    return cfg.seed if cfg.partition.seed < 0 else cfg.partition.seed


def config_to_dict(cfg: Config) -> dict:
    """A plain nested dict of the config, in schema order (YAML/JSON-dumpable)."""
    return dataclasses.asdict(cfg)


def dump_config(cfg: Config) -> str:
    """YAML text of the resolved config; `load_config` on it gives an equal Config."""
    return yaml.safe_dump(config_to_dict(cfg), sort_keys=False, default_flow_style=False)

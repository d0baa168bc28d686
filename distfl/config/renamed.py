"""Old spellings of keys that moved, read as their new names: the one place that maps them.

A method's keys were flat keys of the `algorithm` section (`algorithm.moon_mu`); they are now the
method's options, `algorithm.options.KEY`, declared by its `Options` dataclass. Configs, overrides,
sweeps and saved runs (config.yaml, checkpoints) written with the old names keep working: an old key
is the option of the methods listed beside it, and is ignored (with a warning when set to another value
than its default, as before) for any other method. One line per old key says its new name.
"""
from __future__ import annotations

import warnings

from distfl.config.validate import ConfigWarning
from distfl.config.values import caller_stacklevel
from distfl.errors import ConfigError

# old key: (its name in algorithm.options, the methods that read it)
RENAMED = {
    "algorithm.mu": ("mu", ("fedprox",)),
    "algorithm.scaffold_correction": ("correction", ("scaffold",)),
    "algorithm.alpha": ("alpha", ("feddyn",)),
    "algorithm.beta_local": ("beta_local", ("fedadc",)),
    "algorithm.beta_global": ("beta_global", ("fedadc", "slowmo")),
    "algorithm.server_alpha": ("server_alpha", ("fedadc", "slowmo")),
    "algorithm.variant": ("variant", ("fedadc",)),
    "algorithm.kd_lambda": ("kd_lambda", ("fedadc",)),
    "algorithm.kd_temperature": ("kd_temperature", ("fedadc",)),
    "algorithm.fedfor_alpha": ("alpha", ("fedfor",)),
    "algorithm.fedfor_boundary": ("boundary", ("fedfor",)),
    "algorithm.fedfor_normalize": ("normalize", ("fedfor",)),
    "algorithm.moon_mu": ("mu", ("moon",)),
    "algorithm.moon_tau": ("tau", ("moon",)),
    "algorithm.fedexp_eps": ("eps", ("fedexp",)),
    "algorithm.head_epochs": ("head_epochs", ("fedrep",)),
    "algorithm.body_epochs": ("body_epochs", ("fedrep",)),
    "algorithm.finetune_epochs": ("finetune_epochs", ("fedbabu",)),
    "algorithm.ditto_lambda": ("lam", ("ditto",)),
    "algorithm.apfl_alpha": ("alpha", ("apfl",)),
    "algorithm.apfl_adaptive": ("adaptive", ("apfl",)),
    "algorithm.apfl_alpha_lr": ("alpha_lr", ("apfl",)),
}

# Other spellings of today's keys, read as the key itself without a warning (both are documented).
# `async` is a Python keyword, so the schema's field is `system.async_mode`; configs may write `system.async`.
SPELLINGS = {"system.async": "system.async_mode"}
# The LoRA keys, model.lora_rank ..., may also be written as a nested `lora` mapping of the model section.
SPELLINGS.update({f"model.lora.{leaf}": f"model.lora_{leaf}" for leaf in ("rank", "alpha", "dropout", "targets", "aggregate")})


def respelled(d: dict, source: str) -> dict:
    """The nested config dict `d` with each other spelling (SPELLINGS) under its key's own name; a key
    given under both names is refused in one line."""
    out = dict(d)
    for section, sub in d.items():  # a nested mapping (model: {lora: {rank: 4}}) read as its dotted keys
        if isinstance(sub, dict) and any(isinstance(v, dict) and f"{section}.{k}." in " ".join(SPELLINGS)
                                         for k, v in sub.items()):
            flat = {}
            for k, v in sub.items():
                if isinstance(v, dict) and all(f"{section}.{k}.{leaf}" in SPELLINGS for leaf in v):
                    flat.update({f"{k}.{leaf}": value for leaf, value in v.items()})
                else:
                    flat[k] = v
            out[section] = flat
    for other, key in SPELLINGS.items():
        section, _, leaf = other.partition(".")
        sub = out.get(section)
        if not isinstance(sub, dict) or leaf not in sub:
            continue
        own = key.partition(".")[2]
        if own in sub:
            raise ConfigError(f"{other} and {key} in {source} are one key ({other} is another spelling of {key}): "
                              "give one of them")
        out[section] = {(own if k == leaf else k): v for k, v in sub.items()}
    return out


class RenamedKeyWarning(ConfigWarning):
    """An old key name was read; the message gives its new name."""


def new_name(old: str) -> str:
    option, methods = RENAMED[old]
    return f"algorithm.options.{option} (algorithm.name={' or '.join(methods)})"


def current_key(key: str) -> str:
    """The dotted key `key` names today (`algorithm.moon_mu` -> `algorithm.options.mu`, `system.async` ->
    `system.async_mode`)."""
    return f"algorithm.options.{RENAMED[key][0]}" if key in RENAMED else SPELLINGS.get(key, key)


def renamed_hint(message: str, renamed: dict) -> str:
    """A validation error about an option given by an old key name, with that name added."""
    for old in renamed:
        new = current_key(old)
        if message.startswith(new) or f" {new}" in message:
            return f"{message} (set as {old}, the old name of {new})"
    return message


def pop_renamed(d: dict) -> dict:
    """Remove the old keys from the nested config dict `d` (in place); return them, dotted -> value."""
    section = d.get("algorithm")
    if not isinstance(section, dict):
        return {}
    return {f"algorithm.{leaf}": section.pop(leaf) for leaf in list(section) if f"algorithm.{leaf}" in RENAMED}


def options_from_renamed(renamed: dict, method: type, options: dict, origin: dict, warn) -> dict:
    """`options` (algorithm.options as given) with the old keys in `renamed` that `method` reads, under
    their new names; the others are ignored, warned about by `warn(key, methods)` unless at their default.
    `origin`: key -> where it was set, for errors."""
    out = dict(options)
    defaults = {}
    if method.Options is not None:
        import dataclasses

        defaults = {f.name: f.default for f in dataclasses.fields(method.Options)}
    for old, value in renamed.items():
        option, methods = RENAMED[old]
        if method.name in methods and option in defaults:
            if option in options and options[option] != value:
                raise ConfigError(f"{old}={value!r} ({origin.get(old, 'config')}) is the old name of "
                                  f"algorithm.options.{option}, also set to {options[option]!r}: give one of them")
            if value != defaults[option] and value is not None:
                warnings.warn(f"{old} is now {new_name(old)}; the old name keeps working", RenamedKeyWarning,
                              stacklevel=caller_stacklevel())
            out.setdefault(option, value)
        elif value != _default_of(old):
            warn(old, methods)
    return out


def _default_of(old: str):
    """The default of an old key: the option's default in the first method that reads it."""
    import dataclasses

    from distfl.algorithms import ALGORITHMS

    option, methods = RENAMED[old]
    return next(f.default for f in dataclasses.fields(ALGORITHMS[methods[0]].Options) if f.name == option)


def upgraded(saved: dict) -> dict:
    """A saved run's nested config (config.yaml, a checkpoint's) with its old keys under their new names
    (those its method reads) and the rest dropped, without warnings: what it ran with, in today's keys."""
    import copy

    saved = copy.deepcopy(saved)
    renamed = pop_renamed(saved)
    if not renamed:
        return saved
    section = saved["algorithm"]
    method = trained_method(saved)
    if method is None:  # a plugin that no longer loads: it read none of the old keys
        return saved
    options = section.get("options") if isinstance(section.get("options"), dict) else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        section["options"] = options_from_renamed(renamed, method, options, {}, lambda key, methods: None)
    return saved


def trained_method(d: dict):
    """The class that trains the model of the nested config dict `d` (TCT: its stage 1), or None if its
    method does not load."""
    from distfl.algorithms import algorithm_class

    section = d.get("algorithm") if isinstance(d.get("algorithm"), dict) else {}
    try:
        return algorithm_class(section.get("name", "fedavg")).trained_method(_Saved(d))
    except Exception:
        return None


def reads(old: str, d: dict) -> bool:
    """Whether the method of the nested config dict `d` reads the old key `old`."""
    method = trained_method(d)
    return method is not None and method.name in RENAMED[old][1]


class _Saved:
    """Attribute access to a nested config dict (cfg.tct.stage1), for `trained_method`."""

    def __init__(self, d: dict):
        self._d = d

    def __getattr__(self, name):
        from distfl.config.schema import Config

        value = self._d.get(name, getattr(Config(), name))
        return _Saved(value) if isinstance(value, dict) else (_Saved(vars(value)) if hasattr(value, "__dataclass_fields__") else value)

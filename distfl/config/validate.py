"""Validation: every key's own rules (a loop over the declared keys: type, bounds, choices, range), the
method's declaration (its options, `check_config`, flags), and the combinations no run can serve. Every
problem is one `ConfigError` line, raised before any data loads.
"""
from __future__ import annotations

import math
import warnings

from distfl.config.options import declared_options
from distfl.config.schema import FEATURE_DIM_MODELS, KEYS, NUM_CLASSES, Config
from distfl.config.values import (INT_MAX, SYNTHETIC_MAX_ELEMENTS, caller_stacklevel, choice_error, convert, float32,
                                  float_error, in_range, range_error)
from distfl.errors import ConfigError

# A method's options: `algorithm.options.KEY`, checked against its Options dataclass in `validate`.
OPTIONS_KEY = "algorithm.options"
_TYPES = {name: key.type for name, key in KEYS.items()}


class ConfigWarning(UserWarning):
    """A key was set explicitly but the current choice of another key ignores it."""


def _values(cfg: Config) -> dict[str, object]:
    """Dotted key -> type-checked value."""
    out = {}
    for key, typ in _TYPES.items():
        section, _, leaf = key.rpartition(".")
        obj = getattr(cfg, section) if section else cfg
        out[key] = convert(key, getattr(obj, leaf), typ, text=False)
    return out


def _check_key(key, value) -> None:
    """The rules `key` (a schema Key) declares, on its type-checked value."""
    if key.type is float:
        error = float_error(key.name, value)
        if error:
            raise error
    elif key.type is int:
        largest = key.seed_max or key.limit or INT_MAX
        if value > largest and key.seed_max:
            raise ConfigError(f"{key.name} must be at most {largest} (numpy and torch refuse larger seeds), got {value}")
        if value > largest:
            why = "" if key.limit else " (an int key must fit in 32 bits)"
            raise ConfigError(f"{key.name} must be at most {largest}, got {value}{why}")
    if key.choices is not None and key.type is list:
        for name in value:
            if name not in key.choices:
                raise choice_error(key.name, name, key.choices)
            if value.count(name) > 1:
                raise ConfigError(f"{key.name} lists {name} twice; list each of {', '.join(key.choices)} at most once")
    elif key.choices is not None and value not in key.choices:
        if key.plugin:
            _plugin(key.name, value)
        else:
            raise choice_error(key.name, value, key.choices)
    if key.range is not None and not in_range(value, key.range):
        raise range_error(key.name, value, key.range)


def _check_synthetic(v: dict) -> None:
    if v["data.dataset"] == "synthetic":
        elements = ((v["data.synthetic_train"] + v["data.synthetic_test"]) * v["data.synthetic_channels"]
                    * v["data.synthetic_image_size"] ** 2)
        if elements > SYNTHETIC_MAX_ELEMENTS:
            raise ConfigError(
                f"the synthetic dataset would hold {elements:,} float32 values ((data.synthetic_train + "
                "data.synthetic_test) x data.synthetic_channels x data.synthetic_image_size^2), more than "
                f"{SYNTHETIC_MAX_ELEMENTS:,} (1 GiB); use fewer samples or smaller images")


def _plugin(key: str, name: str):
    """The class or function a plugin name (import path or entry point) refers to; ConfigError naming `key`."""
    from distfl import plugins

    try:
        return plugins.load_plugin(key, name)
    except KeyError:
        what = {"algorithm.name": "ClassName (a distfl.Algorithm subclass)",
                "aggregation.aggregator": "ClassName (an Aggregator subclass)"}.get(key, "build (a model builder)")
        raise choice_error(key, name, _built_in(key) + plugins.entry_point_names(key),
                            f", or an import path package.module:{what}") from None


def _built_in(key: str) -> list[str]:
    if key == "algorithm.name":
        from distfl.algorithms import ALGORITHMS

        return list(ALGORITHMS)
    return KEYS[key].choices


def _method(cfg: Config) -> type:
    """The class that trains the run's model (TCT: its stage 1), whose Options `algorithm.options` holds."""
    declared = _plugin_or_built_in(cfg.algorithm.name)
    try:
        return declared.trained_method(cfg)
    except KeyError:  # TCT's stage 1 is not a method
        raise choice_error("tct.stage1", cfg.tct.stage1) from None


def _algorithm_options(cls: type, name: str, options: dict) -> dict:
    """`algorithm.options` of method `cls`, complete (defaults filled in) and converted to the types its
    `Options` dataclass declares, with ranges (`metadata={"range": "[0, 1)"}`) and choices
    (`metadata={"choices": [...]}`) checked like the other keys'."""
    from distfl import plugins

    return declared_options(cls, plugins.options_fields(cls), OPTIONS_KEY, name, f"algorithm.name={name}", "method",
                            options)


def validate(cfg: Config) -> None:
    """Raise ConfigError for a wrong type, unknown choice, out-of-range value or impossible combination."""
    v = _values(cfg)
    for key in KEYS.values():
        _check_key(key, v[key.name])
    _check_synthetic(v)
    from distfl.trackers import check_trackers

    check_trackers(v)
    if not v["output.dir"].strip() or "\0" in v["output.dir"]:
        raise ConfigError(f"output.dir must name a directory (not empty, no NUL character), got {v['output.dir']!r}")
    if not 0 < float32(v["server.eps"] ** 2) < math.inf:
        raise ConfigError(f"server.eps={v['server.eps']!r}: its square, the optimizer's initial second moment, "
                          "is 0 or inf in float32; use a value between 1e-22 and 1e19")
    method = _method(cfg)
    declared = _plugin_or_built_in(v["algorithm.name"])
    cfg.algorithm.options = _algorithm_options(method, v["algorithm.name"], v[OPTIONS_KEY])
    from distfl.data.paths import check_data_files

    check_data_files(v)

    if v["train.clients_per_round"] > v["partition.num_clients"]:
        raise ConfigError(
            f"train.clients_per_round ({v['train.clients_per_round']}) > partition.num_clients "
            f"({v['partition.num_clients']}): a round cannot sample more clients than exist")

    if v["train.local_steps"] and v["train.local_epochs"] != 1:
        raise ConfigError(f"train.local_steps={v['train.local_steps']} fixes the local steps of a round, so "
                          f"train.local_epochs={v['train.local_epochs']} would be ignored: set one of them "
                          "(train.local_epochs=1 with local_steps, or train.local_steps=0)")

    check_feature_dim(v["model.name"], v["model.feature_dim"])
    from distfl.models.adapters import check_adapter_keys

    check_adapter_keys(v)

    if v["eval.client_split"] == "holdout" and not v["eval.clients"]:
        raise ConfigError("eval.client_split=holdout holds out part of every client's training data for per-client "
                          "evaluation, which is off: set eval.clients=true (or eval.client_split=test)")

    if v["calibration.method"] == "ccvr" and v["model.head"] != "linear":
        raise ConfigError(f"calibration.method=ccvr retrains a learnable linear head; model.head={v['model.head']} is "
                          "fixed: use model.head=linear (or calibration.method=ffc, which fits any head)")

    from distfl.algorithms.base import check_model_needs

    declared.check_config(cfg)
    check_model_needs(method, cfg)
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

    from distfl.algorithms.feature import check_features
    from distfl.privacy import rules as privacy_rules
    from distfl.system import rules as system_rules

    check_features(cfg, v, declared)  # each enabled feature's refusals (FedBN, GMA, compression, DP, yours)
    if v["privacy.mechanism"] in privacy_rules.DISTRIBUTED:
        privacy_rules.check_distributed(v, declared)
    system_rules.check(v)
    from distfl.secagg.aggregator import check_config as check_secagg

    check_secagg(v)


def _plugin_or_built_in(name: str) -> type:
    """The class that declares method `name`."""
    from distfl.algorithms import ALGORITHMS

    return ALGORITHMS[name] if name in ALGORITHMS else _plugin("algorithm.name", name)


def _check_personalised(v: dict, method: type) -> None:
    """The compositions of a personalised method (its own model part per client) that make no sense."""
    name = v["algorithm.name"]
    if not method.personalised:
        return
    if method.head_split and v["model.head"] != "linear":
        raise ConfigError(f"algorithm.name={name} splits the model into a shared body and a learnable classifier head; "
                          f"model.head={v['model.head']} is fixed: use model.head=linear")
    if method.head_split and v["calibration.method"] != "none":
        raise ConfigError(f"algorithm.name={name} keeps the head per client; calibration.method="
                          f"{v['calibration.method']} would replace it by one global head: set calibration.method=none")


def _check_finetune(v: dict, method: type) -> None:
    """eval.finetune_epochs fine-tunes the global model of a method that has one model for all clients."""
    epochs, name = v["eval.finetune_epochs"], v["algorithm.name"]
    if v["eval.finetune_from"] == "best":
        _check_finetune_from_best(v, method)
    if not epochs:
        return
    if not v["eval.clients"]:
        raise ConfigError(f"eval.finetune_epochs={epochs} fine-tunes each client's model before per-client "
                          "evaluation, which is off: set eval.clients=true (or eval.finetune_epochs=0)")
    if method.personalised:
        raise ConfigError(f"eval.finetune_epochs={epochs} fine-tunes the global model, but algorithm.name={name} "
                          f"is personalised: each client is scored with its own model; set eval.finetune_epochs=0")


def _check_finetune_from_best(v: dict, method: type) -> None:
    """eval.finetune_from=best: the clients start from a global model alone (no state of theirs mixed in)."""
    name, why = v["algorithm.name"], "eval.finetune_from=best starts each client's fine-tuning from the best round's global model"
    if not v["eval.clients"]:
        raise ConfigError(f"{why} before per-client evaluation, which is off: set eval.clients=true "
                          "(or eval.finetune_from=last)")
    if method.personalised and method.stateful:
        raise ConfigError(f"{why}, but algorithm.name={name} scores each client with a model built from its own state "
                          "(kept from the latest rounds, not the best one): set eval.finetune_from=last")
    if not method.personalised and not v["eval.finetune_epochs"]:
        raise ConfigError(f"{why}, but nothing fine-tunes it (eval.finetune_epochs=0): set eval.finetune_epochs > 0 "
                          "(or eval.finetune_from=last)")
    if v["calibration.method"] != "none":
        raise ConfigError(f"{why}, but calibration.method={v['calibration.method']} changes the final model after "
                          "training: set eval.finetune_from=last (or calibration.method=none)")


def check_feature_dim(model_name: str, feature_dim: int) -> None:
    """ConfigError unless model.feature_dim is 0 (the model's own width) or the model can change its width."""
    if feature_dim and model_name not in FEATURE_DIM_MODELS:
        raise ConfigError(f"model.feature_dim={feature_dim} is only supported by model.name in "
                          f"[{', '.join(FEATURE_DIM_MODELS)}]; model.name={model_name} has a fixed feature "
                          "width: set model.feature_dim=0")


def _warn_inapplicable(cfg: Config, explicit: frozenset[str]) -> None:
    v = _values(cfg)
    for key in KEYS.values():
        # A key left at its default is not warned about: a dumped config (run dir, resume) sets
        # every key explicitly, and would otherwise warn for each one its choices ignore.
        if key.applies and key.name in explicit and v[key.name] != key.default and not key_applies(key.name, v):
            controller, used_by = key.applies
            warnings.warn(f"{key.name} is set but only used by {controller} in [{', '.join(used_by)}]; "
                          f"it is ignored for {v[controller]}", ConfigWarning, stacklevel=caller_stacklevel())


def key_applies(key: str, values: dict) -> bool:
    """Whether a run with these flat config values reads `key` (its declared `applies`)."""
    if key not in KEYS or not KEYS[key].applies:
        return True
    controller, used_by = KEYS[key].applies
    return values.get(controller) in used_by

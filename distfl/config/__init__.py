"""Run configs: every key declared once (`schema`: type, default, choices, range, limits, applies-to,
resumable, as field metadata), read from YAML and `section.key=value` overrides (`load`), validated by
a loop over the declared keys and each method's own declaration (`validate`), read back on resume
(`resume`), documented (`docs`), and old key names mapped to new ones in one place (`renamed`). Every
problem is reported as a `ConfigError` before any work starts.

The loader is distfl's own (PyYAML with `yaml_loader.ConfigLoader`), not OmegaConf's structured configs:
OmegaConf would bring merging and interpolation that runs do not use, and take away what they do: its
YAML reading follows YAML 1.1 (`yes`/`on` booleans, `0x10` and `1:30` numbers) unless wrapped, does not
refuse aliases or duplicate keys, accepts `${...}` interpolations in any string, checks types but not
ranges, choices or combinations (the validation loop would stay), and reports errors over several
lines with its own key paths instead of one line with a "did you mean". It would also be a new
dependency for every install.
"""
from distfl.config.load import (SWEEP_BLOCK, apply_overrides, config_from_dict, config_keys, config_to_dict, data_seed,
                                dump_config, load_config, load_sweep_block)
from distfl.config.options import FEATURE_OPTIONS_KEY
from distfl.config.validate import OPTIONS_KEY, ConfigWarning, check_feature_dim, key_applies, validate
from distfl.config.schema import Config
from distfl.config.values import flatten_dict

__all__ = [
    "Config",
    "FEATURE_OPTIONS_KEY",
    "OPTIONS_KEY",
    "SWEEP_BLOCK",
    "ConfigWarning",
    "apply_overrides",
    "check_feature_dim",
    "config_from_dict",
    "config_keys",
    "config_to_dict",
    "data_seed",
    "dump_config",
    "flatten_dict",
    "key_applies",
    "load_config",
    "load_sweep_block",
    "validate",
]

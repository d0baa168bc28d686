"""Bounds on the numbers a config may hold, checked with the rest of `config.validate` before any work.

The ranges of `schema.RANGES` say what a key means (a probability in [0, 1), a positive step size);
the rules here say what a run can compute with (a method checks what it forms from its options,
`check_derived`, in its `check_config`):

- every float key is finite in float32, the dtype a run's tensors are scaled in (|x| <= 3.4e38), and a
  non-zero value does not round to 0 there (|x| >= 1.4e-45); the quantities the maths forms from
  them (1 / alpha in FedDyn's server step, ...) must be finite in float32 too;
- every int key is below 2^31 (the seeds have their own limits, `schema.SEED_MAX`), and a key that
  sizes a tensor, a loop or a thread pool has a tighter limit, `INT_LIMITS`;
- a synthetic dataset fits in `SYNTHETIC_MAX_ELEMENTS` float32 values.

A value read from a quoted YAML string ("0.05", "6") is read as the same text unquoted would be:
`number_from_text` (called by `config._convert`), so quoting never changes what a number means.
"""
from __future__ import annotations

import math
import struct

from distfl.errors import ConfigError

FLOAT32_MAX = struct.unpack("f", struct.pack("I", 0x7F7FFFFF))[0]  # 3.4028234663852886e38
FLOAT32_SMALLEST = struct.unpack("f", struct.pack("I", 1))[0]  # 1.4e-45, the smallest subnormal
INT_MAX = 2**31 - 1

# Tighter limits than INT_MAX for the int keys that size memory, a loop or a thread pool: far above any
# setting in the papers distfl reproduces, so a value above is a slip (2^31 overflowed torch's and numpy's
# C ints or asked for 512 GB at once). A value within may still need more memory than a machine has.
INT_LIMITS = {
    "data.synthetic_train": 10**8,
    "data.synthetic_test": 10**8,
    "data.synthetic_classes": 10**6,
    "data.synthetic_image_size": 4096,
    "data.synthetic_channels": 1024,
    "partition.num_clients": 10**7,
    "partition.classes_per_client": 10**6,
    "partition.shards_per_client": 10**6,
    "model.gn_groups": 64,
    "model.mlp_hidden": 8192,  # two hidden layers: ~h^2 parameters, 67 million at the limit
    "model.feature_dim": 8192,
    "train.local_epochs": 10**4,
    "train.local_steps": 10**7,
    "tct.local_steps": 10**7,
    "eval.client_test_size": 10**7,
    "runtime.threads": 1024,
    "tct.threads": 1024,
}

# The synthetic dataset's float32 values, (train + test) x channels x size^2: at most 1 GiB (its
# generation holds a few times that).
SYNTHETIC_MAX_ELEMENTS = 2**28

def in_float32(x: float) -> bool:
    """Whether `x` is finite in float32 and, unless 0, does not round to 0 there."""
    return math.isfinite(x) and abs(x) <= FLOAT32_MAX and (x == 0 or abs(x) >= FLOAT32_SMALLEST)


def float_error(key: str, value: float) -> ConfigError | None:
    if in_float32(value):
        return None
    if math.isfinite(value) and abs(value) < FLOAT32_SMALLEST:
        return ConfigError(f"{key}={value!r} rounds to 0 in float32, the dtype of the run's tensors; use a value of "
                           f"at least {FLOAT32_SMALLEST:.2g} in magnitude (or 0 where {key} allows it)")
    return ConfigError(f"{key}={value!r} is beyond float32, the dtype of the run's tensors (at most "
                       f"{FLOAT32_MAX:.4g} in magnitude)")


def int_limit(key: str) -> int:
    return INT_LIMITS.get(key, INT_MAX)


def check_derived(text: str, settings: dict, derive) -> None:
    """ConfigError unless `derive()`, a quantity a run forms in float32 from the keys in `settings`
    (key -> value; `text` names it), is finite there: methods call it from their `check_config`."""
    try:
        x = derive()
    except (OverflowError, ZeroDivisionError):
        x = math.inf
    if not in_float32(x) and x != 0:
        shown = ", ".join(f"{k}={v!r}" for k, v in settings.items())
        raise ConfigError(f"{shown}: {text} = {x:.3g} is beyond float32, the dtype of the run's tensors; keep it "
                          "within 1.4e-45 .. 3.4e38")


def check_numbers(types: dict[str, type], values: dict[str, object], own_limits: dict[str, int]) -> None:
    """ConfigError for the first float key beyond float32, int key above its limit (keys in
    `own_limits` are checked there) or synthetic dataset too large."""
    for key, typ in types.items():
        value = values[key]
        if typ is float:
            error = float_error(key, value)
            if error:
                raise error
        elif typ is int and key not in own_limits and value > int_limit(key):  # lower bounds: schema.RANGES
            why = "" if key in INT_LIMITS else " (an int key must fit in 32 bits)"
            raise ConfigError(f"{key} must be at most {int_limit(key)}, got {value}{why}")
    if values["data.dataset"] == "synthetic":
        elements = ((values["data.synthetic_train"] + values["data.synthetic_test"]) * values["data.synthetic_channels"]
                    * values["data.synthetic_image_size"] ** 2)
        if elements > SYNTHETIC_MAX_ELEMENTS:
            raise ConfigError(
                f"the synthetic dataset would hold {elements:,} float32 values ((data.synthetic_train + "
                "data.synthetic_test) x data.synthetic_channels x data.synthetic_image_size^2), more than "
                f"{SYNTHETIC_MAX_ELEMENTS:,} (1 GiB); use fewer samples or smaller images")


def number_from_text(text: str, resolve):
    """The int or float a YAML string spells by the config's own YAML rules (`resolve(text)` is the
    tag an unquoted `text` would get), else `text` unchanged."""
    tag = resolve(text)
    if tag.endswith(":int"):
        return int(text.replace("_", ""))
    if tag.endswith(":float"):
        number = text.replace("_", "").lower()
        return float(number.replace(".inf", "inf").replace(".nan", "nan"))
    if tag.endswith(":bool"):
        return text.lower() == "true"
    return text


def rules_markdown() -> str:
    """The paragraph of docs/config.md's introduction that states these rules."""
    return "\n".join([
        "Numbers are bounded by what a run can compute with: every float key must be finite in float32, the",
        f"dtype of the run's tensors (at most {FLOAT32_MAX:.4g} in magnitude; a non-zero value at least",
        f"{FLOAT32_SMALLEST:.2g}), and so must what the maths forms from them (1 / `algorithm.options.alpha` for",
        "FedDyn, 1 / `algorithm.options.kd_temperature` for FedADC+, `alpha` / `train.lr` for FedFOR); every int",
        f"key must be at most {INT_MAX} (2^31 - 1), or the tighter limit in its row (the seeds: what numpy and",
        "torch accept); a synthetic dataset holds at most 2^28 float32 values (1 GiB). A quoted number",
        "(`\"0.05\"`, `\"6\"`, `\"true\"`) means what it means unquoted: `train.rounds: \"6\"` is 6,",
        "`train.lr: \"1e-3\"` is 0.001, and `train.rounds: \"6.0\"` is refused like `6.0`. YAML anchors and",
        "aliases are refused, and so is a file nested deeper than 64 levels.",
    ])

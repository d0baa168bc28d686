"""Values of config keys: reading a number from text, converting to a key's type, the ranges and the
float32 / int bounds a run can compute with, and the errors that name the key.

A value read from a quoted YAML string ("0.05", "6") is read as the same text unquoted would be
(`number_from_text`), so quoting never changes what a number means. Every float key is finite in
float32, the dtype a run's tensors are scaled in (|x| <= 3.4e38), and a non-zero value does not round to
0 there (|x| >= 1.4e-45); a method checks what it forms from its options (`check_derived`, in its
`check_config`). Every int key is below 2^31 unless its declaration gives a tighter `limit` (or a seed's
`seed_max`).
"""
from __future__ import annotations

import difflib
import math
import struct
import sys
from pathlib import Path

import yaml

from distfl.errors import ConfigError
from distfl.yaml_loader import ConfigLoader


FLOAT32_MAX = struct.unpack("f", struct.pack("I", 0x7F7FFFFF))[0]  # 3.4028234663852886e38
FLOAT32_SMALLEST = struct.unpack("f", struct.pack("I", 1))[0]  # 1.4e-45, the smallest subnormal
INT_MAX = 2**31 - 1


# The synthetic dataset's float32 values, (train + test) x channels x size^2: at most 1 GiB (its
# generation holds a few times that).
SYNTHETIC_MAX_ELEMENTS = 2**28


def flatten_dict(d: dict, prefix: str = "") -> dict:
    """{"train": {"rounds": 5}} -> {"train.rounds": 5}."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten_dict(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def shown(value) -> str:
    """repr(value), cut short when long (a value pasted by mistake, nested thousands deep)."""
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:60]}... ({len(text)} characters)"


def convert(key: str, value, typ: type, text: bool = True):
    """Return `value` as `typ`, or raise ConfigError naming the key. `text`: a string may spell a number
    or bool (YAML, overrides); a Config's own fields, which the run uses as they are, must hold the type."""
    got = f"got {shown(value)} ({type(value).__name__})"
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
    if typ is list:  # a list of names: a YAML list, or "a,b" (an override)
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if value is None:
            return []
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return list(value)
        raise ConfigError(f"{key} must be a list of names, e.g. [tensorboard, mlflow], {got}")
    if typ is dict:
        if value is None:
            return {}
        if isinstance(value, dict):
            return value
        raise ConfigError(f"{key} must be a mapping of keys to values, {got}")
    raise TypeError(f"unsupported schema type {typ!r} for {key}")  # a schema bug, not a user error


def _unquoted_tag(text: str) -> str:
    """The YAML tag ConfigLoader gives `text` as an unquoted scalar (..:int, ..:float, ..:bool, ..:str)."""
    return ConfigLoader("").resolve(yaml.ScalarNode, text, (True, False))


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


def choice_error(key: str, value: str, valid: list[str], more: str = "") -> ConfigError:
    close = difflib.get_close_matches(str(value), valid, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ";"
    return ConfigError(f"{key}: unknown choice {value!r}{hint} valid: {', '.join(valid)}{more}")


def range_text(spec: str) -> str:
    return f"in {spec}" if spec.startswith(("[", "(")) else spec


def in_range(value, spec: str) -> bool:
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


def range_error(key: str, value, spec: str) -> ConfigError:
    return ConfigError(f"{key} must be {range_text(spec)}, got {value!r}")


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


def float32(x: float) -> float:
    """`x` rounded to float32 (0 below its smallest subnormal, inf above its largest value)."""
    try:
        return struct.unpack("f", struct.pack("f", x))[0]
    except OverflowError:
        return math.inf


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


def caller_stacklevel() -> int:
    """The warnings stacklevel of the first frame outside the distfl.config package, so a warning points there."""
    here = str(Path(__file__).parent)
    level, frame = 1, sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(here):
        level, frame = level + 1, frame.f_back
    return level


"""FedScale's device traces: read safely, mapped to clients as FedScale maps them, converted to JSON.

FedScale ships two pickled dicts (benchmark/dataset/data/device_info/README.md):
  client_device_capacity: client id -> {"computation": ms per sample, "communication": kbit/s}
  client_behave_trace:    client id -> {"duration": int, "inactive": [s], "finish_time": int,
                                         "active": [s], "model": str}
A pickle can name any importable callable, and loading it calls that callable, so these are read by an
unpickler that resolves no name at all except numpy's numeric scalars (and the latin-1 bytes protocol 2
stores them in): plain dicts, lists, tuples,
strings and numbers load; anything else is refused before it is built. Each format also reads from a
JSON file (what `python -m distfl.system.traces convert IN OUT.json` writes), keys as strings.

Mapping (fedscale/cloud/aggregation/aggregator.py, client_manager.py): FedScale numbers clients from 1;
our client k is its client k + 1. Capacity: the entry with key (k + 1) mod len(file), FedScale's default
{computation 1, communication 1} where no such key exists. Behaviour: the entry at position
(k + 1) mod len(file) of the file's keys in their stored order.
"""
from __future__ import annotations

import io
import json
import math
import pickle
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import ConfigError, DistflError

FEDSCALE_DEFAULT_CAPACITY = {"computation": 1.0, "communication": 1.0}


def _numpy_scalar(dtype, data=None):
    """numpy's pickled scalar, for numeric dtypes only (a bool, an integer or a float)."""
    if not isinstance(dtype, np.dtype) or dtype.kind not in "biuf" or not isinstance(data, bytes):
        raise pickle.UnpicklingError("a numpy scalar of a non-numeric type")
    return np.frombuffer(data, dtype=dtype, count=1)[0].item()


def _numpy_dtype(kind, align=False, copy=True):
    if not isinstance(kind, str) or np.dtype(kind).kind not in "biuf":
        raise pickle.UnpicklingError(f"a numpy dtype {kind!r} that is not a number")
    return np.dtype(kind)


def _latin1_bytes(text, encoding="latin1"):
    """How pickle protocol 2 stores bytes (a numpy scalar's): _codecs.encode(str, 'latin1')."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise pickle.UnpicklingError("an encoding call other than protocol 2's bytes")
    return text.encode("latin1")


_ALLOWED = {("numpy.core.multiarray", "scalar"): _numpy_scalar, ("numpy._core.multiarray", "scalar"): _numpy_scalar,
            ("numpy", "dtype"): _numpy_dtype, ("_codecs", "encode"): _latin1_bytes}


class PlainUnpickler(pickle.Unpickler):
    """Loads plain containers, strings and numbers; refuses every other object before it is built."""

    def find_class(self, module: str, name: str):
        if (module, name) in _ALLOWED:
            return _ALLOWED[(module, name)]
        raise pickle.UnpicklingError(f"it names {module}.{name}, and only plain data (dicts, lists, strings, "
                                     "numbers) is read from a pickle here")


def load_plain(path: str, what: str = "a FedScale trace"):
    """A file's content: JSON, or a pickle of plain data (a FedScale trace; LEAF's Reddit vocabulary,
    data/leaf_text.py). ConfigError naming the file and `what` it was read as otherwise."""
    raw = Path(path).read_bytes()
    if raw[:1] in (b"{", b"[") or raw[:1].isspace():
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise ConfigError(f"{path} is not valid JSON ({exc})") from None
    try:
        return PlainUnpickler(io.BytesIO(raw)).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as exc:
        raise ConfigError(f"{path} was refused as {what}: {exc}") from None


def _number(path, what, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{path}: {what} must be a finite number, got {value!r}")
    return float(value)


def _key(key):
    """A JSON key ("12") as FedScale's integer id; other keys as they are."""
    if isinstance(key, str) and key.lstrip("-").isdigit():
        return int(key)
    return key


def read_capacity(path: str) -> dict:
    """client_device_capacity: id -> (ms per sample, kbit/s), checked."""
    data = load_plain(path)
    if not isinstance(data, dict) or not data:
        raise ConfigError(f"{path}: a device-capacity file is a non-empty dict of client id -> "
                          "{computation, communication}")
    out = {}
    for key, entry in data.items():
        if not isinstance(entry, dict) or not {"computation", "communication"} <= set(entry):
            raise ConfigError(f"{path}: entry {key!r} must hold computation (ms per sample) and communication "
                              f"(kbit/s), got {entry!r}")
        compute, bandwidth = (_number(path, f"entry {key!r} {name}", entry[name])
                              for name in ("computation", "communication"))
        if compute < 0 or bandwidth <= 0:
            raise ConfigError(f"{path}: entry {key!r} needs computation >= 0 and communication > 0")
        out[_key(key)] = (compute, bandwidth)
    return out


def capacities_for(profiles: dict, num_clients: int) -> tuple[np.ndarray, np.ndarray]:
    """(ms per sample, kbit/s) arrays over clients 0..num_clients-1, by FedScale's mapping."""
    default = (FEDSCALE_DEFAULT_CAPACITY["computation"], FEDSCALE_DEFAULT_CAPACITY["communication"])
    rows = [profiles.get((k + 1) % len(profiles), default) for k in range(num_clients)]
    return np.array([r[0] for r in rows], dtype=np.float64), np.array([r[1] for r in rows], dtype=np.float64)


@dataclass(frozen=True)
class Behaviour:
    """One client's availability: online while active[i] <= (t mod finish_time) <= inactive[i]."""

    active: tuple
    inactive: tuple
    finish_time: float

    def online(self, t: float) -> bool:
        norm = t % self.finish_time
        return any(a <= norm <= b for a, b in zip(self.active, self.inactive))

    def next_online(self, t: float) -> float:
        """The earliest time >= t at which this client is online."""
        norm = t % self.finish_time
        if self.online(t):
            return t
        later = [a - norm for a in self.active if a > norm]
        return t + (min(later) if later else self.finish_time - norm + min(self.active))


def read_behaviour(path: str) -> list[Behaviour]:
    """client_behave_trace, in the file's key order."""
    data = load_plain(path)
    if not isinstance(data, dict) or not data:
        raise ConfigError(f"{path}: a behaviour trace is a non-empty dict of client id -> "
                          "{active, inactive, finish_time}")
    out = []
    for key, entry in data.items():
        if not isinstance(entry, dict) or not {"active", "inactive", "finish_time"} <= set(entry):
            raise ConfigError(f"{path}: entry {key!r} must hold active, inactive (lists of seconds) and finish_time")
        active, inactive = entry["active"], entry["inactive"]
        if not isinstance(active, (list, tuple)) or not isinstance(inactive, (list, tuple)) or \
                len(active) != len(inactive) or not active:
            raise ConfigError(f"{path}: entry {key!r}: active and inactive must be lists of the same non-zero length")
        finish = _number(path, f"entry {key!r} finish_time", entry["finish_time"])
        if finish <= 0:
            raise ConfigError(f"{path}: entry {key!r}: finish_time must be > 0")
        out.append(Behaviour(tuple(_number(path, f"entry {key!r} active", a) for a in active),
                             tuple(_number(path, f"entry {key!r} inactive", b) for b in inactive), finish))
    return out


def behaviour_for(entries: list[Behaviour], num_clients: int) -> list[Behaviour]:
    """Each client's behaviour by FedScale's mapping (position (k + 1) mod the file's length)."""
    return [entries[(k + 1) % len(entries)] for k in range(num_clients)]


def convert(source: str, target: str) -> int:
    """Write a trace pickle (read with the restricted unpickler) as JSON; returns the entries written."""
    data = load_plain(source)
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: a FedScale trace is a dict of client id -> entry")
    Path(target).write_text(json.dumps({str(k): v for k, v in data.items()}) + "\n")
    return len(data)


def convert_command(argv: list[str], usage: str, convert_file, noun: str) -> int:
    """`python -m MODULE convert IN OUT.json` of a plain-data pickle (this module's traces, LEAF's Reddit
    vocabulary): exit status 0, or 2 with one line."""
    if len(argv) != 3 or argv[0] != "convert":
        print(f"usage: {usage}", file=sys.stderr)
        return 2
    try:
        count = convert_file(argv[1], argv[2])
    except (DistflError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {count} {noun} to {argv[2]}")
    return 0


def main(argv: list[str]) -> int:
    return convert_command(argv, "python -m distfl.system.traces convert FEDSCALE_PICKLE OUT.json", convert, "entries")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""FedScale's device traces: read safely, mapped to clients as FedScale maps them, converted to JSON.

FedScale ships two pickled dicts (benchmark/dataset/data/device_info/README.md):
  client_device_capacity: client id -> {"computation": ms per sample, "communication": kbit/s}
  client_behave_trace:    client id -> {"duration": int, "inactive": [s], "finish_time": int,
                                         "active": [s], "model": str}
They are read by distfl/plain_pickle.py's unpickler, which builds plain dicts, lists, strings and
numbers and refuses any other object before it is built. Each format also reads from a JSON file (what `python -m distfl.system.traces convert IN OUT.json` writes), keys as strings.

Mapping (fedscale/cloud/aggregation/aggregator.py, client_manager.py): FedScale numbers clients from 1;
our client k is its client k + 1. Capacity: the entry with key (k + 1) mod len(file), FedScale's default
{computation 1, communication 1} where no such key exists. Behaviour: the entry at position
(k + 1) mod len(file) of the file's keys in their stored order.
"""
from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import ConfigError
from ..plain_pickle import brief, convert_command, load_plain

FEDSCALE_DEFAULT_CAPACITY = {"computation": 1.0, "communication": 1.0}


def _number(path, what, value) -> float:
    """`value` as a float; ConfigError naming the file and entry unless it is a finite number (an integer
    past float's range, 10**400, is not)."""
    try:
        number = None if isinstance(value, bool) or not isinstance(value, (int, float)) else float(value)
    except OverflowError:
        number = None
    if number is None or not math.isfinite(number):
        raise ConfigError(f"{path}: {what} must be a finite number, got {brief(value)}")
    return number


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
            raise ConfigError(f"{path}: entry {brief(key)} must hold computation (ms per sample) and communication "
                              f"(kbit/s), got {brief(entry)}")
        compute, bandwidth = (_number(path, f"entry {brief(key)} {name}", entry[name])
                              for name in ("computation", "communication"))
        if compute < 0 or bandwidth <= 0:
            raise ConfigError(f"{path}: entry {brief(key)} needs computation >= 0 and communication > 0")
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

    @property
    def intervals(self) -> tuple:
        """The online intervals (start, end) within one period [0, finish_time) that are not empty."""
        return tuple((max(a, 0.0), b) for a, b in zip(self.active, self.inactive)
                     if max(a, 0.0) <= b and max(a, 0.0) < self.finish_time)

    def online(self, t: float) -> bool:
        norm = t % self.finish_time
        return any(a <= norm <= b for a, b in zip(self.active, self.inactive))

    def next_online(self, t: float) -> float:
        """The earliest time >= t at which this client is online (inf if never)."""
        starts = [a for a, _ in self.intervals]
        if not starts:
            return math.inf
        norm = t % self.finish_time
        if self.online(t):
            return t
        later = [a - norm for a in starts if a > norm]
        return t + (min(later) if later else self.finish_time - norm + min(starts))


def read_behaviour(path: str) -> list[Behaviour]:
    """client_behave_trace, in the file's key order."""
    data = load_plain(path)
    if not isinstance(data, dict) or not data:
        raise ConfigError(f"{path}: a behaviour trace is a non-empty dict of client id -> "
                          "{active, inactive, finish_time}")
    out = []
    for key, entry in data.items():
        if not isinstance(entry, dict) or not {"active", "inactive", "finish_time"} <= set(entry):
            raise ConfigError(f"{path}: entry {brief(key)} must hold active, inactive (lists of seconds) and finish_time")
        active, inactive = entry["active"], entry["inactive"]
        if not isinstance(active, (list, tuple)) or not isinstance(inactive, (list, tuple)) or \
                len(active) != len(inactive) or not active:
            raise ConfigError(f"{path}: entry {brief(key)}: active and inactive must be lists of the same non-zero length")
        finish = _number(path, f"entry {brief(key)} finish_time", entry["finish_time"])
        if finish <= 0:
            raise ConfigError(f"{path}: entry {brief(key)}: finish_time must be > 0")
        out.append(Behaviour(tuple(_number(path, f"entry {brief(key)} active", a) for a in active),
                             tuple(_number(path, f"entry {brief(key)} inactive", b) for b in inactive), finish))
    if not any(b.intervals for b in out):
        raise ConfigError(f"{path}: no entry has an online interval (active[i] <= inactive[i], active[i] < "
                          "finish_time), so no client would ever be online")
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


def main(argv: list[str]) -> int:
    return convert_command(argv, "python -m distfl.system.traces convert FEDSCALE_PICKLE OUT.json", convert, "entries")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The system.* keys' combinations: every refusal is one line naming the key, before any data loads
(config.validate calls `check`)."""
from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError
from .model import parse_spec

def check(v: dict) -> None:
    """`v`: dotted key -> value (validated types and ranges)."""
    keys = [k for k in v if k.startswith("system.")]
    from ..config.schema import SystemConfig

    defaults = SystemConfig()
    if all(v[k] == getattr(defaults, k.removeprefix("system.")) for k in keys):
        if v["train.virtual_time_s"] > 0:
            raise ConfigError(f"train.virtual_time_s={v['train.virtual_time_s']:g} is a budget of simulated time, which "
                              "only a system model keeps: set some system.* key (docs/system.md), or "
                              "train.virtual_time_s=0")
        return
    if not v["system.capacity_file"]:
        for key, inf in (("system.speed", False), ("system.bandwidth", True)):
            _spec(key, v[key], inf)
        if v["system.upload_bandwidth"] != "same":
            _spec("system.upload_bandwidth", v["system.upload_bandwidth"], True)
    from . import traces

    if v["system.availability"] == "trace" and not v["system.trace_file"]:
        raise ConfigError("system.availability=trace reads FedScale's client_behave_trace: set system.trace_file")
    for key, read, used in (("system.capacity_file", traces.read_capacity, True),
                            ("system.trace_file", traces.read_behaviour, v["system.availability"] == "trace")):
        if v[key] and used:
            if not Path(v[key]).is_file():
                raise ConfigError(f"{key}: no file at {v[key]}")
            read(v[key])
    if v["privacy.mechanism"] not in ("none", "ddgauss", "skellam"):  # distributed DP counts the survivors
        raise ConfigError("privacy.mechanism=gaussian with the system model: availability, dropouts, deadlines and "
                          "asynchrony change which clients contribute in ways the privacy accountant does not bound; "
                          "leave the system.* keys at their defaults")
    available_only = v["system.availability"] != "always" and v["system.unavailable"] == "skip"
    if available_only and v["train.cohort"] != "random":
        raise ConfigError(f"system.availability={v['system.availability']} with system.unavailable=skip samples among "
                          f"the clients online at a round's start, at random; train.cohort={v['train.cohort']} "
                          "cannot: set train.cohort=random (or system.unavailable=fail)")
    if v["system.round"] == "deadline" and v["system.deadline_s"] <= 0:
        raise ConfigError("system.round=deadline needs system.deadline_s > 0 (the round's length in virtual seconds)")
    if v["system.round"] == "stragglers" and (v["train.local_steps"] > 0 or v["train.local_epochs"] < 2):
        raise ConfigError("system.round=stragglers draws each straggler's local epochs from 1 to train.local_epochs - 1: "
                          f"set train.local_epochs >= 2 (now {v['train.local_epochs']}) and train.local_steps=0 "
                          f"(now {v['train.local_steps']})")
    if v["system.round"] == "overselect" and v["train.cohort"] == "poisson":
        raise ConfigError("system.round=overselect samples ceil(system.overselect x train.clients_per_round) clients; "
                          "train.cohort=poisson has no fixed size to scale: use train.cohort=random or sequential")
    if v["system.async_mode"] != "none":
        _check_async(v)


def _check_async(v: dict) -> None:
    mode = f"system.async_mode={v['system.async_mode']}"
    from ..algorithms import ALGORITHMS, algorithm_class

    name = v["algorithm.name"]
    if not algorithm_class(name).asynchronous:  # the method declares it (algorithms/base.py)
        allowed = [n for n, cls in ALGORITHMS.items() if cls.asynchronous]
        raise ConfigError(f"{mode} composes with algorithm.name in {', '.join(allowed)} (and every "
                          f"server.optimizer); {name} keeps per-client or per-round state (control variates, "
                          "step counts, personal models) that asynchronous, stale updates do not define")
    if v["system.round"] != "wait_all":
        raise ConfigError(f"{mode} has no rounds to cut: system.round={v['system.round']} applies to synchronous "
                          "runs only (leave system.round=wait_all)")
    if v["train.cohort"] != "random":
        raise ConfigError(f"{mode} samples each new client at random as a slot frees up; train.cohort="
                          f"{v['train.cohort']} does not apply: set train.cohort=random")
    if v["calibration.method"] != "none":
        raise ConfigError(f"{mode}: calibration.method={v['calibration.method']} uses the last round's cohort, "
                          "which an asynchronous run does not have; set calibration.method=none")
    concurrency = v["system.concurrency"] or v["train.clients_per_round"]
    if concurrency > v["partition.num_clients"]:
        raise ConfigError(f"system.concurrency ({concurrency}) > partition.num_clients ({v['partition.num_clients']}): "
                          "more clients cannot train at once than exist")
    if v["system.async_mode"] == "fedbuff" and v["system.buffer_size"] > concurrency:
        given = "" if v["system.concurrency"] else ", train.clients_per_round"
        raise ConfigError(f"system.buffer_size ({v['system.buffer_size']}) > system.concurrency ({concurrency}{given}): "
                          "a buffered update holds its slot until the step, so the buffer would never fill; set "
                          f"system.buffer_size <= {concurrency} or system.concurrency >= {v['system.buffer_size']}")


def _spec(key: str, text: str, allow_inf: bool) -> None:
    try:
        parse_spec(key, text, allow_inf)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None

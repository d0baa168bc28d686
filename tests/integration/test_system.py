"""The system model and the virtual clock (docs/system.md): defaults change nothing, a schedule recomputed
by hand, FedScale's trace files as FedScale writes them, and exactness across ranks and kills."""
from __future__ import annotations

import json
import math
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import (REPO, build_trainer, env_with_sitecustomize, metrics, one_two_resumed, summary, train_ok,
                      write_config)
from distfl.config import config_from_dict
from distfl.errors import ConfigError
from distfl.federation.population import Population
from distfl.system import traces
from distfl.system.clock import SyncClock
from distfl.system.model import SystemModel

# model_sha256 of tests/conftest.py's SMALL run per method, from the code before the system section existed.
BEFORE = {"fedavg": "11241072f40b505d50130592a1396870ef556aa038514eb6bac65260ad20a1d2",
          "fedprox": "3fcdded4f61b26abe117557d866e62986485fc2f6ac618c5218e15a804fe8d70",
          "scaffold": "bd714b0f59e5a2fdcf9ec6e05656fa21f66a7fabe89d2ab0b81093491a87c792"}

# Deadline rounds where some clients are late and some drop out (SMALL's clients train 5-40 ms a sample).
DEADLINE = ("system.speed=lognormal:0,1", "system.round=deadline", "system.deadline_s=0.5", "system.dropout=0.2")


@pytest.mark.parametrize("method", sorted(BEFORE))
def test_defaults_keep_the_models_of_before(tmp_path, method):
    cfg = write_config(tmp_path / "c.yaml", algorithm={"name": method})
    done = train_ok(cfg, f"output.dir={tmp_path / 'run'}")
    assert done["model_sha256"] == BEFORE[method]
    assert "virtual_time_s" not in done and "virtual_time_s" not in metrics(tmp_path / "run")[0]


def test_a_deadline_longer_than_every_client_equals_wait_all(tmp_path):
    cfg = write_config(tmp_path / "c.yaml")
    common = ("system.speed=lognormal:0,1", "system.bandwidth=uniform:50,500")
    wait_all = train_ok(cfg, f"output.dir={tmp_path / 'all'}", *common)
    long = train_ok(cfg, f"output.dir={tmp_path / 'long'}", *common, "system.round=deadline", "system.deadline_s=1e9")
    short = train_ok(cfg, f"output.dir={tmp_path / 'short'}", *common, "system.round=deadline", "system.deadline_s=0.3")
    assert long["model_sha256"] == wait_all["model_sha256"] != short["model_sha256"]
    assert long["virtual_time_s"] == wait_all["virtual_time_s"] > short["virtual_time_s"]
    assert [r["virtual_time_s"] for r in metrics(tmp_path / "long")] == \
        [r["virtual_time_s"] for r in metrics(tmp_path / "all")]
    assert sum(r["late"] for r in metrics(tmp_path / "short")) > 0


# ---- the schedule, recomputed by hand --------------------------------------------------------------------
M64, GOLDEN = (1 << 64) - 1, 0x9E3779B97F4A7C15


def _mix(x: int) -> int:
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def _uniform(seed: int, key: int, *index: int) -> float:
    """docs/system.md's keyed draw: splitmix64 over (seed, key, *index), in plain Python integers."""
    h = _mix((((seed * GOLDEN + key) & M64) + GOLDEN) & M64)
    for part in index:
        h = _mix(h ^ ((part + GOLDEN) & M64))
    return ((h >> 11) + 0.5) * 2.0**-53


def _cfg(**system):
    return config_from_dict({"seed": 5, "partition": {"num_clients": 6}, "train": {"clients_per_round": 4,
                             "batch_size": 4}, "system": system})


SIZES = [5, 10, 20, 40, 3, 8]
MODEL_BYTES = 4000


def _batches(n: int) -> list[int]:
    return [4] * (n // 4) + ([n % 4] if n % 4 else [])


def _payload(method: str) -> tuple[int, int]:
    """(download, upload) bytes a client of tests/conftest.py's SMALL run moves in a round, from its model
    (mlp on 1x8x8 images, 10 classes): FedAvg the float32 parameters and buffers each way; SCAFFOLD also
    the server's control variate down and the client's control delta up."""
    from distfl.models.mlp import build_mlp

    model = build_mlp((1, 8, 8), 10, 64)
    params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    buffers = sum(b.numel() for b in model.buffers())
    return {"fedavg": (4 * (params + buffers), 4 * (params + buffers)),
            "scaffold": (4 * (2 * params + buffers), 4 * (2 * params + buffers))}[method]


@pytest.mark.parametrize("method", ["fedavg", "scaffold"])
def test_a_clients_bytes_are_its_payloads(tmp_path, method):
    """bytes_up / bytes_down: FedAvg moves 4 x (parameters + buffers) bytes each way, SCAFFOLD twice the
    parameters' (its control variates); each round's row counts every client that reported, the summary
    the rounds' sum; and the virtual clock's transfers take those bytes over the bandwidth."""
    cfg = write_config(tmp_path / "c.yaml", algorithm={"name": method})
    down, up = _payload(method)
    fedavg_down, fedavg_up = _payload("fedavg")
    if method == "scaffold":  # the mlp has no buffers: twice FedAvg's upload
        assert (down, up) == (2 * fedavg_down, 2 * fedavg_up)
    clock = ("system.speed=constant:1e-9", "system.bandwidth=constant:100")  # compute takes no time to speak of
    done = train_ok(cfg, f"output.dir={tmp_path / 'run'}", *clock)
    rows = metrics(tmp_path / "run")
    assert [(r["bytes_down"], r["bytes_up"]) for r in rows] == [(5 * down, 5 * up)] * 6  # 5 clients a round
    assert (done["bytes_down"], done["bytes_up"]) == (6 * 5 * down, 6 * 5 * up)
    for row in rows:  # wait_all: every client's duration is download + compute + upload
        assert math.isclose(row["round_virtual_s"], (down + up) * 8 / 1024 / 100, rel_tol=1e-6)


@pytest.mark.parametrize("payload", ["model_bytes", "fedavg", "scaffold"])
@pytest.mark.parametrize("partial", [False, True])
def test_the_deadline_schedule_equals_one_computed_by_hand(partial, payload):
    down, up = (MODEL_BYTES, MODEL_BYTES) if payload == "model_bytes" else _payload(payload)
    bandwidth = 1000 if payload == "model_bytes" else 20000
    cfg = _cfg(speed="list:1,2,5", bandwidth=f"constant:{bandwidth}", round="deadline", deadline_s=0.2, dropout=0.3,
               partial_work=partial)
    population = Population([np.arange(n) for n in SIZES])
    clock = SyncClock(SystemModel(cfg, 6, down, up), population, cfg)
    now, counted = 0.0, {"late": 0, "dropped": 0, "partial": 0}
    for t in range(1, 9):
        plan = clock.plan(t, lambda c: _batches(SIZES[c]))
        sampled = population.cohort(5, t, 4)
        assert plan.sampled == sampled
        comm = (down * 8 / 1024) / bandwidth + (up * 8 / 1024) / bandwidth  # download, then upload
        kept, late, dropped, partial_steps, reported = [], [], [], {}, []
        for c in sampled:
            ms = [1.0, 2.0, 5.0][min(int(_uniform(5, 1, c) * 3), 2)]
            duration = comm + 3 * SIZES[c] * ms / 1000
            if _uniform(5, 4, t, c) < 0.3:
                dropped.append(c)
                continue
            reported.append(duration)
            if duration <= 0.2:
                kept.append(c)
                continue
            done, elapsed = 0, 0.0
            for b in _batches(SIZES[c]):
                elapsed += 3 * b * ms / 1000
                if elapsed > 0.2 - comm:
                    break
                done += 1
            if partial and done:
                kept.append(c)
                partial_steps[c] = done
            else:
                late.append(c)
        length = min(0.2, max(reported, default=0.0))
        assert (plan.kept, plan.late, plan.dropped, plan.partial_steps) == (sorted(kept), late, dropped, partial_steps)
        assert plan.length_s == length and plan.start_s == now
        now += length
        counted["late"] += len(late)
        counted["dropped"] += len(dropped)
        counted["partial"] += len(partial_steps)
    assert counted["dropped"] > 0 and counted["late" if not partial else "partial"] > 0  # the case tests something


@pytest.mark.parametrize("partial", [False, True])
def test_fedprox_stragglers_equal_the_authors_draw_recomputed_by_hand(partial):
    """system.round=stragglers as Li et al.'s trainers draw stragglers: k - round(k (1 - share)) of the k
    sampled (the authors' `round`), the smallest keyed draws (seed, 8, round, client); each does an epoch
    count uniform in 1 .. E - 1 (their np.random.randint(1, E)), keyed (seed, 9, round, client)."""
    epochs = 4
    cfg = config_from_dict({"seed": 5, "partition": {"num_clients": 6}, "train": {
        "clients_per_round": 4, "batch_size": 4, "local_epochs": epochs}, "system": {
        "round": "stragglers", "stragglers": 0.6, "partial_work": partial, "dropout": 0.2}})
    population = Population([np.arange(n) for n in SIZES])
    clock = SyncClock(SystemModel(cfg, 6, MODEL_BYTES, MODEL_BYTES), population, cfg)
    seen_epochs, now = set(), 0.0
    for t in range(1, 13):
        plan = clock.plan(t, lambda c: _batches(SIZES[c]) * epochs)
        sampled = population.cohort(5, t, 4)
        slow = sorted(sampled, key=lambda c: (_uniform(5, 8, t, c), c))[:4 - round(4 * (1 - 0.6))]
        assert len(slow) == 2
        kept, late, dropped, partial_steps, durations = [], [], [], {}, []
        for c in sampled:
            steps = len(_batches(SIZES[c])) * epochs
            samples = SIZES[c] * epochs
            if c in slow:
                done = 1 + min(int(_uniform(5, 9, t, c) * (epochs - 1)), epochs - 2)
                seen_epochs.add(done)
                steps, samples = len(_batches(SIZES[c])) * done, SIZES[c] * done
            if _uniform(5, 4, t, c) < 0.2:
                dropped.append(c)
            elif c in slow and not partial:
                late.append(c)
            else:
                kept.append(c)
                durations.append(3 * samples / 1000)  # 1 ms a sample, no transfer time
                if c in slow:
                    partial_steps[c] = steps
        assert (plan.kept, plan.late, plan.dropped, plan.partial_steps) == (sorted(kept), late, dropped, partial_steps)
        assert plan.start_s == now and math.isclose(plan.length_s, max(durations, default=0.0), rel_tol=1e-12)
        now = plan.start_s + plan.length_s
    assert seen_epochs == {1, 2, 3}  # every count from 1 to E - 1 occurs


def test_no_stragglers_equal_the_plain_run_and_stragglers_change_it(tmp_path):
    cfg = write_config(tmp_path / "c.yaml", train={"local_epochs": 3})
    plain = train_ok(cfg, f"output.dir={tmp_path / 'plain'}")
    rounds = ("system.round=stragglers", "system.partial_work=true")
    none = train_ok(cfg, f"output.dir={tmp_path / 'none'}", *rounds, "system.stragglers=0")
    half = train_ok(cfg, f"output.dir={tmp_path / 'half'}", *rounds, "system.stragglers=0.5")
    dropped = train_ok(cfg, f"output.dir={tmp_path / 'drop'}", "system.round=stragglers", "system.stragglers=0.5")
    assert none["model_sha256"] == plain["model_sha256"]
    assert len({plain["model_sha256"], half["model_sha256"], dropped["model_sha256"]}) == 3
    rows = metrics(tmp_path / "half")
    # 5 - round(5 x 0.5) = 3 stragglers: Python's round, as the authors' code, takes 2.5 to 2
    assert [r["partial"] for r in rows] == [3] * 6 and [r["finished"] for r in rows] == [2] * 6
    assert [r["late"] for r in metrics(tmp_path / "drop")] == [3] * 6


def test_fedprox_stragglers_are_the_same_on_one_two_and_resumed(tmp_path):
    cfg = write_config(tmp_path / "c.yaml", train={"local_epochs": 3})
    one_two_resumed(cfg, tmp_path, "system.round=stragglers", "system.stragglers=0.5", "system.partial_work=true",
                    "algorithm.name=fedprox")


def test_overselection_keeps_the_first_to_finish():
    cfg = _cfg(speed="uniform:1,10", round="overselect", overselect=1.5)
    population = Population([np.arange(n) for n in SIZES])
    plan = SyncClock(SystemModel(cfg, 6, MODEL_BYTES, MODEL_BYTES), population, cfg).plan(1, lambda c: _batches(SIZES[c]))
    assert len(plan.sampled) == 6 and plan.sampled == population.cohort(5, 1, 6)
    duration = {c: 3 * SIZES[c] * (1 + 9 * _uniform(5, 1, c)) / 1000 for c in plan.sampled}
    first = sorted(plan.sampled, key=lambda c: (duration[c], c))
    assert plan.kept == sorted(first[:4]) and plan.late == sorted(first[4:])
    assert math.isclose(plan.length_s, duration[first[3]], rel_tol=1e-12)


def test_diurnal_availability_samples_only_online_clients():
    cfg = _cfg(availability="diurnal", diurnal_period_s=100.0, diurnal_online=0.3)
    population = Population([np.arange(n) for n in SIZES])
    clock = SyncClock(SystemModel(cfg, 6, MODEL_BYTES, MODEL_BYTES), population, cfg)
    clock.now_s = 42.0
    plan = clock.plan(3, lambda c: _batches(SIZES[c]))
    online = [c for c in range(6) if (42.0 - 100 * _uniform(5, 5, c)) % 100 < 30]
    assert set(plan.sampled) <= set(online) and len(plan.sampled) == min(4, len(online))


# ---- FedScale's files ------------------------------------------------------------------------------------
def _fedscale_capacity(path: Path, protocol: int, numpy_numbers: bool = False) -> dict:
    """client_device_capacity as FedScale's README describes it: a pickled dict, 1-based client id ->
    {'computation': ms per sample, 'communication': kbit/s}."""
    number = np.float64 if numpy_numbers else float
    data = {i: {"computation": number(10.0 * i), "communication": number(1000.0 + i)} for i in range(1, 5)}
    path.write_bytes(pickle.dumps(data, protocol=protocol))
    return data


@pytest.mark.parametrize("protocol", [2, 4, pickle.HIGHEST_PROTOCOL])
@pytest.mark.parametrize("numpy_numbers", [False, True])
def test_capacity_file_in_fedscales_layout(tmp_path, protocol, numpy_numbers):
    path = tmp_path / "client_device_capacity"
    data = _fedscale_capacity(path, protocol, numpy_numbers)
    profiles = traces.read_capacity(str(path))
    ms, kbps = traces.capacities_for(profiles, 9)
    # FedScale's aggregator: client id i (1-based; ours k = i - 1) takes profiles.get(i % len), default 1, 1.
    for k in range(9):
        entry = data.get((k + 1) % 4, {"computation": 1.0, "communication": 1.0})
        assert (ms[k], kbps[k]) == (float(entry["computation"]), float(entry["communication"]))
    out = tmp_path / "capacity.json"
    assert traces.main(["convert", str(path), str(out)]) == 0
    assert traces.read_capacity(str(out)) == profiles


def test_behaviour_trace_in_fedscales_layout(tmp_path):
    """client_behave_trace: 1-based id -> {duration, inactive, finish_time, active, model}; FedScale maps
    client i to the entry at position i % len of the keys, online while active[j] <= t % finish <= inactive[j]."""
    data = {7: {"duration": 100, "inactive": [20, 60], "finish_time": 100, "active": [10, 50], "model": "Pixel 2"},
            3: {"duration": 80, "inactive": [40], "finish_time": 80, "active": [0], "model": "iPhone"}}
    path = tmp_path / "client_behave_trace"
    path.write_bytes(pickle.dumps(data))
    entries = traces.behaviour_for(traces.read_behaviour(str(path)), 3)
    assert [e.finish_time for e in entries] == [80, 100, 80]  # clients 0, 1, 2 = FedScale's 1, 2, 3
    pixel = entries[1]
    assert [pixel.online(t) for t in (5, 10, 15, 20, 30, 55, 110, 215, 160)] == \
        [False, True, True, True, False, True, True, True, True]
    out = tmp_path / "trace.json"
    assert traces.main(["convert", str(path), str(out)]) == 0
    assert traces.read_behaviour(str(out)) == traces.read_behaviour(str(path))


class _Payload:
    def __reduce__(self):
        return (os.system, (f"touch {_Payload.marker}",))


def test_a_pickle_holding_an_object_is_refused_unbuilt(tmp_path):
    _Payload.marker = tmp_path / "ran"
    path = tmp_path / "evil"
    path.write_bytes(pickle.dumps({1: {"computation": _Payload(), "communication": 1.0}}))
    with pytest.raises(ConfigError, match="only plain data"):
        traces.read_capacity(str(path))
    assert not _Payload.marker.exists()
    with pytest.raises(ConfigError, match="system.capacity_file"):
        config_from_dict({"system": {"capacity_file": str(tmp_path / "missing")}})
    with pytest.raises(ConfigError, match="only plain data"):
        config_from_dict({"system": {"capacity_file": str(path)}})
    assert not _Payload.marker.exists()


def test_a_run_on_fedscale_traces(tmp_path):
    _fedscale_capacity(tmp_path / "cap", 4)
    (tmp_path / "trace").write_bytes(pickle.dumps(
        {i: {"duration": 9, "inactive": [3.0 + i], "finish_time": 9, "active": [i * 0.5], "model": "x"}
         for i in range(1, 6)}))
    cfg = write_config(tmp_path / "c.yaml")
    done = train_ok(cfg, f"output.dir={tmp_path / 'run'}", f"system.capacity_file={tmp_path / 'cap'}",
                    "system.availability=trace", f"system.trace_file={tmp_path / 'trace'}")
    rows = metrics(tmp_path / "run")
    assert done["virtual_time_s"] == rows[-1]["virtual_time_s"] > 0
    assert all(r["sampled"] == r["finished"] + r["dropped"] for r in rows)


@pytest.mark.parametrize("override, message", [
    ("system.speed=normal:1", "system.speed must be constant:V"),
    ("system.round=deadline", "system.deadline_s > 0"),
    ("system.availability=trace", "set system.trace_file"),
    ("system.bandwidth=uniform:5,1", "LO <= HI"),
    ("system.round=stragglers", "set train.local_epochs >= 2"),
])
def test_bad_system_keys_are_one_line(override, message):
    from distfl.config import load_config

    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


# ---- exactness ---------------------------------------------------------------------------------------------
def test_deadline_with_dropouts_is_the_same_on_one_two_and_resumed(tmp_path):
    cfg = write_config(tmp_path / "c.yaml")
    one, _, _ = one_two_resumed(cfg, tmp_path, *DEADLINE, "system.partial_work=true", "algorithm.name=fedprox")
    rows = metrics(tmp_path / "one")
    assert sum(r["dropped"] for r in rows) > 0 and sum(r["partial"] for r in rows) > 0
    assert [r["virtual_time_s"] for r in rows] == [r["virtual_time_s"] for r in metrics(tmp_path / "two")]


SLOW = """
import os, time
if "SLOW_SYSTEM_ROUNDS" in os.environ:
    from distfl.system import handle
    from distfl.federation import runner

    def slowed(step):
        def slow(self, round_idx):
            time.sleep(0.3)
            return step(self, round_idx)
        return slow

    runner.Trainer.run_round = slowed(runner.Trainer.run_round)
    handle.System.run_async = slowed(handle.System.run_async)
"""


def killed_and_resumed(tmp_path: Path, cfg: Path, *overrides: str) -> dict:
    """Train, kill -9 once a checkpoint exists, resume; the resumed run's summary."""
    run = tmp_path / "killed"
    env = env_with_sitecustomize(tmp_path, SLOW, SLOW_SYSTEM_ROUNDS="1")
    proc = subprocess.Popen([sys.executable, "-m", "distfl", "train", str(cfg), f"output.dir={run}", *overrides],
                            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while proc.poll() is None and not (run / "checkpoints" / "latest").exists():
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert (run / "checkpoints" / "latest").exists() and not (run / "summary.json").exists()
    return train_ok(None, resume=str(run))


def test_deadline_with_dropouts_survives_kill_9(tmp_path):
    cfg = write_config(tmp_path / "c.yaml")
    through = train_ok(cfg, f"output.dir={tmp_path / 'through'}", *DEADLINE)
    resumed = killed_and_resumed(tmp_path, cfg, *DEADLINE)
    assert resumed["model_sha256"] == through["model_sha256"]
    assert resumed["virtual_time_s"] == through["virtual_time_s"]


def test_reference_flops_scales_compute_by_the_models_flops(tmp_path):
    """SMALL's MLP on 1x8x8 inputs: Linear 64->64, 64->64, 64->10, 2 FLOPs a multiply-add."""
    flops = 2 * (64 * 64 + 64 * 64 + 64 * 10)
    trainer = build_trainer(write_config(tmp_path / "c.yaml"), tmp_path / "run", "system.speed=constant:2",
                            f"system.reference_flops={flops / 4}")
    assert trainer.system.compute_scale == 4.0
    assert trainer.system.model.compute_s(0, 100) == 3 * 100 * 2 * 4.0 / 1000
    trainer.close()

"""Asynchronous aggregation on the virtual clock (FedBuff, FedAsync): identities with synchronous FedAvg,
the staleness weights of the papers, the server rules, and exactness across ranks and kills."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest
import torch

from conftest import (REPO, build_trainer, env_with_sitecustomize, metrics, one_two_resumed, run_cli, summary, train_ok,
                      write_config)
from test_system import killed_and_resumed
from distfl.config import ConfigWarning, load_config
from distfl.errors import ConfigError
from distfl.system.staleness import staleness_weight

SPEEDS = ("system.speed=lognormal:0,1", "system.bandwidth=uniform:100,1000")
# SMALL's cohort is 5 clients: K = C = 5, nothing may be stale.
AS_SYNC = ("system.async_mode=fedbuff", "system.buffer_size=5", "system.concurrency=5", "system.max_staleness=0")
BUFFERED = ("system.async_mode=fedbuff", "system.buffer_size=2", "system.concurrency=6",
            "system.staleness=polynomial", "system.max_staleness=3", "system.dropout=0.3")


@pytest.mark.parametrize("method", [(), ("algorithm.name=fedprox", "algorithm.mu=0.1", "server.optimizer=adam",
                                         "server.lr=0.01")])
def test_fedbuff_with_k_equal_c_equal_cohort_is_sync_fedavg(tmp_path, method):
    cfg = write_config(tmp_path / "c.yaml")
    sync = train_ok(cfg, f"output.dir={tmp_path / 'sync'}", *SPEEDS, *method)
    buff = train_ok(cfg, f"output.dir={tmp_path / 'buff'}", *SPEEDS, *method, *AS_SYNC)
    assert buff["model_sha256"] == sync["model_sha256"]
    keys = ("train_loss", "virtual_time_s", "test_acc")
    assert [[r.get(k) for k in keys] for r in metrics(tmp_path / "buff")] == \
        [[r.get(k) for k in keys] for r in metrics(tmp_path / "sync")]
    assert all(r["updates"] == 5 and r["staleness_max"] == 0 for r in metrics(tmp_path / "buff"))


@pytest.mark.parametrize("s", range(0, 12))
def test_staleness_weights_are_the_papers(s):
    """FedAsync (Xie et al. 2019, section 5.2): polynomial s_a(t - tau) = (t - tau + 1)^-a; hinge
    s_{a,b}(t - tau) = 1 if t - tau <= b else 1 / (a (t - tau - b) + 1). FedBuff: 1 / sqrt(1 + s)."""
    assert staleness_weight("constant", s) == 1.0
    assert staleness_weight("polynomial", s, a=0.5) == pytest.approx(1 / (1 + s) ** 0.5, rel=1e-15)
    assert staleness_weight("polynomial", s, a=2.0) == pytest.approx((s + 1.0) ** -2, rel=1e-15)
    assert staleness_weight("hinge", s, a=10.0, b=4.0) == (1.0 if s <= 4 else pytest.approx(1 / (10.0 * (s - 4) + 1)))


def _record(trainer) -> list:
    """(step, the version's round the client started in, its model, start model, weight) of every update."""
    seen = []
    inner = trainer.algorithm.client_statistics

    def recording(run, worker, stats):
        seen.append((trainer.state.last_round, run.round_idx, run.client_id, worker.params.detach().clone(),
                     run.global_params.clone(), run.weight))
        inner(run, worker, stats)

    trainer.algorithm.client_statistics = recording
    return seen


def test_fedbuff_applies_staleness_weighted_updates(tmp_path):
    trainer = build_trainer(write_config(tmp_path / "c.yaml"), tmp_path / "run", *SPEEDS, *BUFFERED)
    seen = _record(trainer)
    sizes = trainer.population.sizes
    stale_seen = set()
    for t in range(1, 9):
        before = trainer.global_params.double().clone()
        seen.clear()
        trainer.system.run_async(t)
        assert len(seen) == 2
        total = sum(int(sizes[c]) for _, _, c, *_ in seen)
        expected = before.clone()
        for step, started, c, params, start, weight in seen:
            s = step - started
            stale_seen.add(s)
            assert 0 <= s <= 3
            assert weight == pytest.approx((1 + s) ** -0.5 * int(sizes[c]) / total, rel=1e-12)
            expected += weight * (params.double() - start.double())
        assert torch.allclose(trainer.global_params.double(), expected, atol=1e-6, rtol=0)
    assert max(stale_seen) > 0  # some updates were stale


def test_fedasync_mixes_with_alpha_times_the_staleness_weight(tmp_path):
    trainer = build_trainer(write_config(tmp_path / "c.yaml"), tmp_path / "run", *SPEEDS, "system.async_mode=fedasync",
                            "system.concurrency=4", "system.staleness=hinge", "system.staleness_a=2",
                            "system.staleness_b=1", "system.async_alpha=0.5")
    seen = _record(trainer)
    stale_seen = set()
    for t in range(1, 11):
        before = trainer.global_params.double().clone()
        seen.clear()
        trainer.system.run_async(t)
        ((step, started, _, params, _, weight),) = seen
        s = step - started
        stale_seen.add(s)
        mix = 0.5 * (1.0 if s <= 1 else 1 / (2 * (s - 1) + 1))
        assert weight == pytest.approx(mix, rel=1e-15)
        assert torch.allclose(trainer.global_params.double(), (1 - mix) * before + mix * params.double(), atol=1e-6,
                              rtol=0)
    assert max(stale_seen) > 1  # the hinge's slope was used


def test_fedbuff_is_the_same_on_one_two_and_resumed(tmp_path):
    cfg = write_config(tmp_path / "c.yaml")
    one, _, _ = one_two_resumed(cfg, tmp_path, *SPEEDS, *BUFFERED, "algorithm.name=fedprox", "server.momentum=0.5")
    rows = metrics(tmp_path / "one")
    assert sum(r["dropped"] for r in rows) > 0 and max(r["staleness_max"] for r in rows) > 0
    assert [r["virtual_time_s"] for r in rows] == [r["virtual_time_s"] for r in metrics(tmp_path / "two")]


def test_fedbuff_survives_kill_9(tmp_path):
    cfg = write_config(tmp_path / "c.yaml", train={"rounds": 10})
    through = train_ok(cfg, f"output.dir={tmp_path / 'through'}", *SPEEDS, *BUFFERED)
    resumed = killed_and_resumed(tmp_path, cfg, *SPEEDS, *BUFFERED)
    assert resumed["model_sha256"] == through["model_sha256"]
    assert resumed["virtual_time_s"] == through["virtual_time_s"]


@pytest.mark.parametrize("override, message", [
    ("algorithm.name=scaffold", "composes with algorithm.name in fedavg, fedprox"),
    ("system.round=deadline", "applies to synchronous runs only"),
    ("train.cohort=sequential", "set train.cohort=random"),
])
def test_what_async_does_not_compose_with_is_refused_before_work(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, ["system.async_mode=fedbuff", override, "system.deadline_s=1"])


def test_system_async_is_another_spelling_of_async_mode(tmp_path):
    """The issue's key name, `system.async`, in YAML, on the command line and in a grid: the same key as
    system.async_mode (the field's name, since `async` is a Python keyword)."""
    from distfl.sweep.grid import parse_grid_arg

    keys = dict(o.split("=") for o in BUFFERED)
    as_yaml = write_config(tmp_path / "a.yaml", system={("async" if k == "system.async_mode" else
                                                         k.removeprefix("system.")): v for k, v in keys.items()})
    assert load_config(str(as_yaml)).system.async_mode == "fedbuff"
    with pytest.warns(ConfigWarning, match="system.buffer_size is set but only used by system.async_mode"):
        assert load_config(str(as_yaml), ["system.async=fedasync"]).system.async_mode == "fedasync"
    assert load_config(None, ["system.async=fedasync"]).system.async_mode == "fedasync"
    assert parse_grid_arg("system.async=none,fedbuff") == ("system.async", ["none", "fedbuff"])
    spelled = train_ok(as_yaml, f"output.dir={tmp_path / 'spelled'}")
    cfg = write_config(tmp_path / "c.yaml")
    named = train_ok(cfg, f"output.dir={tmp_path / 'named'}", *BUFFERED)
    assert spelled["model_sha256"] == named["model_sha256"]
    assert "updates" in metrics(tmp_path / "spelled")[0]


def test_system_async_and_async_mode_together_are_refused(tmp_path):
    both = write_config(tmp_path / "b.yaml", system={"async": "fedbuff", "async_mode": "fedbuff"})
    with pytest.raises(ConfigError, match="system.async and system.async_mode in .* are one key"):
        load_config(str(both))


@pytest.mark.parametrize("losses", [
    ("system.dropout=0.3",),
    ("system.dropout=0.3", "system.max_staleness=1"),
    ("system.availability=diurnal", "system.diurnal_period_s=20", "system.diurnal_online=0.7", "system.dropout=0.2"),
], ids=["dropouts", "dropouts_and_discards", "offline_at_report"])
def test_every_fedbuff_step_applies_k_distinct_clients(tmp_path, losses):
    """A client waiting in the buffer holds its slot: it is never started again before the step that applies
    it, so each step applies exactly K updates of K distinct clients, whatever was thrown away before."""
    trainer = build_trainer(write_config(tmp_path / "c.yaml"), tmp_path / "run", *SPEEDS, "system.async_mode=fedbuff",
                            "system.buffer_size=5", "system.concurrency=8", *losses)
    seen = _record(trainer)
    thrown = 0
    for t in range(1, 31):
        seen.clear()
        row = trainer.system.run_async(t)
        clients = [c for _, _, c, *_ in seen]
        assert len(clients) == 5 and len(set(clients)) == 5 and row["updates"] == 5, (t, clients)
        thrown += row["dropped"] + row["discarded"]
    assert thrown > 0


HANG_GUARD_S = 300  # a guard against a hang that a loaded machine never reaches, not a speed bound


def _train_cli(tmp_path, *overrides):
    """`distfl train` of the small config with heterogeneous speeds, in a process of its own."""
    config = write_config(tmp_path / "c.yaml")
    return run_cli(["train", str(config), f"output.dir={tmp_path / 'run'}", *SPEEDS, *overrides], subprocess_=True,
                   timeout=HANG_GUARD_S)


def test_a_buffer_larger_than_the_concurrency_is_refused_before_work(tmp_path):
    """A buffered update holds its slot, so K > C could never fill the buffer: the defaults (K = 10, C =
    train.clients_per_round = 5 here) are refused in one line, before any work."""
    proc = _train_cli(tmp_path, "system.async_mode=fedbuff")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "distfl: error: system.buffer_size (10) > system.concurrency (5, train.clients_per_round): a buffered update "
        "holds its slot until the step, so the buffer would never fill; set system.buffer_size <= 5 or "
        "system.concurrency >= 10"]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("overrides, says", [
    # 12 clients, each dropping out with probability 0.9 at each model version: at server step 5 all of them do
    (("system.dropout=0.9",), "server step 5: no update can reach the buffer (0 of 1 buffered): every client that "
                              "is not waiting in it dropped out at this model version or is never online; check "
                              "system.dropout=0.9"),
    # online 86 microseconds a day: every client is offline when it would report
    (("system.availability=diurnal", "system.diurnal_online=1e-9"),
     "server step 1: no update reached the buffer in 1200 reports in a row (100 per client: "),
], ids=["every_client_drops", "always_offline_at_report"])
def test_an_async_run_in_which_nothing_can_report_stops_with_one_line(tmp_path, overrides, says):
    proc = _train_cli(tmp_path, "system.async_mode=fedasync", *overrides)
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"distfl: error: {says}"), proc.stderr
    done = summary(tmp_path / "run")
    assert done["status"] == "failed" and f"distfl: error: {done['error']}" == last


def test_a_trace_in_which_no_client_is_ever_online_is_refused_naming_the_file(tmp_path):
    trace = tmp_path / "never.json"
    trace.write_text(json.dumps({"1": {"active": [50], "inactive": [40], "finish_time": 100},
                                 "2": {"active": [120], "inactive": [130], "finish_time": 100}}))
    proc = _train_cli(tmp_path, "system.async_mode=fedasync", "system.availability=trace",
                      f"system.trace_file={trace}")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"distfl: error: {trace}: no entry has an online interval (active[i] <= inactive[i], active[i] < "
        "finish_time), so no client would ever be online"]
    assert not (tmp_path / "run").exists()


# Server step 3 marks its start in $STEP_MARK and waits (300 s at most, a hang guard) until the run was asked to stop.
SITE_STOP_IN_STEP = """
import os, time
from pathlib import Path
from distfl.system import handle

_run_async = handle.System.run_async

def run_async(self, step):
    if step == 3:
        Path(os.environ["STEP_MARK"]).touch()
        deadline = time.time() + 300
        while not self.trainer.stop.requested and time.time() < deadline:
            time.sleep(0.05)
    return _run_async(self, step)

handle.System.run_async = run_async
"""


def test_sigterm_stops_an_async_run_after_its_step_and_the_resume_continues_it(tmp_path):
    config = write_config(tmp_path / "c.yaml", train={"rounds": 6})
    through = train_ok(config, f"output.dir={tmp_path / 'through'}", *SPEEDS, *BUFFERED)
    mark, run = tmp_path / "step3", tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "distfl", "train", str(config), f"output.dir={run}", *SPEEDS,
                             *BUFFERED], cwd=REPO, env=env_with_sitecustomize(tmp_path, SITE_STOP_IN_STEP,
                                                                              STEP_MARK=str(mark)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.time() + HANG_GUARD_S
    while not mark.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert mark.exists(), proc.communicate()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=HANG_GUARD_S)
    assert proc.returncode == 3, err
    assert err.strip().splitlines()[-1].startswith("distfl: stopped by SIGTERM (a kill, or Slurm's preemption, requeue "
                                                   "or cancel) before the last round: checkpoint written after round 3 "
                                                   "of 6"), err
    assert summary(run)["status"] == "stopped"
    resumed = train_ok(None, resume=str(run))
    assert resumed["model_sha256"] == through["model_sha256"]

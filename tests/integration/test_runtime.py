"""The runtime's promises, checked on real processes: same model on 1 or 2 ranks and any placement,
resume equals running through, one all_reduce per round, clean failures."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from conftest import REPO, Started, metrics, one_and_two, run_cli, summary, train_ok, write_config

ALGORITHMS = [
    ("fedavg", []),
    ("fedavg", ["server.optimizer=adam", "server.lr=0.01"]),
    ("fedprox", ["algorithm.mu=0.1", "train.momentum=0.9"]),
    ("scaffold", []),
    ("feddyn", ["algorithm.alpha=0.1"]),
    ("fednova", ["train.momentum=0.5", "train.weight_decay=0.001"]),
    ("fedadc", ["train.local_steps=23"]),  # fixed local steps, past one pass over most clients' data
]


@pytest.fixture(scope="module")
def scaffold_on_two_ranks(tmp_path_factory):
    """(run directory, summary) of SCAFFOLD on the small config on 2 ranks: one run for the tests that each
    need exactly it."""
    tmp = tmp_path_factory.mktemp("scaffold")
    run = tmp / "two"
    return run, train_ok(write_config(tmp / "small.yaml"), f"output.dir={run}", "algorithm.name=scaffold", nproc=2)


@pytest.mark.parametrize("name,extra", ALGORITHMS, ids=[f"{a}{'+' if e else ''}{e[0] if e else ''}" for a, e in ALGORITHMS])
def test_one_rank_equals_two_ranks(tmp_path, small_config, name, extra, request):
    """Bit-identical final model on 1 process and on 2 gloo processes (balanced placement)."""
    args = [f"algorithm.name={name}", *extra]
    if args == ["algorithm.name=scaffold"]:
        one = train_ok(small_config, f"output.dir={tmp_path / 'one'}", *args)
        two_dir, two = request.getfixturevalue("scaffold_on_two_ranks")
    else:
        two_dir = tmp_path / "two"
        one, two = one_and_two(small_config, tmp_path, *args)
    assert one["world_size"] == 1 and two["world_size"] == 2
    assert one["model_sha256"] == two["model_sha256"]
    assert one["final_test_acc"] == two["final_test_acc"]
    # The training loss is an exact sum too, so even the logged curves agree.
    assert [r["train_loss"] for r in metrics(tmp_path / "one")] == [r["train_loss"] for r in metrics(two_dir)]


def test_placement_and_state_location_do_not_change_the_model(tmp_path, small_config):
    """SCAFFOLD with state in memory (sticky), on disk with balanced placement, and all on one rank."""
    two_ranks = {"sticky_memory": (f"output.dir={tmp_path / 'b'}", "algorithm.name=scaffold", "runtime.placement=sticky"),
                 "balanced_disk": (f"output.dir={tmp_path / 'c'}", "algorithm.name=scaffold", "runtime.placement=balanced",
                                   "runtime.client_state=disk")}
    # The 2-rank runs train beside the 1-rank run in this process.
    started = {name: Started(["train", small_config, *overrides], nproc=2) for name, overrides in two_ranks.items()}
    try:
        runs = {"one_rank": train_ok(small_config, f"output.dir={tmp_path / 'a'}", "algorithm.name=scaffold"),
                **{name: train_ok(small_config, *overrides, started=started[name])
                   for name, overrides in two_ranks.items()}}
    finally:
        for run in started.values():
            run.stop()
    assert len({s["model_sha256"] for s in runs.values()}) == 1, runs


def test_batchnorm_model_one_rank_equals_two_ranks(tmp_path):
    """BatchNorm running statistics are aggregated exactly too (ResNet-20)."""
    cfg = write_config(tmp_path / "bn.yaml", model={"name": "resnet20"},
                       train={"rounds": 2, "clients_per_round": 4}, data={"synthetic_channels": 3})
    one, two = one_and_two(cfg, tmp_path)
    assert one["model_sha256"] == two["model_sha256"]


def test_exactly_one_all_reduce_per_round(scaffold_on_two_ranks):
    s = scaffold_on_two_ranks[1]
    calls, sent = s["collectives"]["calls"], s["collectives"]["bytes"]
    assert calls["round_stats"] == 6  # one per round
    assert calls["eval"] == 2  # rounds 3 and 6
    assert "all_gather" not in calls and "broadcast" not in calls
    # SCAFFOLD sums: 5 standard scalars, the delta and the control-variate delta (MLP: no buffers), and
    # per fixed statistic (loss_sum, delta, buffers, control_delta) two counts of the exactness checks.
    assert sent["round_stats"] == 6 * 8 * (5 + 2 * s["num_params"] + 2 * 4)


# Each rank counts the collectives after which gloo still held a reference to the tensor.
GLOO_HOLDS = """
import sys, torch
from distfl import dist
ctx = dist.init("cpu", 1)
held = 0
for i in range(100):
    t = torch.full((8,), i, dtype=torch.int64)
    before = sys.getrefcount(t)
    dist.all_reduce_sum(t, ctx, "test")
    held += sys.getrefcount(t) != before
    assert t.tolist() == [2 * i] * 8
print(f"rank {ctx.rank} held {held}")
dist.shutdown(ctx)
"""


def test_gloo_holds_no_tensor_once_all_reduce_returns(tmp_path):
    """gloo drops a collective's tensor on its own thread, which needs the GIL: a drop still pending when
    the process exits aborts it (SIGABRT after a finished run, seen in CI). After each all_reduce_sum the
    tensor's reference count is back where it was (without the wait, about 4 in 10 were still held)."""
    script = tmp_path / "holds.py"
    script.write_text(GLOO_HOLDS)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(script)], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    # The two ranks share stdout: their lines can run together.
    assert sorted(re.findall(r"rank \d held \d+", proc.stdout)) == ["rank 0 held 0", "rank 1 held 0"], proc.stdout


@pytest.mark.parametrize("name,extra,nproc_resume", [
    ("fedavg", ["server.momentum=0.9"], 1),
    ("scaffold", [], 1),
    ("scaffold", ["runtime.client_state=disk"], 2),
    ("feddyn", [], 2),
])
def test_resume_equals_uninterrupted(tmp_path, small_config, name, extra, nproc_resume):
    """Stop after round 4, resume to round 6 (on 1 or 2 ranks): same model, no duplicated metrics rows."""
    args = [f"algorithm.name={name}", *extra]
    through = train_ok(small_config, f"output.dir={tmp_path / 'through'}", *args)
    train_ok(small_config, f"output.dir={tmp_path / 'stopped'}", *args, "train.rounds=4")
    resumed = train_ok(None, "train.rounds=6", resume=str(tmp_path / "stopped"), nproc=nproc_resume)
    assert resumed["model_sha256"] == through["model_sha256"]
    assert [r["round"] for r in metrics(tmp_path / "stopped")] == [1, 2, 3, 4, 5, 6]
    assert resumed["final_test_acc"] == through["final_test_acc"]


def test_resume_after_a_crash_between_checkpoints(tmp_path, small_config):
    """A run that died after round 5 with its last checkpoint at round 4 recomputes round 5 once."""
    through = train_ok(small_config, f"output.dir={tmp_path / 'through'}", "algorithm.name=scaffold")
    run = tmp_path / "crashed"
    train_ok(small_config, f"output.dir={run}", "algorithm.name=scaffold")
    # Make the run directory look like the process was killed during round 6: the round-6 checkpoint
    # and summary never got written, metrics.jsonl already has round 5.
    import shutil

    shutil.rmtree(run / "checkpoints" / "round_000006")
    (run / "checkpoints" / "latest").write_text("round_000004\n")
    (run / "summary.json").unlink()
    lines = (run / "metrics.jsonl").read_text().splitlines()[:5]
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    resumed = train_ok(None, resume=str(run))
    assert resumed["model_sha256"] == through["model_sha256"]
    assert [r["round"] for r in metrics(run)] == [1, 2, 3, 4, 5, 6]


def test_resume_rejects_changes_that_alter_the_run(tmp_path, small_config):
    train_ok(small_config, f"output.dir={tmp_path / 'run'}", "train.rounds=2")
    proc = run_cli(["train", "--resume", str(tmp_path / "run"), "train.rounds=4", "train.lr=0.5"])
    assert proc.returncode == 2
    assert "train.lr" in proc.stderr and "differ" in proc.stderr
    proc = run_cli(["train", "--resume", str(tmp_path / "run")])
    assert proc.returncode == 2 and "train.rounds=" in proc.stderr  # already finished: says how to extend


def test_corrupt_checkpoint_is_refused(tmp_path, small_config):
    """With every checkpoint bad, resume stops, naming each one and its bad file.
    (With an older good one, it resumes from that: tests/integration/test_checkpoint.py.)"""
    run = tmp_path / "run"
    train_ok(small_config, f"output.dir={run}", "train.rounds=4")
    for name in ("round_000002", "round_000004"):
        state = run / "checkpoints" / name / "state.pt"
        state.write_bytes(state.read_bytes()[:100])
    proc = run_cli(["train", "--resume", str(run), "train.rounds=6"])
    assert proc.returncode == 2
    assert "no checkpoint" in proc.stderr and "state.pt does not match" in proc.stderr
    assert "round_000002" in proc.stderr and "round_000004" in proc.stderr


def test_nan_loss_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path, small_config):
    """A learning rate that explodes after a few rounds: the run stops naming the round."""
    run = tmp_path / "run"
    proc = run_cli(["train", str(small_config), f"output.dir={run}", "checkpoint.every=1",
                    "server.lr=1000", "train.rounds=30"])
    assert proc.returncode == 2, proc.stderr
    # The message names the statistic that was out of range (the local loss, once the model blew up).
    assert "round" in proc.stderr and "statistic loss_sum out of range" in proc.stderr
    s = summary(run)
    assert s["status"] == "diverged"
    bad_round = int(s["error"].split("round ")[1].split(":")[0])
    assert bad_round > 1
    latest = (run / "checkpoints" / "latest").read_text().strip()
    assert latest == f"round_{bad_round - 1:06d}"
    # The kept checkpoint is good: it resumes (and diverges again at the same round).
    proc = run_cli(["train", "--resume", str(run)])
    assert proc.returncode == 2 and f"round {bad_round}:" in proc.stderr


def test_large_clients_with_many_local_epochs_are_not_stopped_as_diverged(tmp_path):
    """Two clients of 20000 samples, 60 local epochs, lr 1e-6: each client's loss_sum (~2.3 * 1.2e6) is
    past the model update's bound (2^22 / 2), yet the run is healthy. It completes, on 1 and on 2 ranks
    bit for bit, and its train loss is the mean local loss (~ln 10 at this lr)."""
    cfg = write_config(tmp_path / "big.yaml",
                       data={"dataset": "synthetic", "synthetic_train": 40000, "synthetic_test": 200,
                             "synthetic_image_size": 4},
                       partition={"scheme": "iid", "num_clients": 2}, model={"name": "mlp", "mlp_hidden": 8},
                       train={"rounds": 1, "clients_per_round": 2, "lr": 1e-6, "batch_size": 20000,
                              "local_epochs": 60}, eval={"every": 1})
    one = train_ok(cfg, f"output.dir={tmp_path / 'one'}")
    assert one["status"] == "completed"
    two = train_ok(cfg, f"output.dir={tmp_path / 'two'}", nproc=2)
    assert two["model_sha256"] == one["model_sha256"]
    loss = metrics(tmp_path / "one")[0]["train_loss"]
    assert loss == metrics(tmp_path / "two")[0]["train_loss"]
    assert 2.0 < loss < 2.6


def test_existing_run_directory_is_protected(tmp_path, small_config):
    run = tmp_path / "run"
    train_ok(small_config, f"output.dir={run}", "train.rounds=2")
    proc = run_cli(["train", str(small_config), f"output.dir={run}", "train.rounds=2"])
    assert proc.returncode == 2 and "--resume" in proc.stderr and "--overwrite" in proc.stderr
    proc = run_cli(["train", str(small_config), f"output.dir={run}", "train.rounds=3", "--overwrite"])
    assert proc.returncode == 0
    assert summary(run)["rounds"] == 3 and len(metrics(run)) == 3


@pytest.mark.parametrize("overrides,expected", [
    (["train.round=5"], "did you mean 'train.rounds'"),
    (["algorithm.name=fedavgg"], "did you mean 'fedavg'"),
    (["train.clients_per_round=20"], "clients_per_round"),
    (["partition.scheme=n_classes", "partition.classes_per_client=11"], "classes_per_client"),
    (["partition.num_clients=300"], "min_size"),
    (["algorithm.name=scaffold", "runtime.placement=balanced"], "runtime.placement"),
])
def test_bad_input_fails_before_any_work(tmp_path, small_config, overrides, expected):
    run = tmp_path / "run"
    proc = run_cli(["train", str(small_config), f"output.dir={run}", *overrides])
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert expected in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not run.exists()  # nothing half-written


def test_missing_fmnist_says_how_to_get_it(tmp_path, monkeypatch):
    from distfl.cli import main
    from distfl.data import datasets

    monkeypatch.setattr(datasets, "DEBIAN_FMNIST_DIR", str(tmp_path / "no-debian"))
    cfg = write_config(tmp_path / "f.yaml", data={"dataset": "fmnist", "root": str(tmp_path / "empty"),
                                                  "download": False}, model={"name": "simplecnn"})
    code = main(["train", str(cfg), f"output.dir={tmp_path / 'run'}"])
    assert code == 2
    assert not (tmp_path / "run").exists()


def test_print_config_shows_resolved_values(small_config):
    proc = run_cli(["train", str(small_config), "train.rounds=17", "--print-config"], subprocess_=True)
    assert proc.returncode == 0
    import yaml

    printed = yaml.safe_load(proc.stdout)
    assert printed["train"]["rounds"] == 17 and printed["server"]["optimizer"] == "sgd"


def test_outputs(tmp_path, small_config):
    run = tmp_path / "run"
    s = train_ok(small_config, f"output.dir={run}", "output.tensorboard=true")
    for key in ("final_test_acc", "best_test_acc", "rounds", "wall_s", "model_sha256"):
        assert s[key] is not None
    assert s["rounds"] == 6 and len(s["model_sha256"]) == 64
    rows = metrics(run)
    assert [r["round"] for r in rows] == list(range(1, 7))
    assert {"train_loss", "round_s", "samples_per_s", "bytes_reduced", "bytes_up", "bytes_down"} <= set(rows[0])
    assert {"test_acc", "test_loss"} <= set(rows[2])
    assert max(r.get("test_acc", 0) for r in rows) == s["best_test_acc"]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tb"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"test/accuracy", "test/loss", "train/loss", "time/round_s", "time/samples_per_s",
            "comm/bytes_reduced", "comm/bytes_up", "comm/bytes_down"} <= tags
    assert [e.value for e in events.Scalars("test/accuracy")][-1] == pytest.approx(s["final_test_acc"])


def test_stop_signal_checkpoints_all_ranks_at_the_same_round_and_resume_is_exact(tmp_path):
    """SIGTERM to one rank only (as a preempted node would get): both ranks stop after the same round,
    the checkpoint holds it, and the resumed run ends with the uninterrupted model."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from conftest import REPO

    cfg = write_config(tmp_path / "slow.yaml", train={"rounds": 40, "clients_per_round": 5},
                       checkpoint={"every": 0}, eval={"every": 40})
    through = train_ok(cfg, f"output.dir={tmp_path / 'through'}")
    run = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                             "-m", "distfl", "train", str(cfg), f"output.dir={run}"], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics_file = run / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (metrics_file.exists() and len(metrics_file.read_text().splitlines()) >= 3):
        time.sleep(0.05)
    # Signal rank 1 only: its worker process is the torchrun child with the highest pid.
    children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
    os.kill(max(int(c) for c in children), signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    stopped_at = len(metrics_file.read_text().splitlines())
    assert 3 <= stopped_at < 40, err
    assert (run / "checkpoints" / "latest").read_text().strip() == f"round_{stopped_at:06d}"
    stopped = summary(run)  # not finished, and rank 0 names the signal that reached rank 1
    assert (stopped["status"], stopped["finished"], stopped["round_reached"]) == ("stopped", False, stopped_at)
    assert stopped["stopped_because"].startswith("SIGTERM") and stopped["stopped_because"] in err
    assert proc.returncode != 0  # bare torchrun: its ranks exit 3
    resumed = train_ok(None, resume=str(run), nproc=2)
    assert resumed["model_sha256"] == through["model_sha256"]
    assert [r["round"] for r in metrics(run)] == list(range(1, 41))

"""Checkpoints after a crash: every file listed and verified, resume from the newest good checkpoint,
durable writes, a lock on the run directory, complete client state across ranks."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

from conftest import REPO, metrics, run_cli, summary, train_ok, write_config
from distfl import checkpoint
from distfl.errors import CheckpointError

STATEFUL = ["algorithm.name=scaffold"]  # client files in every checkpoint


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """SCAFFOLD through 6 rounds, and the same run stopped after round 4 (checkpoints at 2 and 4)."""
    root = tmp_path_factory.mktemp("runs")
    cfg = write_config(root / "small.yaml")
    through = train_ok(cfg, f"output.dir={root / 'through'}", *STATEFUL)
    train_ok(cfg, f"output.dir={root / 'stopped'}", *STATEFUL, "train.rounds=4")
    return {"config": cfg, "through": through, "stopped": root / "stopped"}


def _copy(runs, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(runs["stopped"], run)
    return run


def _manifest(ckpt):
    return json.loads((ckpt / "manifest.json").read_text())


def _truncate(ckpt):
    (ckpt / "state.pt").write_bytes((ckpt / "state.pt").read_bytes()[:100])


def _alter_client(ckpt):
    path = sorted((ckpt / "clients").glob("*.pt"))[0]
    data = bytearray(path.read_bytes())
    data[-30] ^= 1
    path.write_bytes(bytes(data))


def _delete_client(ckpt):
    sorted((ckpt / "clients").glob("*.pt"))[0].unlink()


def _unlisted_client(ckpt):
    shutil.copyfile(sorted((ckpt / "clients").glob("*.pt"))[0], ckpt / "clients" / "999.pt")


def _client_dropped_from_manifest(ckpt):
    """A checkpoint that lost a client and its manifest entry (count check)."""
    manifest = _manifest(ckpt)
    name = sorted(n for n in manifest["files"] if n.startswith("clients/"))[0]
    del manifest["files"][name]
    (ckpt / name).unlink()
    (ckpt / "manifest.json").write_text(json.dumps(manifest))


def _manifest_without_files(ckpt):
    (ckpt / "manifest.json").write_text(json.dumps({"name": ckpt.name}))


def _manifest_cut_short(ckpt):
    text = (ckpt / "manifest.json").read_text()
    (ckpt / "manifest.json").write_text(text[: len(text) // 2])


DAMAGE = {
    "truncated_state": (_truncate, "state.pt does not match its recorded SHA-256"),
    "altered_client": (_alter_client, "does not match its recorded SHA-256"),
    "deleted_client": (_delete_client, "is missing"),
    "unlisted_client": (_unlisted_client, "clients/999.pt is not listed in its manifest"),
    "client_dropped_from_manifest": (_client_dropped_from_manifest, "client files but records"),
    "manifest_without_files": (_manifest_without_files, "manifest.json is malformed"),
    "manifest_cut_short": (_manifest_cut_short, "no readable manifest.json"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_resume_skips_a_bad_newest_checkpoint(runs, tmp_path, damage):
    """A bad newest checkpoint is skipped, with its name and why; the run resumes from the one before
    and ends with the uninterrupted model."""
    run = _copy(runs, tmp_path)
    spoil, why = DAMAGE[damage]
    spoil(run / "checkpoints" / "round_000004")
    proc = run_cli(["train", "--resume", str(run), "train.rounds=6"])
    assert proc.returncode == 0, proc.stderr
    assert "skipped checkpoint round_000004" in proc.stderr and why in proc.stderr
    assert "resuming from round_000002" in proc.stderr
    assert summary(run)["model_sha256"] == runs["through"]["model_sha256"]
    assert [r["round"] for r in metrics(run)] == [1, 2, 3, 4, 5, 6]
    # Set aside, so that pruning and a later resume do not count it.
    assert (run / "checkpoints" / ".round_000004.bad").is_dir()
    assert (run / "checkpoints" / "latest").read_text().strip() == "round_000006"


def test_truncated_last_metrics_line_does_not_block_resume(runs, tmp_path):
    """Killed while writing round 5's row: the torn line is dropped, round 5 recomputed once."""
    run = _copy(runs, tmp_path)
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"round": 5, "train_lo')
    proc = run_cli(["train", "--resume", str(run), "train.rounds=6"])
    assert proc.returncode == 0, proc.stderr
    assert [r["round"] for r in metrics(run)] == [1, 2, 3, 4, 5, 6]
    assert summary(run)["model_sha256"] == runs["through"]["model_sha256"]


def test_overwrite_with_client_state_on_disk(runs, tmp_path):
    """--overwrite empties client_state/ and the new run recreates it: same model as a fresh run."""
    args = [*STATEFUL, "runtime.client_state=disk", "train.rounds=3"]
    fresh = train_ok(runs["config"], f"output.dir={tmp_path / 'fresh'}", *args)
    run = tmp_path / "run"
    train_ok(runs["config"], f"output.dir={run}", *STATEFUL, "runtime.client_state=disk", "train.rounds=2")
    proc = run_cli(["train", str(runs["config"]), f"output.dir={run}", *args, "--overwrite"])
    assert proc.returncode == 0, proc.stderr
    assert summary(run)["model_sha256"] == fresh["model_sha256"]
    assert [r["round"] for r in metrics(run)] == [1, 2, 3]


def test_commit_fsyncs_every_file_and_directory_before_the_rename(tmp_path, monkeypatch):
    events = []
    monkeypatch.setattr(checkpoint, "fsync", lambda path: events.append(("fsync", str(path))))
    real_replace = os.replace
    monkeypatch.setattr(checkpoint.os, "replace",
                        lambda src, dst: (events.append(("replace", str(src))), real_replace(src, dst)))
    staging = checkpoint.begin(tmp_path, "round_000001")
    for client in (3, 7):
        torch.save({"c": torch.ones(2)}, staging / "clients" / f"{client}.pt")
    checkpoint.commit(tmp_path, "round_000001", {"round": 1}, keep=2, clients=2)
    rename = events.index(("replace", str(staging)))
    synced = {path for kind, path in events[:rename] if kind == "fsync"}
    files = ("state.pt", "manifest.json", "clients/3.pt", "clients/7.pt", "clients")
    assert {str(staging / name) for name in files} | {str(staging)} <= synced
    assert ("fsync", str(tmp_path / "checkpoints")) in events[rename:]  # the rename itself


def test_fsync_flushes_unless_distfl_fsync_is_0(tmp_path, monkeypatch):
    """The suite runs with DISTFL_FSYNC=0 (conftest.py); a user's run flushes every file it commits."""
    flushed = []
    real_fsync = os.fsync
    monkeypatch.setattr(checkpoint.os, "fsync", lambda fd: (flushed.append(fd), real_fsync(fd)))
    (tmp_path / "f").write_text("x")
    monkeypatch.delenv("DISTFL_FSYNC", raising=False)
    checkpoint.fsync(tmp_path / "f")
    monkeypatch.setenv("DISTFL_FSYNC", "1")
    checkpoint.fsync(tmp_path)
    assert len(flushed) == 2
    monkeypatch.setenv("DISTFL_FSYNC", "0")
    checkpoint.fsync(tmp_path / "f")
    assert len(flushed) == 2


def test_commit_refuses_a_checkpoint_missing_client_files(tmp_path):
    """The ranks reported 3 client files, the staging directory holds 2: no checkpoint is written."""
    staging = checkpoint.begin(tmp_path, "round_000002")
    for client in (3, 7):
        torch.save({"c": torch.ones(2)}, staging / "clients" / f"{client}.pt")
    with pytest.raises(CheckpointError, match="wrote 3 client state files but .* holds 2.*share"):
        checkpoint.commit(tmp_path, "round_000002", {"round": 2}, keep=2, clients=3)
    assert checkpoint.complete_checkpoints(tmp_path) == []


NODE_LOCAL = """
import os, sys
from pathlib import Path
from distfl.federation import state

# Rank 1 runs on another node: its clients land on a disk that rank 0 does not see.
original = state.ClientStateStore.write_checkpoint
def write_checkpoint(self, clients_dir, is_main):
    if os.environ["RANK"] == "1":
        clients_dir = Path(os.environ["NODE1_DISK"]) / clients_dir.relative_to(clients_dir.anchor)
    return original(self, clients_dir, is_main)
state.ClientStateStore.write_checkpoint = write_checkpoint
from distfl.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_memory_client_state_on_nodes_without_a_shared_directory_fails_loudly(tmp_path):
    """SCAFFOLD with client state in memory on 2 ranks whose checkpoint directories are not shared:
    the checkpoint would hold only rank 0's clients; the run stops instead, saying why."""
    script = tmp_path / "node_local.py"
    script.write_text(NODE_LOCAL)
    cfg = write_config(tmp_path / "small.yaml")
    run = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "NODE1_DISK": str(tmp_path / "node1")}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(script), "train", str(cfg), f"output.dir={run}", *STATEFUL, "train.rounds=2"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "filesystem that all nodes share" in proc.stderr
    assert checkpoint.complete_checkpoints(run) == []
    # On a shared directory the same run checkpoints every client it trained, on both ranks.
    proc = run_cli(["train", str(cfg), f"output.dir={tmp_path / 'shared'}", *STATEFUL, "train.rounds=2"], nproc=2)
    assert proc.returncode == 0, proc.stderr
    ckpt = tmp_path / "shared" / "checkpoints" / "round_000002"
    clients = sorted(int(p.stem) for p in (ckpt / "clients").glob("*.pt"))
    assert _manifest(ckpt)["clients"] == len(clients) == len(set(_cohorts(cfg, 2)))


def _cohorts(config, rounds):
    from distfl.config import load_config
    from distfl.data.datasets import load_dataset
    from distfl.data.partition import partition
    from distfl.federation.population import Population

    cfg = load_config(str(config))
    data = load_dataset(cfg.data, cfg.seed)
    labels = data.train_y.numpy()
    pop = Population(partition(labels, cfg.partition, data.num_classes, cfg.seed), labels, data.num_classes)
    return [c for t in range(1, rounds + 1)
            for c in pop.cohort(cfg.seed, t, cfg.train.clients_per_round, cfg.train.cohort)]


def test_a_second_run_in_a_running_directory_is_refused(tmp_path):
    """A real second process: refused at once while the first runs; once the first is killed (no
    clean-up), its stale lock does not block."""
    cfg = write_config(tmp_path / "slow.yaml", train={"rounds": 100000, "clients_per_round": 5},
                       checkpoint={"every": 0}, eval={"every": 100000})
    run = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    first = subprocess.Popen([sys.executable, "-m", "distfl", "train", str(cfg), f"output.dir={run}"],
                             cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not (run / "metrics.jsonl").exists():
            time.sleep(0.05)
        second = run_cli(["train", str(cfg), f"output.dir={run}", "train.rounds=2", "--overwrite"],
                         subprocess_=True)
        assert second.returncode == 2
        assert f"in use by another distfl run (pid {first.pid}" in second.stderr
        assert first.poll() is None and (run / "metrics.jsonl").exists()  # nothing deleted
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    third = run_cli(["train", str(cfg), f"output.dir={run}", "train.rounds=2", "--overwrite"])
    assert third.returncode == 0, third.stderr
    assert summary(run)["rounds"] == 2


def test_a_filesystem_without_locks_warns_and_runs(tmp_path, monkeypatch, capsys):
    """flock unsupported (ENOLCK, e.g. Lustre without -o flock): a warning, not a refusal."""
    import errno

    def no_locks(handle, flags):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(checkpoint.fcntl, "flock", no_locks)
    handle = checkpoint.lock_run_dir(tmp_path)
    handle.close()
    assert "cannot lock" in capsys.readouterr().err


# A run of distfl 0.1.0 (the release before the run state became objects: federation/run_state.py), stopped
# after round 1 of 2: SCAFFOLD (server and client controls, clients in the store) with GMA's mask and an
# Adam server optimizer. Its model after round 2, trained straight through by that release:
RELEASE_CHECKPOINT = REPO / "tests" / "fixtures" / "checkpoint_0.1.0_scaffold_gma"
RELEASE_MODEL_SHA256 = "646a48b6a528de809dcbdb8c1b4ab81bd1fe10d857a538416ae38cafa55ca939"


def test_a_checkpoint_of_the_previous_release_resumes_bit_identically(tmp_path):
    """Every key the release wrote is read back by the run's state objects: the resumed run ends with the
    model the release trained straight through, and so does a fresh run of today's code."""
    run_dir = tmp_path / "run"
    shutil.copytree(RELEASE_CHECKPOINT, run_dir)
    state = torch.load(run_dir / "checkpoints" / "round_000001" / "state.pt", weights_only=True)
    assert {"params", "buffers", "int_buffers", "frozen", "server", "privacy", "progress", "round", "step",
            "phases_done", "phase_results", "phase_state", "config", "data", "world_size", "runtime",
            "runtime_changes", "rng"} <= set(state)
    resumed = train_ok(None, "train.rounds=2", resume=str(run_dir))
    fresh = train_ok(run_dir / "config.yaml", f"output.dir={tmp_path / 'fresh'}", "train.rounds=2")
    assert resumed["model_sha256"] == fresh["model_sha256"] == RELEASE_MODEL_SHA256

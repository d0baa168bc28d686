"""`distfl data prepare` and data.dataset=prepared: the folder holds exactly what the source loader read,
a run trains on it memory-mapped, its hash is checked on resume, bad folders are refused in one line."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, run_cli, train_ok, write_config
from distfl.data.leaf import load_leaf
from distfl.data.prepared import load_prepared
from distfl.errors import DataError


def _leaf_vectors(root: Path, users: int = 6) -> None:
    """LEAF-format files (as split_data.py writes train/ and test/) of 5-number vectors, 4 classes."""
    rng = np.random.default_rng(0)
    for which in ("train", "test"):
        names = [f"u{k:03d}" for k in range(users)]
        data = {"users": names, "num_samples": [], "user_data": {}}
        for k, u in enumerate(names):
            n = 3 + k if which == "train" else 1 + k % 2
            data["user_data"][u] = {"x": rng.normal(size=(n, 5)).round(4).tolist(), "y": rng.integers(0, 4, n).tolist()}
            data["num_samples"].append(n)
        (root / which).mkdir(parents=True, exist_ok=True)
        (root / which / f"data_{which}_9.json").write_text(json.dumps(data))


def test_prepare_writes_what_the_loader_reads(tmp_path):
    _leaf_vectors(tmp_path / "leaf")
    out = tmp_path / "prepared"
    proc = run_cli(["data", "prepare", "leaf", "--from", str(tmp_path / "leaf"), "--out", str(out)])
    assert proc.returncode == 0, proc.stderr
    assert "6 clients, 33 training samples" in proc.stdout and "4 classes" in proc.stdout
    assert "partition.num_clients=6" in proc.stdout
    fed, ours = load_leaf(str(tmp_path / "leaf"), "sample", 0), load_prepared(str(out))
    for key in ("train_x", "train_y", "train_offsets", "test_x", "test_y", "test_offsets"):
        np.testing.assert_array_equal(getattr(ours, key), getattr(fed, key))
        assert getattr(ours, key).dtype == getattr(fed, key).dtype
    assert isinstance(ours.train_x, np.memmap) and ours.client_ids.tolist() == fed.client_ids and ours.num_classes == 4
    again = run_cli(["data", "prepare", "leaf", "--from", str(tmp_path / "leaf"), "--out", str(out)])
    assert again.returncode != 0 and "exists" in again.stderr


def test_run_on_prepared_equals_run_on_leaf_and_resume_checks_the_bytes(tmp_path):
    _leaf_vectors(tmp_path / "leaf")
    out = tmp_path / "prepared"
    assert run_cli(["data", "prepare", "leaf", "--from", str(tmp_path / "leaf"), "--out", str(out)]).returncode == 0
    base = {"seed": 1, "partition": {"scheme": "natural", "num_clients": 6}, "model": {"name": "mclr"},
            "train": {"rounds": 4, "clients_per_round": 3, "lr": 0.1, "batch_size": 4},
            "eval": {"every": 2, "clients": True}, "checkpoint": {"every": 2, "keep": 3},
            "output": {"progress": "none", "tensorboard": False}}
    cfg = write_config(tmp_path / "c.yaml", base)
    leaf = train_ok(cfg, "data.dataset=leaf", f"data.path={tmp_path / 'leaf'}", f"output.dir={tmp_path / 'a'}")
    prepared = train_ok(cfg, "data.dataset=prepared", f"data.path={out}", f"output.dir={tmp_path / 'b'}",
                        "train.rounds=2")
    resumed = train_ok(None, "train.rounds=4", resume=str(tmp_path / "b"))
    assert leaf["model_sha256"] == resumed["model_sha256"] and prepared["model_sha256"] != resumed["model_sha256"]
    # One input byte changed in place, the file's size and modification time kept: the hash, taken in the
    # background at start-up, still refuses it before any training.
    inputs, original = out / "train_x.npy", (out / "train_x.npy").read_bytes()
    stat = inputs.stat()
    with open(inputs, "r+b") as f:
        f.seek(len(original) - 3)
        f.write(bytes([original[-3] ^ 1]))
    os.utime(inputs, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert inputs.stat().st_size == stat.st_size and inputs.stat().st_mtime_ns == stat.st_mtime_ns
    proc = run_cli(["train", "--resume", str(tmp_path / "b"), "train.rounds=6"])
    assert proc.returncode != 0 and "data.path" in proc.stderr and "changed since the run started" in proc.stderr
    inputs.write_bytes(original)
    labels = np.load(out / "train_y.npy")
    labels[0] = (labels[0] + 1) % 4
    np.save(out / "train_y.npy", labels)
    proc = run_cli(["train", "--resume", str(tmp_path / "b"), "train.rounds=6"])
    assert proc.returncode != 0 and "data.path" in proc.stderr and "changed since the run started" in proc.stderr


@pytest.mark.parametrize("damage, message", [
    (lambda out: (out / "meta.json").write_text("{}"), "is not of format distfl-prepared-1"),
    (lambda out: (out / "meta.json").unlink(), "is not a prepared dataset"),
    (lambda out: np.save(out / "train_offsets.npy", np.array([0, 5, 3, 40])), "train_offsets must rise from 0"),
    (lambda out: (out / "test_y.npy").write_bytes(b"not numpy"), "cannot read test_y.npy"),
])
def test_bad_folders_are_refused(tmp_path, damage, message):
    _leaf_vectors(tmp_path / "leaf")
    out = tmp_path / "prepared"
    assert run_cli(["data", "prepare", "leaf", "--from", str(tmp_path / "leaf"), "--out", str(out)]).returncode == 0
    damage(out)
    with pytest.raises(DataError) as info:
        load_prepared(str(out))
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_rerun_removes_what_a_killed_prepare_left(tmp_path):
    """A kill -9 inside the staging folder leaves OUT.HOST.PID.tmp (many GB for StackOverflow): the rerun
    removes it, with a line, and keeps those of live processes and of other hosts."""
    _leaf_vectors(tmp_path / "leaf")
    out = tmp_path / "prepared"
    killed = subprocess.run([sys.executable, "-c", "import os, signal\nfrom distfl.data.prepared import staging\n"
                             f"with staging({str(out)!r}) as tmp:\n"
                             "    open(os.path.join(tmp, 'train_x.npy'), 'wb').write(bytes(1000))\n"
                             "    print(tmp, flush=True)\n    os.kill(os.getpid(), signal.SIGKILL)\n"],
                            cwd=REPO, capture_output=True, text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL
    left = Path(killed.stdout.strip())
    pid = left.name.split(".")[-2]
    assert left.name == f"prepared.{socket.gethostname()}.{pid}.tmp" and left.is_dir()
    older = tmp_path / f"prepared.{pid}.tmp"  # as earlier versions named it
    live = tmp_path / f"prepared.{socket.gethostname()}.{os.getppid()}.tmp"  # a live process
    elsewhere = tmp_path / f"prepared.another-host.{pid}.tmp"
    for folder in (older, live, elsewhere):
        folder.mkdir()
    proc = run_cli(["data", "prepare", "leaf", "--from", str(tmp_path / "leaf"), "--out", str(out)])
    assert proc.returncode == 0, proc.stderr
    assert f"removed {left}, left by a `distfl data prepare` that was killed" in proc.stderr
    assert not left.exists() and not older.exists() and live.is_dir() and elsewhere.is_dir()
    assert load_prepared(str(out)).num_clients == 6

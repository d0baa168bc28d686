"""End to end on the real Fashion-MNIST (the Debian package that `make test` installs)."""
import os
import subprocess
from pathlib import Path

import pytest

from conftest import REPO, one_and_two, run_cli, summary, train_ok, write_config

FMNIST_CONFIG = {
    "seed": 0,
    "data": {"dataset": "fmnist"},
    "partition": {"scheme": "iid", "num_clients": 10},
    "model": {"name": "simplecnn"},
    "train": {"rounds": 3, "clients_per_round": 4, "batch_size": 32, "lr": 0.05},
    "eval": {"every": 3},
    "checkpoint": {"every": 0},
    "output": {"progress": "none", "tensorboard": False},
}


def test_partition_command_prints_sizes_and_histograms():
    proc = run_cli(["partition", str(REPO / "configs" / "quickstart.yaml")])
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "dirichlet" in lines[0] and "100 clients" in lines[0]
    assert sum(1 for line in lines if line.strip().split(" ")[0].isdigit()) >= 100


def test_fmnist_two_ranks_equal_one_and_learn(tmp_path):
    """A real CNN on real data: 1 process and 2 gloo ranks give the same model, and it learns."""
    cfg = write_config(tmp_path / "fmnist.yaml", base=FMNIST_CONFIG)
    one, two = one_and_two(cfg, tmp_path)
    assert one["model_sha256"] == two["model_sha256"]
    assert two["final_test_acc"] > 0.60  # measured 69.98% after these 3 short rounds; chance is 10%


def test_quickstart_reaches_80_percent(tmp_path):
    """The README quickstart, exactly as documented (2 ranks under torchrun), only writing elsewhere."""
    proc = run_cli(["train", "configs/quickstart.yaml", f"output.dir={tmp_path / 'qs'}"], nproc=2, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "final test accuracy" in proc.stdout
    s = summary(tmp_path / "qs")
    assert s["final_test_acc"] >= 0.80, s
    assert (tmp_path / "qs" / "tb").is_dir()


def test_spherefed_with_ffc_on_fmnist(tmp_path):
    """SphereFed's head and FFC on the real data, 2 ranks: the exact sums cover all 60,000 samples and
    the calibration improves the short-trained model (measured 74-75% vs 36-53% in 4-round probes)."""
    cfg = write_config(tmp_path / "sphere.yaml", base=FMNIST_CONFIG, model={"name": "simplecnn", "head": "sphere"},
                       train={"lr": 0.2, "momentum": 0.9, "batch_size": 64}, calibration={"method": "ffc"})
    out = train_ok(cfg, f"output.dir={tmp_path / 'r'}", nproc=2)
    ffc = out["phases"]["ffc"]
    assert ffc["samples"] == 60000 and abs(ffc["trace"] - (60000 - ffc["zero_features"])) < 1e-6
    assert out["collectives"]["calls"]["ffc"] == 1
    assert ffc["test_acc"] > ffc["test_acc_before"] and out["final_test_acc"] == ffc["test_acc"] > 0.6


def test_tct_on_fmnist_one_class_per_client(tmp_path):
    """TCT on the real data with one class per client (#C=1): FedAvg's model is near chance, the
    convexified stage 2 is far above it (measured: 12.34% -> 77.15% in experiments/tct)."""
    cfg = write_config(tmp_path / "tct.yaml", base=FMNIST_CONFIG,
                       partition={"scheme": "n_classes", "classes_per_client": 1, "num_clients": 10},
                       algorithm={"name": "tct"}, train={"rounds": 2, "clients_per_round": 10, "batch_size": 64},
                       tct={"p": 512, "rounds": 10, "lr": 5e-4}, eval={"every": 2})
    out = train_ok(cfg, f"output.dir={tmp_path / 'r'}")
    tct = out["phases"]["tct"]
    assert tct["stage1_test_acc"] < 0.35 and tct["test_acc"] > tct["stage1_test_acc"] + 0.25


def test_ccvr_on_fmnist_under_label_skew(tmp_path):
    """CCVR on the real data under Dir(0.1): the clients' statistics cover all 60,000 samples and 10 classes,
    1,000 virtual features retrain the head, and the calibration improves the short-trained, label-skewed
    global model (measured 42.28% -> 57.29%)."""
    cfg = write_config(tmp_path / "ccvr.yaml", base=FMNIST_CONFIG, partition={"scheme": "dirichlet", "alpha": 0.1},
                       train={"rounds": 2}, calibration={"method": "ccvr"})
    out = train_ok(cfg, f"output.dir={tmp_path / 'r'}")
    ccvr = out["phases"]["ccvr"]
    assert ccvr["samples"] == 60000 and ccvr["classes_seen"] == 10 and ccvr["virtual_features"] == 1000
    assert out["collectives"]["calls"]["ccvr"] == 1
    assert ccvr["test_acc"] > ccvr["test_acc_before"] + 0.05 and out["final_test_acc"] == ccvr["test_acc"]

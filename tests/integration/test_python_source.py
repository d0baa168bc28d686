"""`distfl data prepare python`: the Python standard library's own source (a real corpus on every machine) as
a next-token federation whose clients are its packages, read byte for byte; token_transformer trains on it
with LoRA."""
from __future__ import annotations

import os
import sysconfig

import numpy as np

from conftest import run_cli, train_ok, write_config
from distfl.data.prepared import load_prepared
from distfl.data.python_source import TEST_EVERY, load_python_source

STDLIB = sysconfig.get_paths()["stdlib"]
PACKAGES = ["json", "tomllib"]  # two small packages of every Python 3.11+


def _source(package: str) -> bytes:
    """The package's .py files in path order, each followed by a newline, read here independently."""
    root = os.path.join(STDLIB, package)
    files = sorted(os.path.relpath(os.path.join(d, n), root) for d, _, names in os.walk(root)
                   for n in names if n.endswith(".py") and "__pycache__" not in d)
    return b"".join(open(os.path.join(root, f), "rb").read() + b"\n" for f in files)


def test_clients_are_packages_and_samples_are_their_bytes():
    fed = load_python_source(STDLIB, PACKAGES, sequence_length=32)
    assert list(fed.client_ids) == PACKAGES and fed.num_classes == 257 and fed.tokens.unscored == (0,)
    for k, package in enumerate(PACKAGES):
        text = _source(package)
        count = (len(text) - 1) // 32
        train = slice(fed.train_offsets[k], fed.train_offsets[k + 1])
        test = slice(fed.test_offsets[k], fed.test_offsets[k + 1])
        assert fed.test_offsets[k + 1] - fed.test_offsets[k] == count // TEST_EVERY
        assert fed.train_offsets[k + 1] - fed.train_offsets[k] == count - count // TEST_EVERY
        # window j holds bytes 32 j .. 32 j + 32 as tokens byte + 1; every tenth window is a test sample
        windows = [w for j, w in enumerate(range(count)) if j % TEST_EVERY != TEST_EVERY - 1]
        for row, j in ((0, windows[0]), (-1, windows[-1])):
            x, y = fed.train_x[train][row], fed.train_y[train][row]
            assert bytes((x - 1).astype(np.uint8).tolist()) == text[32 * j:32 * j + 32]
            assert bytes((y - 1).astype(np.uint8).tolist()) == text[32 * j + 1:32 * j + 33]
        assert bytes((fed.test_x[test][0] - 1).astype(np.uint8).tolist()) == text[32 * 9:32 * 10]


def test_an_unknown_package_is_refused_in_one_line(tmp_path):
    proc = run_cli(["data", "prepare", "python", "--from", STDLIB, "--packages", "json,nosuchpackage",
                    "--out", str(tmp_path / "out")])
    assert proc.returncode != 0 and "'nosuchpackage', which is not a package of" in proc.stderr
    assert "json" in proc.stderr and not (tmp_path / "out").exists()


def test_prepare_then_lora_on_token_transformer(tmp_path):
    out = tmp_path / "stdlib"
    proc = run_cli(["data", "prepare", "python", "--from", STDLIB, "--packages", ",".join(PACKAGES),
                    "--sequence-length", "32", "--out", str(out)])
    assert proc.returncode == 0, proc.stderr
    assert "partition.num_clients=2" in proc.stdout
    fed = load_prepared(str(out))
    assert list(fed.client_ids) == PACKAGES and fed.tokens.name == "python_source"
    config = write_config(tmp_path / "c.yaml", {
        "seed": 0, "data": {"dataset": "prepared", "path": str(out), "normalize": "none"},
        "partition": {"scheme": "natural", "num_clients": 2}, "model": {"name": "token_transformer"},
        "train": {"rounds": 2, "clients_per_round": 2, "local_steps": 2, "batch_size": 8, "lr": 0.1},
        "eval": {"every": 2}, "output": {"progress": "none", "tensorboard": False}})
    full = train_ok(config, f"output.dir={tmp_path / 'full'}")
    lora = train_ok(config, f"output.dir={tmp_path / 'lora'}", "model.lora.rank=4", "model.lora.targets=['*.qkv','*.out']")
    assert lora["status"] == "completed" and 0 < lora["bytes_up"] < full["bytes_up"] / 10

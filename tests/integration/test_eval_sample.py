"""eval.test_samples and eval.train_samples: the global model scored on a fixed sample of a split, the
rows drawn once from the data seed (sorted(default_rng([seed, 7 or 8]).choice(size, N, replace=False)),
recomputed here), the same on 1 rank, 2 ranks and a resumed run, stated on the start line and in
summary.json; the whole split by default."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import build_trainer, metrics, one_two_resumed, run_cli, train_ok
from test_tff_text import _config, _independent_scores, _shakespeare


def _rows(size: int, wanted: int, seed: int, stream: int) -> list[int]:
    return sorted(np.random.default_rng([seed, stream]).choice(size, wanted, replace=False).tolist())


def test_the_sampled_rows_are_scored(tmp_path):
    """test_* and global_train_* of a Shakespeare model equal a token-by-token scoring of the drawn rows
    only (5 test and 11 training sequences; 3 and 6 of them scored); eval.clients is not sampled."""
    (tmp_path / "sh").mkdir()
    _shakespeare(tmp_path / "sh")
    trainer = build_trainer(_config(tmp_path, "sh", "shakespeare_lstm"), tmp_path / "r", "eval.test_samples=3",
                            "eval.train_samples=6")
    trainer.run_round(1)
    got = trainer.evaluate_round(clients=True)
    model, data = trainer.worker.module, trainer.data
    model.eval()
    assert (len(data.test_y), len(data.train_y)) == (5, 11)
    for prefix, x, y, rows in (("test_", data.test_x, data.test_y, _rows(5, 3, 3, 7)),
                               ("global_train_", data.train_x, data.train_y, _rows(11, 6, 3, 8))):
        assert rows != list(range(len(rows)))  # not simply the first rows
        loss, tokens, correct, scored = _independent_scores(model, x[rows], y[rows], {0})
        assert got[f"{prefix}loss"] == pytest.approx(loss / tokens, rel=1e-6)
        assert got[f"{prefix}acc"] == correct / scored
        whole = _independent_scores(model, x, y, {0})
        assert got[f"{prefix}loss"] != pytest.approx(whole[0] / whole[1], rel=1e-6)  # the sample, not the split
    hits = scores = 0
    for k in range(3):  # every client's own test sequences, all of them
        rows = slice(int(data.test_offsets[k]), int(data.test_offsets[k + 1]))
        _, _, correct, scored = _independent_scores(model, data.test_x[rows], data.test_y[rows], {0})
        hits, scores = hits + correct, scores + scored
    assert got["client_acc_weighted_mean"] == hits / scores


def test_one_rank_two_ranks_resumed_score_the_same_sample(tmp_path, small_config):
    """On the synthetic images: every evaluation of 1 rank, 2 ranks and a run stopped and resumed on 2
    ranks scores the same 77 test and 300 training samples, and says so."""
    sample = ("eval.test_samples=77", "eval.train_metrics=true", "eval.train_samples=300", "eval.every=1")
    one, two, resumed = one_two_resumed(small_config, tmp_path, *sample)
    rows = {name: [(r["test_acc"], r["test_loss"], r["global_train_acc"], r["global_train_loss"])
                   for r in metrics(tmp_path / name) if "test_acc" in r] for name in ("one", "two", "stopped")}
    assert len(rows["one"]) == 6 and rows["one"] == rows["two"] == rows["stopped"]
    expected = {"test": {"scored": 77, "of": 500}, "train": {"scored": 300, "of": 2000}}
    assert one["eval_samples"] == two["eval_samples"] == resumed["eval_samples"] == expected
    # whole splits give other values: the sample is what was scored
    whole = train_ok(small_config, f"output.dir={tmp_path / 'whole'}", "eval.train_metrics=true", "eval.every=1")
    assert whole["eval_samples"] == {"test": {"scored": 500, "of": 500}, "train": {"scored": 2000, "of": 2000}}
    assert whole["model_sha256"] == one["model_sha256"] and whole["final_test_acc"] != one["final_test_acc"]
    proc = run_cli(["train", str(small_config), f"output.dir={tmp_path / 'said'}", "train.rounds=1", "eval.test_samples=77",
                    "output.progress=log"])
    assert proc.returncode == 0, proc.stderr
    start = [line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("distfl fedavg on synthetic")]
    assert len(start) == 1 and start[0].endswith("; evaluations score a fixed sample: 77 of the 500 test samples")


def test_a_sample_as_large_as_the_split_is_the_split(tmp_path, small_config):
    """eval.test_samples >= the test split's size scores all of it: the default's values, bit for bit."""
    default = train_ok(small_config, f"output.dir={tmp_path / 'a'}", "train.rounds=2")
    large = train_ok(small_config, f"output.dir={tmp_path / 'b'}", "train.rounds=2", "eval.test_samples=500")
    assert default["final_test_acc"] == large["final_test_acc"] and default["final_test_loss"] == large["final_test_loss"]
    assert default["eval_samples"] == large["eval_samples"] == {"test": {"scored": 500, "of": 500}, "train": None}


def test_tct_refuses_a_test_sample(tmp_path, small_config):
    proc = run_cli(["train", str(small_config), f"output.dir={tmp_path / 'r'}", "algorithm.name=tct",
                    "eval.test_samples=10"])
    assert proc.returncode == 2 and "eval.test_samples=10 scores a sample of the test split" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "r").exists()

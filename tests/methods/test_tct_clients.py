"""TCT under eval.clients: every client scored with stage 2's linear model on its own local test set."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from conftest import build_trainer, metrics, run_cli, summary, train_ok, write_config
from distfl.algorithms.tct import MODEL_FILE
from distfl.data.client_test import client_test_sets, holdout_split
from distfl.tct.features import entk_features, reinit_head
from test_tct import TCT, crash_in_stage2_round_5

STATISTICS = ("mean", "std", "min", "p10", "weighted_mean")


def clients_config(tmp_path: Path, **eval_) -> Path:
    # eval.batch_size 64: the 500 test samples are 8 batches, so 2 ranks each hold test rows of most clients
    return write_config(tmp_path / "tct.yaml", algorithm={"name": "tct"}, tct=TCT,
                        eval={"every": 2, "clients": True, "batch_size": 64, **eval_},
                        checkpoint={"every": 2, "keep": 10})


def stage1_model(run: Path, trainer) -> torch.nn.Module:
    """Stage 1's final network with TCT's re-initialised head: the model the eNTK features are of."""
    from distfl.checkpoint import complete_checkpoints, load
    from distfl.federation.local import FlatModel
    from distfl.models import build_model

    state = load(next(p for p in complete_checkpoints(run) if p.name == "round_000006"), "cpu")
    flat = FlatModel(build_model(trainer.cfg.model, trainer.data.input_shape, trainer.data.num_classes))
    flat.load(state["params"], state["buffers"])
    reinit_head(flat.module, trainer.cfg.tct.head_seed)
    return flat.module


def stored(run: Path, name: str, p: int) -> np.ndarray:
    """A disk-store feature file of rank 0 (normalised in place: what stage 2 scored)."""
    return np.fromfile(run / "tct" / "rank0" / f"{name}.float32", np.float32).reshape(-1, p)


def predict(z: np.ndarray, psi: np.ndarray) -> np.ndarray:
    return (z.astype(np.float64) @ psi[:-1] + psi[-1]).argmax(1)


def statistics(hits: list[np.ndarray]) -> dict:
    """Of each client's hits on its local test set: the accuracies' statistics, and the pooled mean."""
    acc = np.array([h.mean() for h in hits])
    return {"mean": acc.mean(), "std": np.sqrt(((acc - acc.mean()) ** 2).mean()), "min": acc.min(),
            "p10": np.percentile(acc, 10), "weighted_mean": np.concatenate(hits).mean()}


def assert_close(got: dict, expected: dict) -> None:
    assert set(got) == set(STATISTICS)
    for key in STATISTICS:
        assert abs(got[key] - expected[key]) <= 1e-12, (key, got, expected)


def stage2_rows(run: Path) -> list[dict]:
    return [r for r in metrics(run) if r.get("phase") == "tct" and "test_acc" in r]


def test_stage2_per_client_statistics_recomputed_and_one_rank_equals_two(tmp_path):
    """client_split=test: each client's accuracy is the stage-2 model's (psi of tct_model.pt on the
    normalised test features) over its local test set (client_test_sets), recomputed here in numpy; the
    statistics are the final row's, summary.json's and phases.tct's, and 2 ranks give the same bits."""
    config = clients_config(tmp_path)
    one = train_ok(config, f"output.dir={tmp_path / 'one'}", "tct.feature_store=disk")
    two = train_ok(config, f"output.dir={tmp_path / 'two'}", nproc=2)

    trainer = build_trainer(config, tmp_path / "data")
    test_y = trainer.data.test_y.numpy()
    saved = torch.load(tmp_path / "one" / MODEL_FILE)
    psi = saved["psi"].numpy()
    hits = predict(stored(tmp_path / "one", "test", len(saved["mean"])), psi) == test_y

    def expected(sets):
        return statistics([hits[idx] for idx in sets if len(idx)])

    sets = client_test_sets(trainer.population.class_counts, test_y, 0, trainer.cfg.seed)
    right = expected(sets)
    assert_close(one["final_client_acc"], right)
    final = stage2_rows(tmp_path / "one")[-1]
    assert final["stage2_round"] == TCT["rounds"] and final["test_acc"] == hits.mean() == one["final_test_acc"]
    assert {k: final[f"client_acc_{k}"] for k in STATISTICS} == one["final_client_acc"] == \
        {k: one["phases"]["tct"][f"client_acc_{k}"] for k in STATISTICS}
    # The recomputation tells the right sets from others: each shifted by one sample, or another draw.
    for wrong in ([(idx + 1) % len(test_y) for idx in sets],
                  client_test_sets(trainer.population.class_counts, test_y, 0, trainer.cfg.seed + 1)):
        assert abs(expected(wrong)["mean"] - right["mean"]) > 1e-3
    # Stage 1's network is not what is scored at the end.
    stage1 = next(r for r in metrics(tmp_path / "one") if r["round"] == 6)
    assert abs(stage1["client_acc_mean"] - right["mean"]) > 0.1

    assert two["phases"]["tct"]["psi_sha256"] == one["phases"]["tct"]["psi_sha256"]
    assert two["final_client_acc"] == one["final_client_acc"]
    keys = ["round", "test_acc", *(f"client_acc_{k}" for k in STATISTICS)]
    assert [[r[k] for k in keys] for r in stage2_rows(tmp_path / "two")] == \
        [[r[k] for k in keys] for r in stage2_rows(tmp_path / "one")]
    # One collective an evaluation, as without eval.clients.
    assert two["collectives"]["calls"]["tct_eval"] == TCT["rounds"] // 2


def test_stage2_per_client_statistics_on_held_out_samples(tmp_path):
    """client_split=holdout: stage 2 trains on the rest of each client's data only, and each client is
    scored on the features of its held-out samples (holdout_split), normalised with the training
    statistics; recomputed here in numpy; 2 ranks give the same bits."""
    config = clients_config(tmp_path, client_split="holdout", client_holdout=0.25)
    one = train_ok(config, f"output.dir={tmp_path / 'one'}", "tct.feature_store=disk")
    two = train_ok(config, f"output.dir={tmp_path / 'two'}", nproc=2)

    from distfl.config import data_seed
    from distfl.data.partition import partition

    trainer = build_trainer(config, tmp_path / "data")
    labels, seed = trainer.data.train_y.numpy(), data_seed(trainer.cfg)
    parts = partition(labels, trainer.cfg.partition, trainer.data.num_classes, seed)
    kept, held = holdout_split(parts, labels, 0.25, seed)
    saved = torch.load(tmp_path / "one" / MODEL_FILE)
    psi, p = saved["psi"].numpy(), len(saved["mean"])
    stage1 = stage1_model(tmp_path / "one", trainer)
    tc = trainer.cfg.tct
    accuracies = []
    for k, idx in enumerate(held):
        assert len(stored(tmp_path / "one", f"client_{k}", p)) == len(kept[k]) == len(parts[k]) - len(idx)
        z = stored(tmp_path / "one", f"holdout_{k}", p)
        # the eNTK features of the held-out samples, z-scored with the training statistics (constant -> 0)
        raw = entk_features(stage1, trainer.data.train_x[idx], saved["coordinates"], tc.gradient_of, tc.chunk_size)
        expected = ((raw.to(torch.float64) - saved["mean"]) / saved["std"]).float()
        assert torch.allclose(torch.from_numpy(z), expected, rtol=2.4e-7, atol=1e-9), k  # 2 ulp
        assert len(z) == len(idx) > 0
        accuracies.append(predict(z, psi) == labels[idx])
    assert_close(one["final_client_acc"], statistics(accuracies))
    # Scored against the labels of another draw of the held-out samples (same sizes), the statistics differ.
    _, other = holdout_split(parts, labels, 0.25, seed + 1)
    wrong = [predict(stored(tmp_path / "one", f"holdout_{k}", p), psi) == labels[idx] for k, idx in enumerate(other)]
    assert abs(statistics(wrong)["mean"] - statistics(accuracies)["mean"]) > 1e-3

    assert two["phases"]["tct"]["psi_sha256"] == one["phases"]["tct"]["psi_sha256"]
    assert two["final_client_acc"] == one["final_client_acc"]


def test_stage2_per_client_statistics_survive_a_resume_inside_stage2(tmp_path, monkeypatch):
    """Crashed in stage-2 round 5 and resumed on 2 ranks: the same per-client statistics, every row."""
    config = clients_config(tmp_path)
    through = train_ok(config, f"output.dir={tmp_path / 'through'}")
    crash_in_stage2_round_5(monkeypatch, config, f"output.dir={tmp_path / 'crashed'}")
    proc = run_cli(["train", "--resume", tmp_path / "crashed"], nproc=2)
    assert proc.returncode == 0, proc.stderr
    assert "per-client accuracy (eval.clients, the model after tct)" in proc.stdout
    resumed = summary(tmp_path / "crashed")
    assert resumed["phases"]["tct"]["psi_sha256"] == through["phases"]["tct"]["psi_sha256"]
    assert resumed["final_client_acc"] == through["final_client_acc"] is not None
    assert stage2_rows(tmp_path / "crashed") == [
        {**row, "round_s": new["round_s"]} for row, new in zip(stage2_rows(tmp_path / "through"),
                                                               stage2_rows(tmp_path / "crashed"))]


def test_finetune_epochs_is_refused_with_tct(tmp_path):
    config = clients_config(tmp_path)
    proc = run_cli(["train", config, f"output.dir={tmp_path / 'r'}", "eval.finetune_epochs=1"])
    assert proc.returncode == 2 and "eval.finetune_epochs=1" in proc.stderr and "algorithm.name=tct" in proc.stderr
    assert not (tmp_path / "r").exists()

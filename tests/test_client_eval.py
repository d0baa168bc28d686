"""Per-client evaluation (eval.clients): local test sets, statistics recomputed independently, FedBN
reported through it, and the same numbers on 1 or 2 ranks."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import metrics, run_cli, summary, train_ok, write_config
from distfl.data.client_test import class_quota, client_test_sets

STATISTICS = ("client_acc_mean", "client_acc_std", "client_acc_min", "client_acc_p10")


# ---- local test sets -------------------------------------------------------------------------------

def test_class_quota_is_proportional_and_sums_to_size():
    assert class_quota(np.array([5, 3, 2, 0]), 10).tolist() == [5, 3, 2, 0]
    # 7 * (1/3, 1/3, 1/3) = 2.33 each: the one left over goes to the lowest class.
    assert class_quota(np.array([1, 1, 1]), 7).tolist() == [3, 2, 2]
    # 4 * (6, 3, 1) / 10 = 2.4, 1.2, 0.4: one left over; classes 0 and 2 tie at 0.4, class 0 gets it.
    assert class_quota(np.array([6, 3, 1]), 4).tolist() == [3, 1, 0]
    assert class_quota(np.array([0, 0]), 5).tolist() == [0, 0]


def test_client_test_sets_follow_each_clients_label_distribution():
    rng = np.random.default_rng(0)
    test_labels = rng.integers(0, 4, size=400)
    counts = np.array([[30, 0, 10, 0], [1, 1, 1, 1], [0, 0, 0, 600], [0, 0, 0, 0]])
    sets = client_test_sets(counts, test_labels, size=0, seed=5)
    share = len(test_labels) / counts.sum()
    for k, idx in enumerate(sets):
        assert len(np.unique(idx)) == len(idx)  # without replacement
        held = np.bincount(test_labels[idx], minlength=4)
        if k == 2:  # wants round(600 * share) of class 3, more than the test split has: all of them
            assert held.tolist() == [0, 0, 0, int((test_labels == 3).sum())]
        elif k == 3:
            assert len(idx) == 0  # a client without training data has no test set
        else:
            size = max(1, round(counts[k].sum() * share))
            assert held.tolist() == class_quota(counts[k], size).tolist()
    # A fixed size, and the draw is keyed by (seed, client) only: other clients do not move it.
    fixed = client_test_sets(counts, test_labels, size=8, seed=5)
    assert np.bincount(test_labels[fixed[0]], minlength=4).tolist() == [6, 0, 2, 0]
    changed = client_test_sets(np.array([[30, 0, 10, 0], [9, 0, 0, 0]]), test_labels, size=8, seed=5)
    assert np.array_equal(changed[0], fixed[0])
    assert not np.array_equal(client_test_sets(counts, test_labels, size=8, seed=6)[0], fixed[0])


def test_client_test_size_must_not_be_negative(tmp_path, small_config):
    proc = run_cli(["train", str(small_config), f"output.dir={tmp_path / 'r'}", "eval.clients=true",
                    "eval.client_test_size=-1"])
    assert proc.returncode == 2 and "eval.client_test_size" in proc.stderr
    assert not (tmp_path / "r").exists()


# ---- statistics, FedBN, ranks ---------------------------------------------------------------------

def _bn_config(tmp_path):
    return write_config(tmp_path / "bn.yaml", model={"name": "resnet20"},
                        data={"synthetic_channels": 3, "synthetic_train": 480, "synthetic_test": 200},
                        partition={"num_clients": 8}, train={"rounds": 2, "clients_per_round": 3},
                        eval={"every": 1, "clients": True}, aggregation={"fedbn": True})


def test_client_statistics_recomputed_independently_with_fedbn(tmp_path):
    """Each client's model is the global one with its own BatchNorm (the global BatchNorm if it was
    never sampled), scored on its own test set; mean, std, min and p10 over the clients."""
    from distfl import dist
    from distfl.config import load_config
    from distfl.federation.runner import Trainer

    cfg = load_config(str(_bn_config(tmp_path)), [f"output.dir={tmp_path / 'r'}"])
    trainer = Trainer(cfg, dist.init("cpu", 1))
    trainer.run_round(1)
    got = trainer.evaluate_round(clients=True)

    alg, worker = trainer.algorithm, trainer.worker
    sets = client_test_sets(trainer.population.class_counts, trainer.data.test_y.numpy(), 0, cfg.seed)
    accuracies, own = [], 0
    for client, idx in enumerate(sets):
        params, buffers = trainer.global_params.clone(), trainer.global_buffers.clone()
        state = trainer.store.peek(client)
        if state is not None:
            own += 1
            params[alg.bn_params], buffers[alg.bn_buffers] = state["bn_params"], state["bn_buffers"]
        worker.params.copy_(params)
        worker.buffers.copy_(buffers)
        worker.module.eval()
        with torch.no_grad():
            logits = worker.module(trainer.data.test_x[torch.from_numpy(idx)])
        accuracies.append(float((logits.argmax(1) == trainer.data.test_y[torch.from_numpy(idx)]).double().mean()))
    assert own == 3  # the first cohort has its own BatchNorm, the other five use the global one
    acc = torch.tensor(accuracies, dtype=torch.float64)
    expected = {"client_acc_mean": acc.mean(), "client_acc_std": acc.std(unbiased=False),
                "client_acc_min": acc.min(), "client_acc_p10": torch.quantile(acc, 0.1)}
    for key, value in expected.items():
        assert got[key] == pytest.approx(float(value), rel=1e-12, abs=1e-15), key
    # The global model on the pooled test set is reported beside it, unchanged.
    assert (got["test_acc"], got["test_loss"]) == trainer.evaluate()


def test_client_eval_one_rank_equals_two_ranks(tmp_path):
    """Clients are evaluated on the rank that holds their BatchNorm (memory, sticky) or on any rank
    (disk, balanced placement); the counts are exact sums, so every statistic is the same."""
    cfg = _bn_config(tmp_path)
    one = train_ok(cfg, f"output.dir={tmp_path / 'one'}", "output.tensorboard=true")
    two = train_ok(cfg, f"output.dir={tmp_path / 'two'}", nproc=2)
    disk = train_ok(cfg, f"output.dir={tmp_path / 'disk'}", "runtime.client_state=disk",
                    "runtime.placement=balanced", nproc=2)
    rows = {name: metrics(tmp_path / name) for name in ("one", "two", "disk")}
    keys = STATISTICS + ("test_acc",)
    assert [{k: r[k] for k in keys} for r in rows["one"]] == [{k: r[k] for k in keys} for r in rows["two"]] \
        == [{k: r[k] for k in keys} for r in rows["disk"]]
    assert one["final_client_acc"] == two["final_client_acc"] == disk["final_client_acc"] == {
        key.removeprefix("client_acc_"): rows["one"][-1][key] for key in STATISTICS}
    assert two["collectives"]["calls"]["eval"] == 2  # still one all_reduce per evaluation
    assert one["model_sha256"] == two["model_sha256"] == disk["model_sha256"]

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "one" / "tb"))
    events.Reload()
    for key in STATISTICS:
        logged = [(e.step, e.value) for e in events.Scalars(f"test/{key}")]
        assert logged == [(r["round"], pytest.approx(r[key])) for r in rows["one"]]


def test_client_eval_is_off_by_default(tmp_path, small_config):
    s = train_ok(small_config, f"output.dir={tmp_path / 'r'}")
    assert s["final_client_acc"] is None
    assert not any(k in row for row in metrics(tmp_path / "r") for k in STATISTICS)

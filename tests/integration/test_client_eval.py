"""Per-client evaluation (eval.clients): local test sets, statistics recomputed independently, FedBN
reported through it, and the same numbers on 1 or 2 ranks."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import build_trainer, metrics, one_and_two, run_cli, summary, train_ok, write_config
from distfl.data.client_test import class_quota, client_test_sets

STATISTICS = ("client_acc_mean", "client_acc_std", "client_acc_min", "client_acc_p10", "client_acc_weighted_mean")


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
    trainer = build_trainer(_bn_config(tmp_path), tmp_path / "r")
    trainer.run_round(1)
    got = trainer.evaluate_round(clients=True)

    alg, worker = trainer.algorithm, trainer.worker
    sets = client_test_sets(trainer.population.class_counts, trainer.data.test_y.numpy(), 0, trainer.cfg.seed)
    accuracies, own, hits, samples = [], 0, 0, 0
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
        correct = logits.argmax(1) == trainer.data.test_y[torch.from_numpy(idx)]
        accuracies.append(float(correct.double().mean()))
        hits, samples = hits + int(correct.sum()), samples + len(idx)
    assert own == 3  # the first cohort has its own BatchNorm, the other five use the global one
    acc = torch.tensor(accuracies, dtype=torch.float64)
    expected = {"client_acc_mean": acc.mean(), "client_acc_std": acc.std(unbiased=False),
                "client_acc_min": acc.min(), "client_acc_p10": torch.quantile(acc, 0.1),
                # the pooled (sample-weighted) mean: the clients' test sets differ in size
                "client_acc_weighted_mean": torch.tensor(hits / samples, dtype=torch.float64)}
    assert len({len(idx) for idx in sets}) > 1 and hits / samples != float(acc.mean())
    assert got["clients_never_sampled"] == 5  # 8 clients, a cohort of 3 in the one round run
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
    # 8 clients, cohorts of 3 in rounds 1 and 2: the clients neither drew, from the cohorts' seeds
    cohorts = [set(trainer_cohort) for trainer_cohort in _cohorts(cfg, tmp_path, 2)]
    assert [r["clients_never_sampled"] for r in rows["one"]] == [8 - len(cohorts[0]), 8 - len(cohorts[0] | cohorts[1])]
    assert one["clients_never_sampled"] == two["clients_never_sampled"] == 8 - len(cohorts[0] | cohorts[1])

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "one" / "tb"))
    events.Reload()
    for key in STATISTICS:
        logged = [(e.step, e.value) for e in events.Scalars(f"test/{key}")]
        assert logged == [(r["round"], pytest.approx(r[key])) for r in rows["one"]]


def _cohorts(config, tmp_path, rounds) -> list:
    """Each round's cohort drawn with numpy from the run's seed, as docs/partitions.md states it."""
    import yaml

    from distfl.federation.population import _COHORT_STREAM

    cfg = yaml.safe_load(config.read_text())
    n, size = cfg["partition"]["num_clients"], cfg["train"]["clients_per_round"]
    return [np.random.default_rng([cfg["seed"], _COHORT_STREAM, t]).choice(n, size=size, replace=False)
            for t in range(1, rounds + 1)]


def test_client_eval_is_off_by_default(tmp_path, small_config):
    s = train_ok(small_config, f"output.dir={tmp_path / 'r'}")
    assert s["final_client_acc"] is None and s["clients_never_sampled"] is None
    assert not any(k in row for row in metrics(tmp_path / "r") for k in STATISTICS)


# ---- eval.client_split=holdout: a held-out fraction of each client's own training data -------------

HOLDOUT = ("eval.clients=true", "eval.client_split=holdout", "eval.client_holdout=0.25")


def test_holdout_split_is_a_stratified_deterministic_part_of_each_partition():
    from distfl.data.client_test import holdout_split

    rng = np.random.default_rng(1)
    labels = rng.integers(0, 3, size=300)
    parts = [rng.permutation(300)[:40], np.arange(100, 110), np.array([7]), np.zeros(0, dtype=np.int64),
             np.array([3, 4])]
    train, held = holdout_split(parts, labels, 0.25, seed=9)
    for part, tr, ho in zip(parts, train, held):
        assert len(np.intersect1d(tr, ho)) == 0 and sorted(np.concatenate([tr, ho])) == sorted(part)
        assert tr.tolist() == [i for i in part if i not in set(ho.tolist())]  # the partition's order
        assert np.all(np.diff(ho) > 0)
    assert [len(h) for h in held] == [10, 2, 0, 0, 1]  # round(0.25 n), >= 1 and <= n - 1 for n >= 2
    # Stratified: the 10 held out of client 0 follow its label counts by largest remainder.
    assert np.bincount(labels[held[0]], minlength=3).tolist() == class_quota(np.bincount(labels[parts[0]], minlength=3), 10).tolist()
    again = holdout_split([p.copy() for p in parts], labels, 0.25, seed=9)
    assert all(np.array_equal(a, b) for a, b in zip(again[1], held))
    # Keyed by (seed, client) alone: other clients do not move a client's split; another seed does.
    assert np.array_equal(holdout_split(parts[:1], labels, 0.25, seed=9)[1][0], held[0])
    assert not np.array_equal(holdout_split(parts, labels, 0.25, seed=10)[1][0], held[0])


def test_holdout_is_never_trained_on_and_scores_the_logged_statistics(tmp_path, small_config, monkeypatch):
    """The held-out samples leave the training indices before any training (sizes count the rest), the
    split is the same for two constructions, and the statistics are the clients' accuracies on them."""
    from distfl.data.client_test import holdout_split
    from distfl.data.partition import partition
    from distfl.federation import round as round_engine

    trainer = build_trainer(small_config, tmp_path / "r", *HOLDOUT)
    cfg = trainer.cfg
    labels = trainer.data.train_y.numpy()
    parts = partition(labels, cfg.partition, trainer.data.num_classes, cfg.seed)
    train, held = holdout_split(parts, labels, 0.25, cfg.seed)
    for k, part in enumerate(parts):
        tr, ho = trainer.client_indices[k].numpy(), trainer.client_test[k].numpy()
        assert np.array_equal(tr, train[k]) and np.array_equal(ho, held[k]) and len(ho) >= 1
        assert len(np.intersect1d(tr, ho)) == 0 and np.array_equal(np.sort(np.concatenate([tr, ho])), np.sort(part))
    assert trainer.population.sizes.tolist() == [len(t) for t in train]
    assert trainer.client_test_x is trainer.data.train_x
    other = build_trainer(small_config, tmp_path / "o", *HOLDOUT)
    assert all(torch.equal(a, b) for a, b in zip(other.client_test, trainer.client_test))

    trained = []
    inner = round_engine.train_client
    monkeypatch.setattr(round_engine, "train_client", lambda w, d, idx, *a: (trained.extend(i.clone() for i in idx), inner(w, d, idx, *a))[1])
    for r in (1, 2):
        trainer.run_round(r)
    assert len(trained) == 2 * cfg.train.clients_per_round
    held_all = set(np.concatenate([h.numpy() for h in trainer.client_test]).tolist())
    assert not any(set(idx.tolist()) & held_all for idx in trained)
    got = trainer.evaluate_round(clients=True)

    trainer.worker.load(trainer.global_params, trainer.global_buffers)
    trainer.worker.module.eval()
    with torch.no_grad():
        acc = torch.tensor([float((trainer.worker.module(trainer.data.train_x[idx]).argmax(1)
                                   == trainer.data.train_y[idx]).double().mean()) for idx in trainer.client_test],
                           dtype=torch.float64)
    expected = {"client_acc_mean": acc.mean(), "client_acc_std": acc.std(unbiased=False),
                "client_acc_min": acc.min(), "client_acc_p10": torch.quantile(acc, 0.1)}
    for key, value in expected.items():
        assert got[key] == pytest.approx(float(value), rel=1e-12, abs=1e-15), key


def test_holdout_one_rank_equals_two_ranks_and_resume(tmp_path, small_config):
    one, two = one_and_two(small_config, tmp_path, *HOLDOUT)
    keys = STATISTICS + ("test_acc",)
    rows = [{k: r[k] for k in keys} for r in metrics(tmp_path / "one") if "test_acc" in r]
    assert len(rows) == 2 and rows == [{k: r[k] for k in keys} for r in metrics(tmp_path / "two") if "test_acc" in r]
    assert one["model_sha256"] == two["model_sha256"] and one["final_client_acc"] == two["final_client_acc"]
    plain = train_ok(small_config, f"output.dir={tmp_path / 'plain'}", "eval.clients=true")
    assert plain["model_sha256"] != one["model_sha256"]  # the held-out samples were not trained on
    # Stopped after round 4 and resumed: the same split, the same run; the split may not change.
    train_ok(small_config, f"output.dir={tmp_path / 'res'}", *HOLDOUT, "train.rounds=4")
    proc = run_cli(["train", "--resume", str(tmp_path / "res"), "train.rounds=6", "eval.client_holdout=0.5"])
    assert proc.returncode != 0 and "eval.client_holdout" in proc.stderr
    resumed = train_ok(small_config, "train.rounds=6", resume=str(tmp_path / "res"))
    assert resumed["model_sha256"] == one["model_sha256"] and resumed["final_client_acc"] == one["final_client_acc"]


@pytest.mark.parametrize("override, key", [("eval.client_holdout=1", "eval.client_holdout"),
                                           ("eval.client_holdout=0", "eval.client_holdout"),
                                           ("eval.clients=false", "eval.clients=true")])
def test_bad_holdout_is_refused_before_work(tmp_path, small_config, override, key):
    proc = run_cli(["train", str(small_config), f"output.dir={tmp_path / 'r'}", *HOLDOUT, override])
    assert proc.returncode == 2 and key in proc.stderr, proc.stderr
    assert not (tmp_path / "r").exists()

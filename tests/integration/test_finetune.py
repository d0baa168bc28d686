"""eval.finetune_epochs ("FedAvg + fine-tuning", FedBABU's baseline): under eval.clients each client
fine-tunes the global model of a non-personalised method on its own training data before it is scored.
Recomputed independently with torch.optim.SGD, global model and test_acc untouched, 1 rank == 2 ranks ==
stopped-and-resumed, refused for personalised methods and without eval.clients. docs/outputs.md."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import metrics, one_and_two, run_cli, train_ok

STATISTICS = ("client_acc_mean", "client_acc_std", "client_acc_min", "client_acc_p10")
# Momentum, weight decay and a cosine lr, so that the optimizer and "the lr of the last round" are checked.
OPTIMIZER = ["train.momentum=0.5", "train.weight_decay=0.001", "train.lr_schedule=cosine", "train.lr_min=0.01"]


def _trainer(tmp_path, name, *overrides):
    from conftest import build_trainer, write_config

    return build_trainer(write_config(tmp_path / "small.yaml"), tmp_path / name, *overrides)


class _Counts:
    """Stands in for the eval StatBuffer: keeps what add_client_counts adds (per-client int counts)."""

    def __init__(self):
        self.added = {}

    def add(self, name, value):
        self.added[name] = value.clone()


def _client_correct(trainer) -> torch.Tensor:
    from distfl.federation.client_eval import add_client_counts

    counts = _Counts()
    add_client_counts(trainer, counts)
    return counts.added["client_correct"]


def _independent_correct(trainer, epochs: int, lr: float, momentum=None, weight_decay=None) -> torch.Tensor:
    """Each client's correct count on its test set after `epochs` epochs of torch.optim.SGD from the
    global model on its training indices, in the order drawn from the generator keyed by (seed, client),
    written without distfl's training loop."""
    from distfl.federation.client_eval import _FINETUNE_STREAM
    from distfl.models import build_model

    cfg, data = trainer.cfg, trainer.data
    correct = []
    for client, test_idx in enumerate(trainer.client_test):
        module = build_model(cfg.model, data.input_shape, data.num_classes)
        with torch.no_grad():
            offset = 0
            for p in module.parameters():
                p.copy_(trainer.global_params[offset : offset + p.numel()].view_as(p))
                offset += p.numel()
        opt = torch.optim.SGD(module.parameters(), lr=lr,
                              momentum=cfg.train.momentum if momentum is None else momentum,
                              weight_decay=cfg.train.weight_decay if weight_decay is None else weight_decay)
        indices = trainer.client_indices[client]
        torch.manual_seed(int(np.random.SeedSequence([cfg.seed, _FINETUNE_STREAM, client]).generate_state(1)[0]))
        module.train()
        for _ in range(epochs):
            order = indices[torch.randperm(len(indices))]
            for start in range(0, len(order), cfg.train.batch_size):
                idx = order[start : start + cfg.train.batch_size]
                opt.zero_grad()
                F.cross_entropy(module(data.train_x[idx]), data.train_y[idx]).backward()
                opt.step()
        module.eval()
        with torch.no_grad():
            hits = module(trainer.client_test_x[test_idx]).argmax(1) == trainer.client_test_y[test_idx]
        correct.append(int(hits.sum()))
    return torch.tensor(correct, dtype=torch.int64)


@pytest.mark.parametrize("method", [
    ["algorithm.name=fedavg", "eval.finetune_epochs=2"],
    # FedProx's proximal term is not part of the fine-tuning: plain SGD for every method.
    ["algorithm.name=fedprox", "algorithm.mu=0.5", "eval.finetune_epochs=2"],
    # FedBABU's own evaluation is the same fine-tuning (one code path), here of its frozen-head model.
    ["algorithm.name=fedbabu", "algorithm.finetune_epochs=2"],
], ids=["fedavg", "fedprox", "fedbabu"])
def test_finetuned_client_counts_recomputed_with_torch_sgd(tmp_path, method):
    """eval.finetune_optimizer=train: the lr of the last round, train.momentum and weight_decay (the
    behaviour before the key existed)."""
    from distfl.federation.schedule import round_lr

    trainer = _trainer(tmp_path, "r", "eval.clients=true", "eval.finetune_optimizer=train", *OPTIMIZER, *method)
    for t in (1, 2, 3):
        trainer.run_round(t)
    lr = round_lr(trainer.cfg.train, 3, trainer.cfg.train.rounds)
    assert lr != trainer.cfg.train.lr  # the last round's lr, not train.lr
    got = _client_correct(trainer)
    expected = _independent_correct(trainer, 2, lr)
    assert torch.equal(got, expected)
    assert not torch.equal(got, _independent_correct(trainer, 0, lr))  # fine-tuning changed the scores


@pytest.mark.parametrize("method", [
    ["algorithm.name=fedavg", "eval.finetune_epochs=2"],
    ["algorithm.name=fedbabu", "algorithm.finetune_epochs=2"],
], ids=["fedavg", "fedbabu"])
def test_own_finetuning_optimizer_is_fedbabus_protocol_recomputed_with_torch_sgd(tmp_path, method):
    """The default eval.finetune_optimizer=own: torch.optim.SGD at eval.finetune_lr with
    eval.finetune_momentum and no weight decay, whatever train.* says (its momentum, weight decay and lr
    schedule are set here and must not leak in); the defaults are FedBABU's lr 1e-3 and momentum 0.9."""
    trainer = _trainer(tmp_path, "r", "eval.clients=true", *OPTIMIZER, *method)
    assert (trainer.cfg.eval.finetune_optimizer, trainer.cfg.eval.finetune_lr,
            trainer.cfg.eval.finetune_momentum) == ("own", 0.001, 0.9)
    for t in (1, 2, 3):
        trainer.run_round(t)
    trainer.cfg.eval.finetune_lr = 0.05  # large enough that two epochs change the scores of these clients
    got = _client_correct(trainer)
    assert torch.equal(got, _independent_correct(trainer, 2, 0.05, momentum=0.9, weight_decay=0.0))
    assert not torch.equal(got, _independent_correct(trainer, 2, 0.05))  # train.momentum / weight_decay differ


def test_a_run_saved_before_the_optimizer_key_resumes_with_the_train_optimizer(tmp_path, small_config):
    """A saved config that predates eval.finetune_optimizer ran with the train optimizer: resumed, it
    goes on with it (its per-client statistics are those of an uninterrupted train-optimizer run)."""
    import yaml

    args = ["eval.clients=true", "eval.finetune_epochs=2", "train.momentum=0.5"]
    whole = train_ok(small_config, f"output.dir={tmp_path / 'whole'}", *args, "eval.finetune_optimizer=train")
    own = train_ok(small_config, f"output.dir={tmp_path / 'own'}", *args)
    train_ok(small_config, f"output.dir={tmp_path / 'old'}", *args, "eval.finetune_optimizer=train", "train.rounds=4")
    saved = yaml.safe_load((tmp_path / "old" / "config.yaml").read_text())
    del saved["eval"]["finetune_optimizer"]  # as distfl wrote it before the key
    (tmp_path / "old" / "config.yaml").write_text(yaml.safe_dump(saved, sort_keys=False))
    resumed = train_ok(small_config, "train.rounds=6", resume=str(tmp_path / "old"))
    assert resumed["final_client_acc"] == whole["final_client_acc"] != own["final_client_acc"]


def test_finetuning_leaves_the_global_model_and_test_acc_alone(tmp_path):
    """In process: the same global model, test_acc and test_loss with and without fine-tuning, and the
    worker's fine-tuning never writes into the global parameters."""
    trainer = _trainer(tmp_path, "r", "eval.clients=true", "eval.finetune_epochs=2", *OPTIMIZER)
    for t in (1, 2, 3):
        trainer.run_round(t)
    params, buffers = trainer.global_params.clone(), trainer.global_buffers.clone()
    tuned = trainer.evaluate_round(clients=True)
    assert torch.equal(params, trainer.global_params) and torch.equal(buffers, trainer.global_buffers)
    trainer.cfg.eval.finetune_epochs = 0
    plain = trainer.evaluate_round(clients=True)
    assert (tuned["test_acc"], tuned["test_loss"]) == (plain["test_acc"], plain["test_loss"])
    assert tuned["client_acc_mean"] > plain["client_acc_mean"]  # these clients gain from their own data


def test_one_rank_equals_two_ranks_equals_resumed_and_only_client_scores_change(tmp_path, small_config):
    """SCAFFOLD (client state, sticky placement; its correction needs state the fine-tuning does not
    read): per-client statistics of every evaluation bit for bit on 1 rank, on 2 ranks (gloo) and after
    a stop at round 4 and a resume; fine-tuning off gives the same global model and test_acc rows, and
    other client statistics."""
    # A constant lr: a cosine schedule's rounds may not change on resume.
    args = ["algorithm.name=scaffold", "eval.clients=true", "train.momentum=0.5", "train.weight_decay=0.001"]
    one, two = one_and_two(small_config, tmp_path, *args, "eval.finetune_epochs=2")
    train_ok(small_config, f"output.dir={tmp_path / 'res'}", *args, "eval.finetune_epochs=2", "train.rounds=4")
    resumed = train_ok(small_config, "train.rounds=6", resume=str(tmp_path / "res"))
    off = train_ok(small_config, f"output.dir={tmp_path / 'off'}", *args)
    assert two["world_size"] == 2
    runs = {"one": one, "two": two, "res": resumed, "off": off}
    assert len({s["model_sha256"] for s in runs.values()}) == 1
    assert one["final_client_acc"] == two["final_client_acc"] == resumed["final_client_acc"]
    assert one["final_client_acc"] != off["final_client_acc"]
    assert [s["client_finetune_epochs"] for s in runs.values()] == [2, 2, 2, 0]
    # The evaluations of rounds 3 and 6 (the stopped run also evaluated its last round, 4).
    rows = {k: [r for r in metrics(tmp_path / k) if r["round"] in (3, 6)] for k in runs}
    clients = {k: [[r[key] for key in STATISTICS] for r in v] for k, v in rows.items()}
    globals_ = {k: [(r["test_acc"], r["test_loss"]) for r in v] for k, v in rows.items()}
    assert [len(v) for v in clients.values()] == [2, 2, 2, 2]
    assert clients["one"] == clients["two"] == clients["res"]
    assert all(a != b for a, b in zip(clients["one"], clients["off"]))
    assert globals_["one"] == globals_["two"] == globals_["res"] == globals_["off"]


def test_summary_records_the_fine_tuning_of_every_kind_of_scoring(tmp_path, small_config):
    babu = train_ok(small_config, f"output.dir={tmp_path / 'babu'}", "train.rounds=1", "eval.clients=true",
                    "algorithm.name=fedbabu", "algorithm.finetune_epochs=3")
    per = train_ok(small_config, f"output.dir={tmp_path / 'per'}", "train.rounds=1", "eval.clients=true",
                   "algorithm.name=fedper")
    none = train_ok(small_config, f"output.dir={tmp_path / 'none'}", "train.rounds=1")
    assert (babu["client_finetune_epochs"], per["client_finetune_epochs"], none["client_finetune_epochs"]) == (3, 0, None)


@pytest.mark.parametrize("overrides, says", [
    (["eval.finetune_epochs=2"], "set eval.clients=true"),
    (["eval.clients=true", "eval.finetune_epochs=-1"], "eval.finetune_epochs must be >= 0"),
    (["eval.clients=true", "eval.finetune_epochs=2", "algorithm.name=fedbabu"], "algorithm.options.finetune_epochs"),
    (["eval.clients=true", "eval.finetune_epochs=2", "algorithm.name=ditto"], "is personalised"),
    (["eval.clients=true", "eval.finetune_epochs=2", "algorithm.name=own_personal:Mine"], "is personalised"),
])
def test_refused_before_any_work(tmp_path, small_config, monkeypatch, overrides, says):
    (tmp_path / "own_personal.py").write_text(
        "from distfl import Algorithm\n\n\nclass Mine(Algorithm):\n    personalised = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    run = tmp_path / "r"
    proc = run_cli(["train", str(small_config), f"output.dir={run}", *overrides])
    assert proc.returncode == 2, proc.stderr
    assert says in proc.stderr and "eval.finetune_epochs" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not run.exists()


# lr 0.5: test_acc peaks at round 4 of 6 (measured 0.254, then 0.17 and 0.232), so the best round's model
# is neither the first nor the last evaluated.
BEST = ["eval.every=1", "eval.clients=true", "eval.finetune_epochs=1", "train.lr=0.5"]


def test_finetuning_from_the_best_round_scores_that_rounds_model(tmp_path, small_config):
    """eval.finetune_from=best: after round 6 the clients fine-tune round 4's global model (the best by
    test_acc), so their statistics are those of a run stopped at round 4 (fine-tuning its last model), not
    those of round 6's model; the same on 2 ranks and after a stop at round 5 and a resume (the best model
    comes back from the checkpoint)."""
    best = train_ok(small_config, f"output.dir={tmp_path / 'best'}", *BEST, "eval.finetune_from=best")
    assert best["best_round"] == best["client_model_round"] == 4
    at_best = train_ok(small_config, f"output.dir={tmp_path / 'at4'}", *BEST, "train.rounds=4")
    last = train_ok(small_config, f"output.dir={tmp_path / 'last'}", *BEST)
    assert last["client_model_round"] is None and at_best["final_test_acc"] == best["best_test_acc"]
    assert best["final_client_acc"] == at_best["final_client_acc"]
    assert best["final_client_acc"] != last["final_client_acc"]  # the last round's model scores otherwise
    assert best["model_sha256"] == last["model_sha256"] and best["final_test_acc"] == last["final_test_acc"]
    rows = metrics(tmp_path / "best")
    assert [r["client_model_round"] for r in rows] == [1, 1, 3, 4, 4, 4]  # the best so far at each evaluation
    two = train_ok(small_config, f"output.dir={tmp_path / 'two'}", *BEST, "eval.finetune_from=best", nproc=2)
    train_ok(small_config, f"output.dir={tmp_path / 'res'}", *BEST, "eval.finetune_from=best", "train.rounds=5")
    resumed = train_ok(small_config, "train.rounds=6", resume=str(tmp_path / "res"))
    assert two["final_client_acc"] == resumed["final_client_acc"] == best["final_client_acc"]
    assert [r["client_acc_mean"] for r in metrics(tmp_path / "res")] == [r["client_acc_mean"] for r in rows]


def test_fedbabu_finetunes_the_best_rounds_model(tmp_path, small_config):
    """FedBABU keeps nothing per client: its fine-tuning may start from the best round's body and head."""
    args = [*BEST[:2], "algorithm.name=fedbabu", "algorithm.options.finetune_epochs=1", "train.lr=0.5"]
    best = train_ok(small_config, f"output.dir={tmp_path / 'best'}", *args, "eval.finetune_from=best")
    at_best = train_ok(small_config, f"output.dir={tmp_path / 'at'}", *args, f"train.rounds={best['best_round']}")
    assert best["client_model_round"] == best["best_round"] < 6
    assert best["final_client_acc"] == at_best["final_client_acc"]


@pytest.mark.parametrize("overrides, says", [
    (["eval.finetune_epochs=0", "eval.clients=true"], "nothing fine-tunes it"),
    (["eval.finetune_epochs=1"], "set eval.clients=true"),
    (["eval.finetune_epochs=0", "eval.clients=true", "algorithm.name=ditto"], "from its own state"),
    (["eval.finetune_epochs=1", "eval.clients=true", "calibration.method=ffc"], "changes the final model"),
    (["eval.finetune_epochs=1", "eval.clients=true", "eval.finetune_from=latest"], "did you mean"),
])
def test_finetune_from_best_refused_before_any_work(tmp_path, small_config, overrides, says):
    run = tmp_path / "r"
    proc = run_cli(["train", str(small_config), f"output.dir={run}", "eval.finetune_from=best", *overrides])
    assert proc.returncode == 2 and says in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not run.exists()


@pytest.mark.parametrize("method", [["algorithm.name=fedavg", "eval.finetune_epochs=1"],
                                    ["algorithm.name=fedbabu", "algorithm.finetune_epochs=1"]], ids=["fedavg", "fedbabu"])
def test_fine_tuned_clients_are_built_by_the_rounds_client_path(tmp_path, monkeypatch, method):
    """Per-client fine-tuning (eval.finetune_epochs, FedBABU's evaluated model) trains a client built by
    the same `client_run` as a round's clients (federation/round.py): one per client, outside any cohort
    (weight 0), stepping with the fine-tuning's train config."""
    from distfl.federation.client_eval import finetune_train_config
    from distfl.federation.round import RoundEngine

    trainer = _trainer(tmp_path, "r", "eval.clients=true", *method)
    trainer.run_round(1)
    built, client_run = [], RoundEngine.client_run

    def recorded(self, client_id, round_idx, cohort, **kwargs):
        run = client_run(self, client_id, round_idx, cohort, **kwargs)
        built.append((client_id, cohort, run.weight, run.sgd.train_cfg))
        return run

    monkeypatch.setattr(RoundEngine, "client_run", recorded)
    _client_correct(trainer)
    clients = len(trainer.population)
    assert [b[0] for b in built] == list(range(clients))
    assert all(b[1] is None and b[2] == 0.0 and b[3] == finetune_train_config(trainer.cfg) for b in built)

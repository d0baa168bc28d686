"""Personalised FL (fedper, fedrep, fedbabu, ditto, apfl): each paper's identity recomputed independently,
per-client evaluation of each client's own model, 1 rank == 2 ranks == stopped-and-resumed, and the
compositions that make no sense refused before any work. docs/algorithms/{fedper,fedrep,fedbabu,ditto,apfl}.md."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import build_trainer, metrics, run_cli, train_ok, write_config
from distfl.checkpoint import load_tensors

PERSONALISED = ["fedper", "fedrep", "fedbabu", "ditto", "apfl"]
STATISTICS = ("client_acc_mean", "client_acc_std", "client_acc_min", "client_acc_p10")
# FedRep's default 10 head epochs are the paper's; 2 keep the tests fast.
FAST = {"fedrep": ["algorithm.head_epochs=2"]}


def _trainer(tmp_path, name, *overrides, config=None):
    return build_trainer(config or write_config(tmp_path / "small.yaml"), tmp_path / name, *overrides)


def _record(trainer) -> dict:
    """client id -> its model after local training (the worker at client_statistics), for every round run."""
    seen = {}
    inner = trainer.algorithm.client_statistics

    def recording(run, worker, stats):
        seen.setdefault(run.round_idx, {})[run.client_id] = worker.params.detach().clone()
        inner(run, worker, stats)

    trainer.algorithm.client_statistics = recording
    return seen


def _initial_model(trainer):
    """The run's initial model, built again from the seed (as the runner builds it)."""
    from distfl.models import build_model

    torch.manual_seed(trainer.cfg.seed)
    return build_model(trainer.cfg.model, trainer.data.input_shape, trainer.data.num_classes)


def _flat(module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in module.parameters()])


def _head_mask(trainer) -> torch.Tensor:
    mask = torch.zeros(trainer.worker.num_params, dtype=torch.bool)
    for name, where in trainer.worker.param_slices.items():
        mask[where] = name.startswith("head.")
    return mask


def _accuracies(trainer, load) -> torch.Tensor:
    """Each client's accuracy on its own test set, with the model `load(client, worker)` puts in the worker."""
    worker, accuracies = trainer.worker, []
    for client, idx in enumerate(trainer.client_test):
        worker.load(trainer.global_params, trainer.global_buffers)
        load(client, worker)
        worker.module.eval()
        with torch.no_grad():
            hits = worker.module(trainer.client_test_x[idx]).argmax(1) == trainer.client_test_y[idx]
        accuracies.append(float(hits.double().mean()))
    return torch.tensor(accuracies, dtype=torch.float64)


def _statistics(acc: torch.Tensor) -> dict:
    return {"client_acc_mean": float(acc.mean()), "client_acc_std": float(acc.std(unbiased=False)),
            "client_acc_min": float(acc.min()), "client_acc_p10": float(torch.quantile(acc, 0.1))}


def _plain_sgd(module, batches, lr, prox=None, lam=0.0):
    """Plain local SGD of an nn.Module, written independently of distfl's flat loop: p <- p - lr (grad +
    lam (p - prox_p))."""
    for x, y in batches:
        module.zero_grad(set_to_none=True)
        module.loss(module(x), y).backward()
        with torch.no_grad():
            for i, p in enumerate(module.parameters()):
                grad = p.grad if prox is None else p.grad.add(p - prox[i], alpha=lam)
                p.add_(grad, alpha=-lr)


def _load_flat(module, flat):
    with torch.no_grad():
        offset = 0
        for p in module.parameters():
            p.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()


def _module_params_of(trainer, flat):
    module = _initial_model(trainer)
    _load_flat(module, flat)
    return list(module.parameters())


# ---- Ditto -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("lam", [0.0, 0.5])
def test_ditto_personal_model_is_local_sgd_of_the_proximal_objective(tmp_path, lam):
    """v_k after each round it is sampled: local SGD from w^0 on its own batches of grad F_k(v) +
    lam (v - w^t), recomputed with a plain nn.Module; lam = 0 is purely local training."""
    from distfl.federation.local import local_batches
    from distfl.federation.population import client_seed

    trainer = _trainer(tmp_path, "ditto", "algorithm.name=ditto", f"algorithm.ditto_lambda={lam}")
    cfg = trainer.cfg
    rounds, globals_ = 4, {}
    for t in range(1, rounds + 1):
        globals_[t] = trainer.global_params.clone()
        trainer.run_round(t)
    sampled = 0
    for client in range(len(trainer.population)):
        module = _initial_model(trainer)
        visited = False
        for t in range(1, rounds + 1):
            if client not in trainer.population.cohort(cfg.seed, t, cfg.train.clients_per_round):
                continue
            visited = True
            indices = trainer.client_indices[client]
            prox = [p.detach().clone() for p in _module_params_of(trainer, globals_[t])] if lam else None
            torch.manual_seed(client_seed(cfg.seed, t, client))
            list(local_batches(trainer.data, indices, cfg.train))  # the global pass's batches come first
            _plain_sgd(module, local_batches(trainer.data, indices, cfg.train), cfg.train.lr, prox, lam)
        state = trainer.store.peek(client)
        if not visited:
            assert state is None
            continue
        sampled += 1
        assert torch.equal(state["v"], _flat(module)), (client, lam)
    assert sampled >= 6


def test_ditto_lambda_just_below_the_bound_runs_finite(tmp_path, small_config):
    """lr x lambda = 1.9 < 2 is accepted and its personal models stay finite (the factor 1 - lr lambda is
    -0.9); the run completes."""
    s = train_ok(small_config, f"output.dir={tmp_path / 'r'}", "algorithm.name=ditto", "algorithm.ditto_lambda=19",
                 "eval.clients=true", "train.rounds=3")
    assert s["status"] == "completed" and s["final_client_acc"] is not None
    states = _client_states(tmp_path / "r")
    assert states and all(bool(torch.isfinite(state["v"]).all()) for state in states.values())


def test_ditto_non_finite_personal_model_stops_the_run_naming_it(tmp_path):
    """A personal model that becomes non-finite (here: a client's stored v_k made NaN) stops the round
    as diverged with the reason, while the global pass is finite; the global model is left as it was."""
    from distfl.errors import DivergenceError

    trainer = _trainer(tmp_path, "ditto", "algorithm.name=ditto")
    cfg = trainer.cfg
    trainer.run_round(1)
    cohort = trainer.population.cohort(cfg.seed, 2, cfg.train.clients_per_round)
    seen = [c for c in cohort if trainer.store.peek(c) is not None]
    assert seen  # a client of round 2 that already has its v_k
    state = trainer.store.peek(seen[0])
    trainer.store.put(seen[0], {**state, "v": torch.full_like(state["v"], float("nan"))})
    before = trainer.global_params.clone()
    with pytest.raises(DivergenceError, match=r"personal model v_k of 1 client\(s\) became non-finite"):
        trainer.run_round(2)
    assert torch.equal(trainer.global_params, before)


def test_ditto_global_model_is_fedavg_bit_for_bit(tmp_path, small_config):
    avg = train_ok(small_config, f"output.dir={tmp_path / 'avg'}")
    ditto = train_ok(small_config, f"output.dir={tmp_path / 'ditto'}", "algorithm.name=ditto", "algorithm.ditto_lambda=1")
    assert avg["model_sha256"] == ditto["model_sha256"]
    rows = [metrics(tmp_path / name) for name in ("avg", "ditto")]
    assert [(r["train_loss"], r.get("test_acc")) for r in rows[0]] == [(r["train_loss"], r.get("test_acc")) for r in rows[1]]


# ---- FedPer ----------------------------------------------------------------------------------------

def test_fedper_first_round_body_is_fedavgs_and_heads_stay_with_the_clients(tmp_path):
    """Round 1: every client starts from the same (initial) head, so FedPer's aggregated body is FedAvg's
    bit for bit; the global head stays the initial one, and each client keeps the head it trained.
    Round 2: a client starts from its own head, so the body now departs from FedAvg's."""
    avg, per = _trainer(tmp_path, "avg"), _trainer(tmp_path, "per", "algorithm.name=fedper")
    head = _head_mask(per)
    initial = per.global_params.clone()
    seen_avg, seen_per = _record(avg), _record(per)
    avg.run_round(1)
    per.run_round(1)
    assert torch.equal(per.global_params[~head], avg.global_params[~head])
    assert torch.equal(per.global_params[head], initial[head])
    assert not torch.equal(avg.global_params[head], initial[head])
    cohort = sorted(seen_per[1])
    heads = [per.store.peek(c)["head"] for c in cohort]
    for client, own in zip(cohort, heads):
        assert torch.equal(own, seen_avg[1][client][head])
    assert all(not torch.equal(a, b) for i, a in enumerate(heads) for b in heads[i + 1 :])

    # Round 2: a returning client trains from its own head; its model is the one recomputed from it.
    inner = per.algorithm.begin_client
    started = {}

    def begin(run, worker):
        inner(run, worker)
        started[run.client_id] = worker.params.clone()

    per.algorithm.begin_client = begin
    stored = {c: per.store.peek(c) for c in range(len(per.population))}
    avg.run_round(2)
    per.run_round(2)
    assert any(stored[c] for c in started) and not all(stored[c] for c in started)
    for client, start in started.items():
        own = stored[client]["head"] if stored[client] else initial[head]
        assert torch.equal(start[head], own)
    assert not torch.equal(per.global_params[~head], avg.global_params[~head])
    assert torch.equal(per.global_params[head], initial[head])


# ---- FedRep ----------------------------------------------------------------------------------------

def test_fedrep_without_body_epochs_leaves_the_body_at_its_initialisation(tmp_path):
    trainer = _trainer(tmp_path, "rep", "algorithm.name=fedrep", "algorithm.head_epochs=2", "algorithm.body_epochs=0")
    head = _head_mask(trainer)
    initial = trainer.global_params.clone()
    seen = _record(trainer)
    for t in (1, 2, 3):
        trainer.run_round(t)
    assert torch.equal(trainer.global_params, initial)  # body: zero updates; head: never aggregated
    for clients in seen.values():
        for params in clients.values():
            assert torch.equal(params[~head], initial[~head])
            assert not torch.equal(params[head], initial[head])
    for client, params in seen[3].items():
        assert torch.equal(trainer.store.peek(client)["head"], params[head])


def test_fedrep_trains_the_head_first_then_the_body_with_the_new_head(tmp_path):
    """One client, one round, recomputed with plain SGD: head_epochs passes on the head alone, then
    body_epochs on the body alone, the batches continuing the client's stream."""
    from distfl.federation.local import local_batches
    from distfl.federation.population import client_seed

    trainer = _trainer(tmp_path, "rep", "algorithm.name=fedrep", "algorithm.head_epochs=2", "algorithm.body_epochs=1")
    cfg = trainer.cfg
    seen = _record(trainer)
    trainer.run_round(1)
    client = min(seen[1])
    module = _initial_model(trainer)
    torch.manual_seed(client_seed(cfg.seed, 1, client))
    indices = trainer.client_indices[client]
    for epochs, part in ((2, module.head), (1, module.features)):
        frozen = [p for p in module.parameters() if all(p is not q for q in part.parameters())]
        for p in frozen:
            p.requires_grad_(False)
        for x, y in local_batches(trainer.data, indices, cfg.train, epochs=epochs):
            module.zero_grad(set_to_none=True)
            module.loss(module(x), y).backward()
            with torch.no_grad():
                for p in part.parameters():
                    p.add_(p.grad, alpha=-cfg.train.lr)
        for p in frozen:
            p.requires_grad_(True)
    assert torch.equal(seen[1][client], _flat(module))


def test_fedrep_with_only_body_epochs_trains_the_global_model_of_fedbabu(tmp_path, small_config):
    """head_epochs=0, body_epochs=1: the body trains one epoch with the head frozen at its initialisation,
    which is FedBABU's training: the same global model, bit for bit."""
    rep = train_ok(small_config, f"output.dir={tmp_path / 'rep'}", "algorithm.name=fedrep",
                   "algorithm.head_epochs=0", "algorithm.body_epochs=1")
    babu = train_ok(small_config, f"output.dir={tmp_path / 'babu'}", "algorithm.name=fedbabu")
    assert rep["model_sha256"] == babu["model_sha256"]


# ---- FedBABU ---------------------------------------------------------------------------------------

def test_fedbabu_never_changes_the_head_in_training(tmp_path):
    trainer = _trainer(tmp_path, "babu", "algorithm.name=fedbabu", "train.momentum=0.9", "train.weight_decay=0.01")
    head = _head_mask(trainer)
    initial = trainer.global_params.clone()
    seen = _record(trainer)
    for t in (1, 2, 3):
        trainer.run_round(t)
    assert torch.equal(trainer.global_params[head], initial[head])
    assert not torch.equal(trainer.global_params[~head], initial[~head])
    for clients in seen.values():
        for params in clients.values():
            assert torch.equal(params[head], initial[head]) and not torch.equal(params[~head], initial[~head])


# ---- APFL ------------------------------------------------------------------------------------------

def test_apfl_with_alpha_zero_is_fedavg(tmp_path, small_config):
    """alpha = 0 (fixed): vbar = w, so the global model and every client's scored model are FedAvg's, and
    v never moves from w^0. (The global model is FedAvg's for any alpha: w's steps never see v.)"""
    args = ("eval.clients=true", "eval.every=1")
    avg = train_ok(small_config, f"output.dir={tmp_path / 'avg'}", *args)
    apfl = train_ok(small_config, f"output.dir={tmp_path / 'apfl'}", *args, "algorithm.name=apfl",
                    "algorithm.apfl_alpha=0", "algorithm.apfl_adaptive=false")
    mixed = train_ok(small_config, f"output.dir={tmp_path / 'mixed'}", *args, "algorithm.name=apfl")
    assert avg["model_sha256"] == apfl["model_sha256"] == mixed["model_sha256"]
    keys = ("train_loss", "test_acc") + STATISTICS
    rows = {name: [{k: r[k] for k in keys} for r in metrics(tmp_path / name)] for name in ("avg", "apfl", "mixed")}
    assert rows["avg"] == rows["apfl"]
    assert [r["client_acc_mean"] for r in rows["mixed"]] != [r["client_acc_mean"] for r in rows["avg"]]


def test_apfl_local_step_recomputed(tmp_path):
    """One client's round recomputed with plain modules: per batch, from (w, v, alpha):
    g = grad f(alpha v + (1 - alpha) w); v -= lr alpha g; alpha -= lr_alpha <v - w, g>, clipped; w -= lr grad f(w)."""
    from distfl.federation.local import local_batches
    from distfl.federation.population import client_seed

    trainer = _trainer(tmp_path, "apfl", "algorithm.name=apfl", "algorithm.apfl_alpha_lr=0.5")
    cfg = trainer.cfg
    seen = _record(trainer)
    trainer.run_round(1)
    client = min(seen[1])
    w_module, mixed_module = _initial_model(trainer), _initial_model(trainer)
    w, v = _flat(w_module), _flat(w_module)
    alpha = torch.tensor(0.5)
    torch.manual_seed(client_seed(cfg.seed, 1, client))
    for x, y in local_batches(trainer.data, trainer.client_indices[client], cfg.train):
        _load_flat(mixed_module, alpha * v + (1 - alpha) * w)
        mixed_module.zero_grad(set_to_none=True)
        mixed_module.loss(mixed_module(x), y).backward()
        g = torch.cat([p.grad.reshape(-1) for p in mixed_module.parameters()])
        new_alpha = (alpha - 0.5 * torch.dot(v - w, g)).clamp(0, 1)
        v = v - (cfg.train.lr * alpha) * g
        alpha = new_alpha
        _plain_sgd(w_module, [(x, y)], cfg.train.lr)
        w = _flat(w_module)
    state = trainer.store.peek(client)
    assert torch.equal(seen[1][client], w)
    assert torch.equal(state["v"], v) and torch.equal(state["alpha"], alpha) and float(alpha) != 0.5


# ---- per-client evaluation scores the personal model -------------------------------------------------

def _personal_loader(trainer, name):
    """client -> the model it should be scored with, built here from its state (not by the method's hook)."""
    head = _head_mask(trainer)

    def load(client, worker):
        state = trainer.store.peek(client) if trainer.store is not None else None
        if not state:
            return
        if name in ("fedper", "fedrep"):
            worker.params[head] = state["head"]
        elif name == "ditto":
            worker.params.copy_(state["v"])
        elif name == "apfl":
            worker.params.copy_(state["alpha"] * state["v"] + (1 - state["alpha"]) * trainer.global_params)

    return load


@pytest.mark.parametrize("name", PERSONALISED)
@pytest.mark.parametrize("split", ["test", "holdout"])
def test_client_eval_scores_each_clients_own_model(tmp_path, name, split):
    extra = ["algorithm.finetune_epochs=0"] if name == "fedbabu" else FAST.get(name, [])
    trainer = _trainer(tmp_path, name, f"algorithm.name={name}", "eval.clients=true", f"eval.client_split={split}",
                       *extra)
    for t in (1, 2, 3):
        trainer.run_round(t)
    got = trainer.evaluate_round(clients=True)
    global_stats = _statistics(_accuracies(trainer, lambda client, worker: None))
    if name == "fedbabu":
        # Without fine-tuning a client's model is the global one; with it, each client's own.
        for key in STATISTICS:
            assert got[key] == pytest.approx(global_stats[key], rel=1e-12, abs=1e-15)
        trainer.algorithm.options.finetune_epochs = 2
        got = trainer.evaluate_round(clients=True)
        assert got["client_acc_mean"] != global_stats["client_acc_mean"]
        return
    expected = _statistics(_accuracies(trainer, _personal_loader(trainer, name)))
    for key in STATISTICS:
        assert got[key] == pytest.approx(expected[key], rel=1e-12, abs=1e-15), key
    assert expected != global_stats  # scoring the global model would fail the assertions above
    assert (got["test_acc"], got["test_loss"]) == trainer.evaluate()


def test_fedbabu_fine_tuning_recomputed(tmp_path):
    """A client's scored model: finetune_epochs epochs of plain SGD of the whole global model on its own
    training data, batches from the generator keyed by (seed, client), the lr of the last round."""
    from distfl.federation.client_eval import _FINETUNE_STREAM
    from distfl.federation.local import local_batches

    trainer = _trainer(tmp_path, "babu", "algorithm.name=fedbabu", "eval.clients=true", "algorithm.finetune_epochs=3",
                       "eval.finetune_optimizer=train")
    trainer.run_round(1)
    got = trainer.evaluate_round(clients=True)
    cfg = trainer.cfg

    def load(client, worker):
        module = _initial_model(trainer)
        _load_flat(module, trainer.global_params)
        torch.manual_seed(int(np.random.SeedSequence([cfg.seed, _FINETUNE_STREAM, client]).generate_state(1)[0]))
        _plain_sgd(module, local_batches(trainer.data, trainer.client_indices[client], cfg.train, epochs=3), cfg.train.lr)
        worker.params.copy_(_flat(module))

    expected = _statistics(_accuracies(trainer, load))
    for key in STATISTICS:
        assert got[key] == pytest.approx(expected[key], rel=1e-12, abs=1e-15), key


# ---- 1 rank == 2 ranks == stopped and resumed ------------------------------------------------------------

def _client_states(run_dir) -> dict:
    from distfl import checkpoint

    latest = checkpoint.checkpoints_dir(run_dir) / (checkpoint.checkpoints_dir(run_dir) / "latest").read_text().strip()
    return {path.stem: load_tensors(path) for path in sorted((latest / "clients").glob("*.pt"))}


def assert_clients_scored_with(trainer, load) -> dict:
    """eval.clients' statistics are those of each client scored with the model `load(client, worker)` puts
    in the worker (recomputed here), and differ from the global model's. Returns the evaluation."""
    got = trainer.evaluate_round(clients=True)
    expected = _statistics(_accuracies(trainer, load))
    for key in STATISTICS:
        assert got[key] == pytest.approx(expected[key], rel=1e-12, abs=1e-12), key
    assert expected != _statistics(_accuracies(trainer, lambda client, worker: None))
    return got


def personal_one_two_resumed(config, tmp_path, args, key: str, two=()) -> dict:
    """A personalised method (`args`) on 1 rank, on 2 ranks (with `two`) and stopped at round 4 then
    resumed: the same global model, per-client statistics every evaluation and final, and every client's
    state `key` in the final checkpoint, bit for bit. Returns the 1-rank summary."""
    one = train_ok(config, f"output.dir={tmp_path / 'one'}", *args)
    on_two = train_ok(config, f"output.dir={tmp_path / 'two'}", *args, *two, nproc=2)
    train_ok(config, f"output.dir={tmp_path / 'res'}", *args, "train.rounds=4")
    resumed = train_ok(config, "train.rounds=6", resume=str(tmp_path / "res"))
    runs = {"one": one, "two": on_two, "res": resumed}
    assert on_two["world_size"] == 2 and len({s["model_sha256"] for s in runs.values()}) == 1
    assert one["final_client_acc"] is not None
    assert all(s["final_client_acc"] == one["final_client_acc"] for s in runs.values())
    keys = STATISTICS + ("test_acc", "train_loss", "clients_never_sampled")
    assert [{k: r.get(k) for k in keys} for r in metrics(tmp_path / "one")] == \
        [{k: r.get(k) for k in keys} for r in metrics(tmp_path / "two")]
    states = {k: _client_states(tmp_path / k) for k in runs}
    assert len(states["one"]) >= 6
    for k in ("two", "res"):
        assert states[k].keys() == states["one"].keys()
        assert all(torch.equal(s[key], states[k][c][key]) for c, s in states["one"].items()), k
    return one


# The 2-rank run keeps client state in memory on its hosting rank (sticky placement), or on disk with
# clients placed on any rank (balanced): both stores are covered, one 2-rank run per method (torchrun is slow).
TWO_RANKS = {"fedper": [], "ditto": [], "fedbabu": [],
             "fedrep": ["runtime.client_state=disk", "runtime.placement=balanced"],
             "apfl": ["runtime.client_state=disk", "runtime.placement=balanced"]}


@pytest.mark.parametrize("name", PERSONALISED)
def test_one_rank_equals_two_ranks_equals_resumed(tmp_path, small_config, name):
    """Global model, per-client statistics every evaluation, and every client's personal state in the
    final checkpoint: the same bits on 1 rank, on 2 ranks and after a stop at round 4 and a resume."""
    args = [f"algorithm.name={name}", "eval.clients=true", *FAST.get(name, [])]
    one = train_ok(small_config, f"output.dir={tmp_path / 'one'}", *args)
    two = train_ok(small_config, f"output.dir={tmp_path / 'two'}", *args, *TWO_RANKS[name], nproc=2)
    train_ok(small_config, f"output.dir={tmp_path / 'res'}", *args, "train.rounds=4")
    resumed = train_ok(small_config, "train.rounds=6", resume=str(tmp_path / "res"))
    runs = {"one": one, "two": two, "res": resumed}
    assert two["world_size"] == 2
    assert len({s["model_sha256"] for s in runs.values()}) == 1
    assert one["final_client_acc"] is not None
    assert all(s["final_client_acc"] == one["final_client_acc"] for s in runs.values())
    keys = STATISTICS + ("test_acc", "train_loss")
    rows = {k: [{key: r.get(key) for key in keys} for r in metrics(tmp_path / k)] for k in ("one", "two")}
    assert rows["one"] == rows["two"]
    states = {k: _client_states(tmp_path / k) for k in runs}
    if name == "fedbabu":
        assert all(not s for s in states.values())  # nothing kept per client
        return
    assert len(states["one"]) >= 6
    for k in ("two", "res"):
        assert states[k].keys() == states["one"].keys()
        for client, state in states["one"].items():
            assert state.keys() == states[k][client].keys()
            assert all(torch.equal(state[key], states[k][client][key]) for key in state), (k, client)


# ---- compositions refused --------------------------------------------------------------------------------

@pytest.mark.parametrize("overrides, says", [
    (["algorithm.name=fedper", "aggregation.fedbn=true", "model.name=resnet20", "data.synthetic_channels=3"],
     "aggregation.fedbn"),
    (["algorithm.name=fedrep", "model.head=sphere"], "model.head=linear"),
    (["algorithm.name=fedbabu", "model.head=fixed_random"], "model.head=linear"),
    (["algorithm.name=fedper", "model.head=sphere", "calibration.method=ffc"], "model.head=linear"),
    (["algorithm.name=fedrep", "train.local_epochs=2"], "algorithm.options.body_epochs"),
    (["algorithm.name=fedrep", "algorithm.options.head_epochs=0", "algorithm.options.body_epochs=0"], "trains nothing"),
    (["algorithm.name=apfl", "algorithm.options.alpha=1.5"], "algorithm.options.alpha must be in [0, 1]"),
    (["algorithm.name=ditto", "algorithm.options.lam=-1"], "algorithm.options.lam must be >= 0"),
    # lr x lambda >= 2: the explicit proximal step diverges (lr 0.1 in the small config; a warm-up's peak)
    (["algorithm.name=ditto", "algorithm.options.lam=1000"], "lr x (lam + weight_decay) >= 2"),
    (["algorithm.name=ditto", "algorithm.options.lam=20"], "algorithm.options.lam=20"),
    (["algorithm.name=ditto", "algorithm.options.lam=19", "train.weight_decay=1"], "train.weight_decay=1"),
    (["algorithm.name=ditto", "algorithm.options.lam=5", "train.lr=0.01", "train.lr_schedule=step",
      "train.lr_gamma=100", "train.lr_step_every=1"], "the largest lr of the schedule"),
    (["algorithm.name=apfl", "model.name=resnet20", "data.synthetic_channels=3"], "BatchNorm"),
    (["algorithm.name=ditto", "runtime.pack_size=2", "runtime.client_state=disk"], "local_training"),
    (["algorithm.name=fedbabu", "runtime.pack_size=2"], "local_training"),
])
def test_compositions_that_make_no_sense_are_refused_before_any_work(tmp_path, small_config, overrides, says):
    run = tmp_path / "r"
    proc = run_cli(["train", str(small_config), f"output.dir={run}", *overrides])
    assert proc.returncode == 2, proc.stderr
    assert says in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not run.exists()


@pytest.mark.parametrize("overrides", [
    ["algorithm.name=fedper", "server.optimizer=adam", "server.lr=0.01"],
    ["algorithm.name=ditto", "aggregation.mask=gma"],
    ["algorithm.name=apfl", "model.head=sphere"],
    ["algorithm.name=fedper", "runtime.pack_size=2", "runtime.client_state=disk"],
    ["algorithm.name=ditto", "model.name=resnet20", "data.synthetic_channels=3"],  # v keeps its own BatchNorm
])
def test_compositions_that_make_sense_run(tmp_path, small_config, overrides):
    s = train_ok(small_config, f"output.dir={tmp_path / 'r'}", "train.rounds=2", "eval.clients=true", *overrides)
    assert s["status"] == "completed" and s["final_client_acc"] is not None


def test_stopped_on_two_ranks_resumed_on_one(tmp_path, small_config):
    """Ditto's v_k, held in memory by two ranks, checkpointed one file per client, resumed by one rank."""
    args = ["algorithm.name=ditto", "eval.clients=true"]
    one = train_ok(small_config, f"output.dir={tmp_path / 'one'}", *args)
    train_ok(small_config, f"output.dir={tmp_path / 'two'}", *args, "train.rounds=4", nproc=2)
    resumed = train_ok(small_config, "train.rounds=6", resume=str(tmp_path / "two"))
    assert resumed["world_size"] == 1
    assert (resumed["model_sha256"], resumed["final_client_acc"]) == (one["model_sha256"], one["final_client_acc"])
    states = _client_states(tmp_path / "one"), _client_states(tmp_path / "two")
    assert states[0].keys() == states[1].keys()
    assert all(torch.equal(states[0][c]["v"], states[1][c]["v"]) for c in states[0])

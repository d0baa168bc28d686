"""Per-client evaluation (eval.clients): every client of the population scores the model it would use
on its own local test set (data/client_test.py: drawn from the test split, or with eval.client_split=holdout
held out of its own training data, un-augmented), beside the global model on the whole test set.

The model a client uses is the global model, with FedBN its own BatchNorm from its state (a client never
sampled yet has none and uses the global BatchNorm); for a personalised method (FedPer, FedRep, FedBABU,
Ditto, APFL) whatever its `load_evaluated_model` builds from the client's state, which may first
fine-tune on the client's training data (FedBABU). With eval.finetune_epochs > 0 (a method that is not
personalised) each client first fine-tunes that model for that many epochs of plain local SGD on its own
training data ("FedAvg + fine-tuning", FedBABU's baseline). Both fine-tunings run through
`train_evaluated_model`: batches from the torch RNG keyed by (seed, client), the same on every rank,
and the optimizer of eval.finetune_optimizer (`finetune_train_config`). Client c is evaluated on rank
c % world_size, the rank that holds its state under sticky placement (with runtime.client_state=disk
any rank can read it). Its correct and total counts go into one int slot each of the eval all_reduce,
so the statistics below are exact and identical on 1 or N ranks. `clients_never_sampled` counts the
clients no round up to the evaluated one has sampled (they are scored with the global model, or with
FedPer's / FedRep's initial head): from the cohorts' seeds alone, the same on every rank.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import torch

from ..data.client_test import client_test_sets
from ..data.natural import natural_test_sets
from ..data.tokens import hits, token_counts
from .aggregate import Segment, StatBuffer
from .local import seed_local_rng
from .population import DeviceIndices

_FINETUNE_STREAM = 5  # distinct from population.py's (1, 2) and client_test.py's (3, 4) streams

# metrics.jsonl keys, over the clients with a non-empty local test set: the unweighted statistics of the
# clients' accuracies, and the sample-weighted mean (all clients' test samples pooled: FedRep's and
# PFLlib's per-client mean)
STATISTICS = ("client_acc_mean", "client_acc_std", "client_acc_min", "client_acc_p10", "client_acc_weighted_mean")


def client_test_split(cfg, data, population, held, seed: int, device: torch.device):
    """Each client's local test set, as (indices per client, the x and y they index): its `held` out
    training samples (eval.client_split=holdout), its own test samples (partition.scheme=natural), or
    drawn from the test split with its label distribution (data/client_test.py)."""
    if held is not None:
        sets, x, y = held, data.train_x, data.train_y
    elif cfg.partition.scheme == "natural":  # each client's own test samples, as the source splits them
        sets, x, y = natural_test_sets(data.test_offsets), data.test_x, data.test_y
    else:
        sets = client_test_sets(population.class_counts, data.test_y.cpu().numpy(), cfg.eval.client_test_size, seed)
        x, y = data.test_x, data.test_y
    return DeviceIndices(sets, device), x, y  # each client's indices made when it is first scored


def client_segments(num_clients: int) -> list[Segment]:
    return [Segment("client_correct", num_clients, kind="int"), Segment("client_total", num_clients, kind="int")]


@torch.no_grad()
def add_client_counts(context, stats, model=None) -> None:
    """Evaluate this rank's clients and add their counts (the worker is left holding the last one).
    `model`: the (parameters, buffers) every client starts from (eval.finetune_from=best: the best round's
    evaluated model); None: the method's evaluation model of the global model."""
    worker, alg, ctx = context.worker, context.algorithm, context.ctx
    evaluated = alg.evaluation_model(context.global_params, context.global_buffers) if model is None else model
    origin = context.global_params if model is None else model[0]  # run.global_params of a fine-tuning
    num_clients = len(context.population)
    correct = torch.zeros(num_clients, dtype=torch.int64)
    total = torch.zeros(num_clients, dtype=torch.int64)
    batch = context.cfg.eval.batch_size
    tokens = getattr(context.data, "tokens", None)  # a next-token dataset counts tokens (data/tokens.py)
    for client in range(ctx.rank, num_clients, ctx.world_size):
        worker.load(*evaluated)
        state = context.store.peek(client) if (alg.stateful or alg.personalised) and context.store is not None else None
        if alg.personalised:
            personal_model(context, client, state or {}, origin)
        elif context.cfg.eval.finetune_epochs:
            finetuned_model(context, client, state or {}, origin)
        else:
            alg.load_own_model(state or {}, worker)
        worker.module.eval()
        indices = context.client_test[client]
        for start in range(0, len(indices), batch):
            idx = indices[start : start + batch]
            y = context.client_test_y[idx]
            correct[client] += int(hits(worker.module(context.client_test_x[idx]), y, tokens))
        total[client] = len(indices) if tokens is None else token_counts(context.client_test_y[indices], tokens)[1]
    stats.add("client_correct", correct)
    stats.add("client_total", total)


@torch.no_grad()
def evaluate_clients(context, model) -> dict:
    """The per-client statistics alone, every client starting from `model` (parameters, buffers), in one
    all_reduce (`eval_clients`): eval.finetune_from=best, once the evaluated round's test_acc is known."""
    stats = StatBuffer(client_segments(len(context.population)), context.device, 1)
    add_client_counts(context, stats, model)
    reduced = stats.reduce(context.ctx, name="eval_clients")
    return {**reduced_client_statistics(reduced, context), "clients_never_sampled": clients_never_sampled(context)}


def best_round_scores(context, best, improved: bool) -> dict:
    """eval.finetune_from=best: keep the evaluated global model if this round `improved` test_acc (`best`:
    run_state.BestModel), then score every client starting from the kept one (`evaluate_clients`)."""
    if improved:
        best.take(*context.algorithm.evaluation_model(context.global_params, context.global_buffers))
    return {**evaluate_clients(context, (best.params, best.buffers)),
            "client_model_round": context.state.progress["best_round"]}


def personal_model(context, client: int, state: dict, start: torch.Tensor) -> None:
    """Load client `client`'s own model into the worker (`Algorithm.load_evaluated_model`), which may
    fine-tune it with `run.train` under the method's own hooks."""
    alg = context.algorithm
    train_evaluated_model(context, client, state, alg, alg.load_evaluated_model, start)


class PlainSGD:
    """The hooks of plain local SGD on the model's own loss (no proximal term, correction or extra loss):
    eval.finetune_epochs fine-tunes every method's evaluated model the same way, and needs no client state
    (SCAFFOLD's controls, MOON's previous model) a method's own hooks would read."""

    def before_forward(self, w, run) -> None:
        pass

    def correct_gradient(self, w, g, run) -> None:
        pass

    def local_loss(self, model, x, y, run):
        return model.loss(model(x), y)


def finetuned_model(context, client: int, state: dict, start: torch.Tensor) -> None:
    """eval.finetune_epochs: the model client `client` uses (`load_own_model`: the global model, with
    FedBN its own BatchNorm), fine-tuned for that many epochs of plain SGD on its training data."""
    alg, epochs = context.algorithm, context.cfg.eval.finetune_epochs

    def finetune(run, worker):
        alg.load_own_model(run.state, worker)
        run.train(epochs=epochs, name="finetune", record=False)

    train_evaluated_model(context, client, state, PlainSGD(), finetune, start)


def train_evaluated_model(context, client: int, state: dict, hooks, body, start: torch.Tensor) -> None:
    """Call `body(run, worker)` with `run.train` bound to local SGD of the worker on client `client`'s
    training data (train.batch_size, the optimizer of `finetune_train_config`, `hooks`' before_forward,
    local_loss and correct_gradient), the torch RNG seeded by (seed, client) only: the same model on
    whichever rank evaluates the client. FedBABU's fine-tuning and eval.finetune_epochs share it. `start`:
    the flat parameters the client starts from (`run.global_params`). The run is built by the round's own
    client path (`RoundEngine.client_run`, round.py), with weight 0."""
    cfg = context.cfg
    run = context.client_run(client, max(context.state.last_round, 1), None, train_cfg=finetune_train_config(cfg),
                             hooks=hooks, start=start, state=dict(state))
    seed_local_rng(finetune_seed(cfg.seed, client), context.worker.params.device)
    with torch.enable_grad():
        body(run, context.worker)


def finetune_train_config(cfg):
    """The train section the fine-tuning's SGD steps with. eval.finetune_optimizer=train: train.* itself
    (the lr of the last round trained, train.momentum and weight_decay); own: a constant
    eval.finetune_lr with eval.finetune_momentum and no weight decay (FedBABU's protocol)."""
    if cfg.eval.finetune_optimizer == "train":
        return cfg.train
    return dataclasses.replace(cfg.train, lr=cfg.eval.finetune_lr, momentum=cfg.eval.finetune_momentum,
                               weight_decay=0.0, lr_schedule="constant", lr_warmup_rounds=0)


def finetune_seed(seed: int, client: int) -> int:
    """The seed of client `client`'s fine-tuning batches (every evaluation draws the same ones)."""
    return int(np.random.SeedSequence([seed, _FINETUNE_STREAM, client]).generate_state(1)[0])


def client_finetune_epochs(cfg, algorithm) -> int | None:
    """summary.json's `client_finetune_epochs`: the epochs each client fine-tunes on its own training data
    before the per-client statistics score it (None without eval.clients, or for a personalised plugin
    method that does not state it: its `load_evaluated_model` decides)."""
    if not cfg.eval.clients:
        return None
    return algorithm.evaluated_finetune_epochs() if algorithm.personalised else cfg.eval.finetune_epochs


def reduced_client_statistics(reduced, context=None) -> dict:
    """`accuracy_statistics` of the summed `client_segments` of a reduced eval buffer; given the run's
    `context`, each client's result also goes to RUN_DIR/clients.csv (`write_client_results`)."""
    correct, total = reduced["client_correct"].cpu().numpy(), reduced["client_total"].cpu().numpy()
    if context is not None:
        write_client_results(context, correct, total)
    return accuracy_statistics(correct, total)


CLIENTS_CSV = "clients.csv"
CLIENTS_COLUMNS = ("client", "client_id", "round", "train_samples", "test_samples", "correct", "accuracy")


def write_client_results(context, correct: np.ndarray, total: np.ndarray) -> None:
    """Rank 0: RUN_DIR/clients.csv, one row a client, replaced at every per-client evaluation: its index,
    its id (the source's name of the client, a LEAF or TFF user, under partition.scheme=natural; else the
    index), the round evaluated, its training samples, its local test samples (target tokens for a
    next-token dataset), how many it scored right and its accuracy (empty for a client without test samples)."""
    if not context.ctx.is_main:
        return
    import csv
    import io

    from ..checkpoint import atomic_write_text

    names = getattr(context.data, "client_ids", None)
    named = context.cfg.partition.scheme == "natural" and names is not None and len(names) == len(correct)
    sizes = context.population.sizes
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(CLIENTS_COLUMNS)
    for k in range(len(correct)):
        right, of = int(correct[k]), int(total[k])
        writer.writerow([k, str(names[k]) if named else k, context.state.last_round, int(sizes[k]), of, right,
                         repr(right / of) if of else ""])
    atomic_write_text(buf.getvalue(), context.run_dir / CLIENTS_CSV)


def clients_never_sampled(context) -> int:
    """Clients that no cohort of rounds 1..context.state.last_round has held (each cohort is a function of the
    seed and the round: population.cohort)."""
    population, cfg = context.population, context.cfg
    seen = np.zeros(len(population), dtype=bool)
    for t in range(1, context.state.last_round + 1):
        seen[population.cohort(cfg.seed, t, cfg.train.clients_per_round, cfg.train.cohort)] = True
    return int((~seen).sum())


def accuracy_statistics(correct: np.ndarray, total: np.ndarray) -> dict:
    """Mean, standard deviation (population, ddof 0), minimum and 10th percentile (numpy's linear
    interpolation) of the clients' accuracies correct_k / total_k, and their mean weighted by the
    clients' test samples, sum_k correct_k / sum_k total_k."""
    correct, total = np.asarray(correct, dtype=np.float64), np.asarray(total)
    acc = correct[total > 0] / total[total > 0]
    values = (acc.mean(), acc.std(), acc.min(), np.percentile(acc, 10), correct.sum() / total.sum())
    return {key: float(v) for key, v in zip(STATISTICS, values)}

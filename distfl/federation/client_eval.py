"""Per-client evaluation (eval.clients): every client of the population scores the model it would use
on its own local test set (data/client_test.py: drawn from the test split, or with eval.client_split=holdout
held out of its own training data, un-augmented), beside the global model on the whole test set.

The model a client uses is the global model, with FedBN its own BatchNorm from its state (a client never
sampled yet has none and uses the global BatchNorm); for a personalised method (FedPer, FedRep, FedBABU,
Ditto, APFL) whatever its `load_evaluated_model` builds from the client's state, which may first
fine-tune on the client's training data (FedBABU) with randomness keyed by (seed, client) and the same
on every rank. Client c is evaluated on rank c % world_size, the
rank that holds its state under sticky placement (with runtime.client_state=disk any rank can read it).
Its correct and total counts go into one int slot each of the eval all_reduce, so the statistics below
are exact and identical on 1 or N ranks.
"""
from __future__ import annotations

import numpy as np
import torch

from .aggregate import Segment
from .local import ClientRun, local_steps, run_local_training

_FINETUNE_STREAM = 5  # distinct from population.py's (1, 2) and client_test.py's (3, 4) streams

# metrics.jsonl keys, over the clients with a non-empty local test set
STATISTICS = ("client_acc_mean", "client_acc_std", "client_acc_min", "client_acc_p10")


def client_segments(num_clients: int) -> list[Segment]:
    return [Segment("client_correct", num_clients, kind="int"), Segment("client_total", num_clients, kind="int")]


@torch.no_grad()
def add_client_counts(trainer, stats) -> None:
    """Evaluate this rank's clients and add their counts (the worker is left holding the last one)."""
    worker, alg, ctx = trainer.worker, trainer.algorithm, trainer.ctx
    num_clients = len(trainer.population)
    correct = torch.zeros(num_clients, dtype=torch.int64)
    total = torch.zeros(num_clients, dtype=torch.int64)
    batch = trainer.cfg.eval.batch_size
    for client in range(ctx.rank, num_clients, ctx.world_size):
        worker.load(*alg.evaluation_model(trainer.global_params, trainer.global_buffers))
        state = trainer.store.peek(client) if (alg.fedbn or alg.personalised) and trainer.store is not None else None
        if alg.personalised:
            personal_model(trainer, client, state or {})
        else:
            alg.load_own_model(state or {}, worker)
        worker.module.eval()
        indices = trainer.client_test[client]
        for start in range(0, len(indices), batch):
            idx = indices[start : start + batch]
            hits = worker.module(trainer.client_test_x[idx]).argmax(1) == trainer.client_test_y[idx]
            correct[client] += int(hits.sum())
        total[client] = len(indices)
    stats.add("client_correct", correct)
    stats.add("client_total", total)


def personal_model(trainer, client: int, state: dict) -> None:
    """Load client `client`'s own model into the worker (`Algorithm.load_evaluated_model`), with
    `run.train` fine-tuning on its training data under the lr of the last round trained."""
    cfg, alg = trainer.cfg, trainer.algorithm
    n = int(trainer.population.sizes[client])
    run = ClientRun(client_id=client, round_idx=max(trainer.last_round, 1), num_samples=n, weight=0.0,
                    steps=local_steps(n, cfg.train.batch_size, cfg.train.local_epochs, cfg.train.local_steps),
                    global_params=trainer.global_params, state=dict(state))
    torch.manual_seed(int(np.random.SeedSequence([cfg.seed, _FINETUNE_STREAM, client]).generate_state(1)[0]))
    with torch.enable_grad():
        run_local_training(trainer.worker, trainer.data, trainer.client_indices[client], run, cfg.train, alg,
                           alg.load_evaluated_model)


def accuracy_statistics(correct: np.ndarray, total: np.ndarray) -> dict:
    """Mean, standard deviation (population, ddof 0), minimum and 10th percentile (numpy's linear
    interpolation) of the clients' accuracies correct_k / total_k."""
    correct, total = np.asarray(correct, dtype=np.float64), np.asarray(total)
    acc = correct[total > 0] / total[total > 0]
    values = (acc.mean(), acc.std(), acc.min(), np.percentile(acc, 10))
    return {key: float(v) for key, v in zip(STATISTICS, values)}

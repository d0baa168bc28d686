"""A pack of clients trained at once, as one vectorised model (`runtime.pack_size` > 1).

Cross-device clients hold tens of samples and train a small CNN, so one client's SGD step is a few
microseconds of GPU work behind dozens of kernel launches. A pack stacks its clients' flat parameters
and buffers into P x N and P x M tensors and runs every local step for all of them in one call:
`torch.func.functional_call` of the rank's model under `vmap(grad(...))`.

`local.train_client` is the one entry of local training: a pack of one trains on the worker through
autograd (`LocalSGD`), a larger pack as below (`PackStep.train`), and each client keeps the same semantics:
  - the same keyed randomness: its batch order (and augmentation) is drawn by replaying its own
    `torch.manual_seed(seed, round, client)` stream, exactly as a client trained alone draws it;
  - the same algorithm hooks, called per client on one row (a view) of the stacked flat tensors:
    `begin_client`, `before_forward`, `correct_gradient`, `after_step`, then `client_statistics` on the worker;
  - the same SGD step (coupled weight decay, momentum, dampening 0): `local.sgd_step`, on rows.
Clients of unequal sizes: at step s only the clients with an s-th batch take part, and clients whose
s-th batch has the same size go through one vectorised call, so every client takes exactly its own
steps on exactly its own batches (BatchNorm statistics never see another client's or a padded sample).

A pack's result equals one-at-a-time training up to floating-point rounding (a vectorised convolution
may sum in another order). It is a pure function of the pack, never of the rank or the world size:
packs are cut from the cohort in cohort order (population.place_packs).
"""
from __future__ import annotations

from typing import Iterator

import torch
from torch.func import functional_call, grad, vmap

from ..errors import ConfigError
from .graphs import GraphedStep
from .local import ClientRun, FlatModel, batch_indices, local_batches, seed_local_rng, sgd_step
from .population import client_seed
from .schedule import round_lr

# runtime.pack_size=0 (auto) by device type. CPU: a vmap pack measured 1.05-1.5x slower per client step
# than one at a time (SimpleCNN, batch 10-32), and 3.3x slower for pfl_cnn at batch 10, pack 10
# (bench/results/cross-device.md). CUDA (H200, pfl_cnn, batch 10, 50 clients a round, steps replayed as CUDA
# graphs; bench/results/cross-device-cuda_2026-11-27_graphs.md): 0.646 s a round one at a time, 0.069 in packs of
# 10, 0.064 of 25, 0.055 of 50. Several ranks sharing the GPU were slower than one (docs/gpu.md).
AUTO_PACK_SIZE = {"cpu": 1, "cuda": 50}


def resolve_pack_size(value: int, device: torch.device, algorithm, sticky: bool) -> int:
    """runtime.pack_size, with 0 (auto) resolved for `device`: AUTO_PACK_SIZE where the run can train in
    packs, else 1 (auto never turns a run that cannot pack into an error; check_packable refuses an
    explicit size)."""
    if value > 0:
        return value
    auto = AUTO_PACK_SIZE.get(device.type, 1)
    return auto if auto > 1 and not sticky and not algorithm.pack_refusal() else 1


def check_packable(cfg, algorithm, pack_size: int, sticky: bool) -> None:
    """ConfigError, before any work, for a pack size the run cannot use."""
    if pack_size == 1:
        return
    if sticky:
        raise ConfigError(
            f"runtime.pack_size={pack_size} deals whole packs to ranks, so a client cannot live on a fixed "
            f"rank (sticky placement, the default for algorithm.name={cfg.algorithm.name} or aggregation."
            "fedbn with client state in memory): set runtime.client_state=disk and runtime.placement=auto "
            "or balanced, or runtime.pack_size=1")
    reason = algorithm.pack_refusal()
    if reason:
        raise ConfigError(f"runtime.pack_size={pack_size}: algorithm.name={cfg.algorithm.name} cannot train "
                          f"clients in packs: {reason}; set runtime.pack_size=1")


def client_batches(data, indices: torch.Tensor, run: ClientRun, train_cfg, seed: int, device: torch.device,
                   fold_single: bool = False) -> list[tuple]:
    """The (x, y) of each local step of one client, drawn exactly as it draws them trained alone."""
    seed_local_rng(client_seed(seed, run.round_idx, run.client_id), device)
    return list(local_batches(data, indices, train_cfg, fold_single=fold_single))


def client_batch_indices(indices: torch.Tensor, run: ClientRun, train_cfg, seed: int, device: torch.device,
                         fold_single: bool = False) -> list[torch.Tensor]:
    """The sample indices of each local step of one client, drawn exactly as it draws them trained alone
    (without augmentation, whose draws come between a pass's batches: then `client_batches`)."""
    seed_local_rng(client_seed(seed, run.round_idx, run.client_id), device)
    return list(batch_indices(indices, train_cfg, fold_single=fold_single))


class PackBatches:
    """The (x, y) of a pack's clients at one step, gathered for the rows of a group at once: one gather of a
    P x batch index instead of one per client (the same values: a gather is exact)."""

    def __init__(self, data, indices: list[torch.Tensor], runs: list[ClientRun], train_cfg, seed: int,
                 device: torch.device, fold_single: bool):
        self.data = data
        if data.augment is None:
            self.steps = [client_batch_indices(idx, run, train_cfg, seed, device, fold_single)
                          for idx, run in zip(indices, runs)]
            self.batches = None
        else:
            self.batches = [client_batches(data, idx, run, train_cfg, seed, device, fold_single)
                            for idx, run in zip(indices, runs)]
            self.steps = [[y for _, y in client] for client in self.batches]

    def __len__(self) -> int:
        return max(len(c) for c in self.steps)

    def groups(self, s: int) -> list[list[int]]:
        """Clients that still have a step `s`, grouped by the size of their batch at that step."""
        groups: dict[int, list[int]] = {}
        for k, steps in enumerate(self.steps):
            if s < len(steps):
                groups.setdefault(len(steps[s]), []).append(k)
        return list(groups.values())

    def gather(self, s: int, rows: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """rows x batch inputs and labels of step `s`."""
        if self.batches is not None:
            return (torch.stack([self.batches[k][s][0] for k in rows]),
                    torch.stack([self.batches[k][s][1] for k in rows]))
        index = torch.stack([self.steps[k][s] for k in rows])
        return self.data.train_x[index], self.data.train_y[index]


class PackStep:
    """One local step's gradients, losses and new buffers for a stack of clients: a vectorised
    `loss.backward()` of the rank's model over rows of flat parameters and buffers."""

    def __init__(self, flat: FlatModel, graphs=None):
        module = flat.module
        shapes = {name: p.shape for name, p in module.named_parameters()}
        self.params = [(name, sl, shapes[name]) for name, sl in flat.param_slices.items()]
        buffers = dict(module.named_buffers())
        self.buffers = [(name, sl, buffers[name].shape) for name, sl in flat.buffer_slices.items()]
        # Integer buffers (BatchNorm's num_batches_tracked) are written in place by the forward pass,
        # which a grad transform allows only on its inputs; each call gets a throw-away copy.
        self.int_buffers = {name: b for name, b in buffers.items() if not b.is_floating_point()}
        self.module = module

        def client_loss(w, b, int_buffers, x, y):
            # BatchNorm updates its running statistics in place: each buffer is a fresh copy (an
            # in-place update through a view of one stacked tensor would not reach it under vmap),
            # and the copies, concatenated, are the client's new flat buffers.
            buffers = {name: b[sl].view(shape).clone() for name, sl, shape in self.buffers}
            tensors = {name: w[sl].view(shape) for name, sl, shape in self.params}
            tensors.update(buffers)
            tensors.update({name: t.clone() for name, t in int_buffers.items()})
            loss = module.loss(functional_call(module, tensors, (x,)), y)
            new_b = torch.cat([t.reshape(-1) for t in buffers.values()]) if buffers else b
            return loss, (loss.detach(), new_b)

        self._step = vmap(grad(client_loss, has_aux=True), in_dims=(0, 0, None, 0, 0))
        # runtime.cuda_graphs: the step replayed as a CUDA graph per input shape (federation/graphs.py)
        self.graphed = None if graphs is None else GraphedStep(self._eager, graphs, "a pack's local step")

    def train(self, flat: FlatModel, data, indices: list[torch.Tensor], runs: list[ClientRun], train_cfg, algorithm,
              global_buffers: torch.Tensor) -> Iterator[ClientRun]:
        """Train a pack of clients at once (`local.train_client`'s packs of two or more)."""
        return train_pack(flat, self, data, indices, runs, train_cfg, algorithm, global_buffers)

    def train_rows(self, flat: FlatModel, data, indices: list[torch.Tensor], runs: list[ClientRun], train_cfg,
                   algorithm, global_buffers: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Train a pack of clients at once and return their models as rows: (P x N parameters, P x M
        buffers, P loss sums), for statistics added for the whole pack at once (`pack_statistics`)."""
        return train_pack_rows(flat, self, data, indices, runs, train_cfg, algorithm, global_buffers)

    def __call__(self, w: torch.Tensor, b: torch.Tensor, x: torch.Tensor, y: torch.Tensor):
        """w: P x N parameters, b: P x M float buffers, x: P x batch x ..., y: P x batch ->
        (P x N gradients, P losses, P x M buffers after the forward pass)."""
        if self.graphed is not None:
            return self.graphed(w, b, x, y)
        return self._eager(w, b, x, y)

    def _eager(self, w, b, x, y):
        g, (loss, new_b) = self._step(w, b, self.int_buffers, x, y)
        return g, loss, new_b


def train_pack(flat: FlatModel, step: PackStep, data, indices: list[torch.Tensor], runs: list[ClientRun],
               train_cfg, algorithm, global_buffers: torch.Tensor) -> Iterator[ClientRun]:
    """`local.train_client` of a pack of two or more, as one vectorised model (`PackStep.train`)."""
    w, b, loss_sums = train_pack_rows(flat, step, data, indices, runs, train_cfg, algorithm, global_buffers)
    for k, run in enumerate(runs):
        flat.load(w[k], b[k])
        run.loss_sum = loss_sums[k]
        yield run


def train_pack_rows(flat: FlatModel, step: PackStep, data, indices: list[torch.Tensor], runs: list[ClientRun],
                    train_cfg, algorithm, global_buffers: torch.Tensor):
    """The pack's trained models as rows (`PackStep.train_rows`)."""
    count = len(runs)
    w = torch.empty(count, flat.num_params, device=flat.params.device)
    b = torch.empty(count, flat.buffers.numel(), device=flat.params.device)
    if all(run.global_params is runs[0].global_params for run in runs) and not (
            acts(algorithm, "begin_client") or acts(algorithm, "load_own_model")):
        w.copy_(runs[0].global_params.expand(count, -1))  # every row the one global model: one copy
        b.copy_(global_buffers.expand(count, -1))
    else:
        for k, run in enumerate(runs):
            flat.load(run.global_params, global_buffers)
            algorithm.begin_client(run, flat)  # e.g. FedBN puts the client's own BatchNorm in
            w[k], b[k] = flat.params, flat.buffers
    batches = PackBatches(data, indices, runs, train_cfg, algorithm.seed, w.device, flat.fold_single)
    velocity = None
    loss_sums = torch.zeros(count, dtype=torch.float64, device=w.device)
    flat.module.train()
    # Device index tensors of the row groups, built once each: indexing with a Python list copies it to
    # the device at every step (on a GPU, a copy that waits for the queue).
    index_of: dict[tuple, torch.Tensor | None] = {}
    for s in range(len(batches)):
        for rows in batches.groups(s):
            key = tuple(rows)
            if key not in index_of:
                index_of[key] = None if len(rows) == count else torch.tensor(rows, device=w.device)
            velocity = _pack_step(step, w, b, velocity, loss_sums, index_of[key], batches.gather(s, rows),
                                  [runs[k] for k in rows], s == 0, train_cfg, algorithm)
    return w, b, loss_sums


def pack_statistics(algorithm) -> bool:
    """Whether a pack's statistics can be added for all its clients at once: the method adds the
    default ones (its weighted update and buffers: `Algorithm.client_statistics`), unchanged by any
    feature wrapped around it."""
    return not (acts(algorithm, "client_statistics") or acts(algorithm, "add_update"))


def acts(algorithm, hook: str) -> bool:
    """Whether `hook` does something for this method or a feature wrapped around it (`overrides`;
    duck-typed hooks that cannot say are taken to act)."""
    overrides = getattr(algorithm, "overrides", None)
    return True if overrides is None else overrides(hook)


def _pack_step(step, w, b, velocity, loss_sums, index, batch, runs, first, train_cfg, algorithm):
    """One local step of the pack's clients at rows `index` (a device tensor; None: every row): their
    gradients through `step`, then `sgd_step` as one client's. Returns the pack's momentum buffer."""
    whole = index is None
    wr = w if whole else w[index]
    for k, run in enumerate(runs):
        algorithm.before_forward(wr[k], run)
    x, y = batch
    g, loss, new_b = step(wr, b if whole else b[index], x, y)
    if whole:
        loss_sums += loss.double() * y.shape[1]
    else:
        loss_sums[index] += loss.double() * y.shape[1]
    # Every client of the pack has a step 0, which starts its momentum buffer.
    rows_velocity = None if first or velocity is None else (velocity if whole else velocity[index])
    lr = round_lr(train_cfg, runs[0].round_idx, train_cfg.rounds)
    rows_velocity = sgd_step(wr, g, rows_velocity, lr, train_cfg, algorithm, runs)
    if rows_velocity is not None and not whole:
        if velocity is None:
            velocity = torch.zeros_like(w)
        velocity[index] = rows_velocity
    elif rows_velocity is not None:
        velocity = rows_velocity
    if whole:
        b.copy_(new_b)
    else:
        w[index], b[index] = wr, new_b
    return velocity

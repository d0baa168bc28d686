"""The rank's one reused model, and the local training loop every client runs.

The model's trainable parameters (and float buffers, e.g. BatchNorm running statistics) are views into one
flat tensor each, and the parameter gradients are views into one flat gradient tensor. Frozen parameters
(`requires_grad=False`) stay the module's own tensors: fixed data, like a fixed head's buffers. Loading the global
model into the worker is then one copy, a client's update is one subtraction, and the SGD step is a
handful of fused vector ops instead of a loop over parameter tensors.

A step's gradients are not accumulated into the flat gradient: each backward pass starts with the
parameters' `.grad` unset, so autograd hands over the tensors it computed (no zeroing pass, no
read-add-write pass). When the step needs the flat gradient (a method's correction, weight decay,
momentum, a trainable mask) they are copied into it; plain SGD adds them to the parameters directly.
Either way the step is the same element-wise arithmetic as before. (measured: docs/performance.md)
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Iterator

import torch

from .population import client_seed
from .schedule import round_lr


class FlatModel:
    def __init__(self, module: torch.nn.Module, channels_last: bool = False):
        self.module = module
        # Training batches of images go to the model in channels_last memory format (runtime.channels_last):
        # the same values, faster CPU kernels for convolutions and max-pooling.
        self.channels_last = channels_last
        # Only the parameters that train (`requires_grad`) are flat: a frozen one (a pretrained backbone a
        # plugin model freezes) stays the module's own tensor, fixed data like a fixed head's buffers below.
        named = [(name, p) for name, p in module.named_parameters() if p.requires_grad]
        frozen_params = [p for p in module.parameters() if not p.requires_grad]
        params = [p for _, p in named]
        self.param_tensors = params
        device = next(module.parameters()).device
        # name -> slice of the flat vector, for methods that treat some parameters differently (FedBN).
        self.param_slices: dict[str, slice] = {}
        self.params = torch.cat([p.detach().reshape(-1) for p in params] or [torch.zeros(0, device=device)]
                                ).to(torch.float32)
        self.grads = torch.zeros_like(self.params)
        offset = 0
        for name, p in named:
            n = p.numel()
            self.param_slices[name] = slice(offset, offset + n)
            p.data = self.params[offset : offset + n].view_as(p)
            p.grad = self.grads[offset : offset + n].view_as(p)
            offset += n
        self.grad_views = [p.grad for p in params]

        # Buffers of `frozen` modules (a fixed classifier head) stay out of the flat vectors: they are
        # identical everywhere, never aggregated and never trained. `frozen` lists the persistent ones (the
        # checkpoint holds them), then the frozen parameters; a non-persistent buffer is data (Sent140's
        # word vectors, hashed as a data file).
        frozen_modules = [m for m in module.modules() if getattr(m, "frozen", False)]
        self.frozen = [b for m in frozen_modules for k, b in m._buffers.items()
                       if b is not None and k not in m._non_persistent_buffers_set] + frozen_params
        frozen_ids = {id(b) for m in frozen_modules for b in m.buffers()}
        float_buffers = [(f"{prefix}.{k}" if prefix else k, m, k, b) for prefix, m in module.named_modules()
                         for k, b in m._buffers.items()
                         if b is not None and b.is_floating_point() and id(b) not in frozen_ids]
        self.int_buffers = [b for b in module.buffers() if not b.is_floating_point()]
        if float_buffers:
            self.buffers = torch.cat([b.reshape(-1) for *_, b in float_buffers]).to(torch.float32)
        else:
            self.buffers = torch.zeros(0, device=device)
        self.buffer_slices: dict[str, slice] = {}
        offset = 0
        for name, m, k, b in float_buffers:
            n = b.numel()
            self.buffer_slices[name] = slice(offset, offset + n)
            m._buffers[k] = self.buffers[offset : offset + n].view_as(b)
            offset += n
        self._int_snapshot = [b.clone() for b in self.int_buffers]
        # A batch of one sample cannot train BatchNorm ("Expected more than 1 value per channel"): with
        # BatchNorm layers, a pass's one-sample last batch is folded into the batch before it.
        self.fold_single = any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in module.modules())

    @property
    def num_params(self) -> int:
        """The number of trained parameters (the flat vector's length; frozen ones are not counted)."""
        return self.params.numel()

    def copy_frozen(self, source: FlatModel) -> None:
        """Make this model's fixed tensors (a fixed head's buffers, frozen parameters) `source`'s: a copy of
        the run's model built afresh (a method's teacher) then holds the worker's frozen weights."""
        with torch.no_grad():
            for tensor, value in zip(self.frozen, source.frozen, strict=True):
                tensor.copy_(value)

    def load(self, params: torch.Tensor, buffers: torch.Tensor) -> None:
        """Make the worker equal to a given model (integer buffers go back to the global values)."""
        self.params.copy_(params)
        self.buffers.copy_(buffers)
        for b, v in zip(self.int_buffers, self._int_snapshot):
            b.copy_(v)

    def take_grads(self) -> list[torch.Tensor | None]:
        """The gradients of the last backward pass, one per parameter (None: it got none), and the
        parameters' `.grad` unset for the next one (autograd then hands over the tensor it computed)."""
        grads = [p.grad for p in self.param_tensors]
        for p in self.param_tensors:
            p.grad = None
        return grads

    def restore_grad_views(self) -> None:
        """Make the parameters' `.grad` the views into the flat gradient again."""
        for p, view in zip(self.param_tensors, self.grad_views):
            p.grad = view

    def state_sha256(self) -> str:
        """SHA-256 of all parameters and buffers as contiguous float32 bytes, in state_dict order."""
        digest = hashlib.sha256()
        for tensor in self.module.state_dict().values():
            digest.update(tensor.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
        return digest.hexdigest()


@dataclass
class ClientRun:
    """What one client's local training needs to know, and what it leaves for the algorithm."""

    client_id: int
    round_idx: int
    num_samples: int
    weight: float  # the client's aggregation weight in this round
    steps: int  # local SGD steps this round
    global_params: torch.Tensor  # the model the client received (flat, read-only): the round's global model; with FedBN, with the client's own BatchNorm
    state: dict = field(default_factory=dict)  # per-client persistent state (stateful algorithms)
    loss_sum: torch.Tensor | None = None  # sum of per-batch mean loss * batch size, after training
    pass_name: str = "local"  # the name given to the running `train` call (methods with several passes)
    sgd: LocalSGD | None = field(default=None, repr=False)  # the client's data and hooks, bound by whoever made the run

    def train(self, epochs: int = 0, steps: int = 0, trainable: torch.Tensor | None = None,
              name: str = "local", record: bool = True) -> None:
        """Local SGD of the worker's current parameters on this client's data (the runtime's primitive
        for `Algorithm.local_training` and `Algorithm.load_evaluated_model`).

        epochs, steps: `epochs` passes over the data, or exactly `steps` batches; both 0: the run's
        train.local_epochs / train.local_steps. Batches continue the client's keyed random stream, so a
        second call draws fresh orders, the same on any rank. trainable: a boolean mask over the flat
        parameters; the others do not move (their step is zeroed after weight decay and momentum).
        name: `pass_name` while it runs, for hooks that act differently per pass. record: add this
        pass's loss to the round's train_loss (`Algorithm.local_samples` must count its samples).
        The algorithm's before_forward, local_loss, correct_gradient and after_step apply; momentum
        starts afresh each call."""
        if self.sgd is None:
            raise RuntimeError("ClientRun.train needs the client's data and hooks (ClientRun.sgd, a LocalSGD), "
                               "which the runtime binds for local training and evaluation")
        self.pass_name = name
        try:
            loss_sum = self.sgd.train(self, epochs, steps, trainable)
        finally:
            self.pass_name = "local"
        if record:
            self.loss_sum = loss_sum if self.loss_sum is None else self.loss_sum + loss_sum


def pass_sizes(num_samples: int, batch_size: int, fold_single: bool = False) -> list[int]:
    """The batch sizes of one pass over a client's data: full batches, the last one partial. With
    `fold_single` (a model with BatchNorm), a last batch of one sample joins the one before it, which
    then holds batch_size + 1 samples (a client of a single sample keeps its batch of one)."""
    sizes = [batch_size] * (num_samples // batch_size) + ([num_samples % batch_size] if num_samples % batch_size else [])
    if fold_single and len(sizes) > 1 and sizes[-1] == 1:
        sizes = sizes[:-2] + [batch_size + 1]
    return sizes


def local_steps(num_samples: int, batch_size: int, epochs: int, steps: int = 0, fold_single: bool = False) -> int:
    """Local SGD steps of a client in a round: `steps` when it is set (train.local_steps), else
    `epochs` passes over its data (the last partial batch of a pass counts as a step; see pass_sizes)."""
    return steps if steps else epochs * len(pass_sizes(num_samples, batch_size, fold_single))


def batch_sizes(num_samples: int, batch_size: int, epochs: int, steps: int = 0, fold_single: bool = False) -> list[int]:
    """The sizes of a client's mini-batches in a round, in order, as `local_batches` draws them: passes
    over the data (`pass_sizes`), `epochs` of them, or cut at `steps`."""
    one_pass = pass_sizes(num_samples, batch_size, fold_single)
    count = local_steps(num_samples, batch_size, epochs, steps, fold_single)
    passes = -(-count // len(one_pass)) if one_pass else 0
    return (one_pass * passes)[:count]


def samples_trained(num_samples: int, batch_size: int, epochs: int, steps: int = 0, fold_single: bool = False) -> int:
    """Samples a client's local steps cover in a round (a sample counts once per batch it is in)."""
    return sum(batch_sizes(num_samples, batch_size, epochs, steps, fold_single))


def local_batches(data, indices: torch.Tensor, train_cfg, epochs: int = 0, steps: int = 0,
                  fold_single: bool = False) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """A client's (x, y) mini-batches for one round: passes over its data, each in a fresh random
    order, drawn from the torch global RNG as they are consumed (the caller seeds it per client).
    `train_cfg.local_epochs` whole passes, or with `train_cfg.local_steps` > 0 exactly that many
    batches, going on into a new order when a pass runs out. `epochs` or `steps` > 0 replace the
    config's (a method's own passes, `ClientRun.train`). Batch sizes: `pass_sizes`."""
    for idx in batch_indices(indices, train_cfg, epochs, steps, fold_single):
        x, y = data.train_x[idx], data.train_y[idx]
        if data.augment is not None:
            x = data.augment(x)
        yield x, y


def batch_indices(indices: torch.Tensor, train_cfg, epochs: int = 0, steps: int = 0,
                  fold_single: bool = False) -> Iterator[torch.Tensor]:
    """The sample indices of `local_batches`' mini-batches, drawn as they are consumed."""
    n, batch = len(indices), train_cfg.batch_size
    if not (epochs or steps):
        epochs, steps = train_cfg.local_epochs, train_cfg.local_steps
    left = local_steps(n, batch, epochs, steps, fold_single) if n else 0
    sizes = pass_sizes(n, batch, fold_single)
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    while left:
        order = indices[torch.randperm(n, device=indices.device)]
        for start, size in zip(starts, sizes):
            yield order[start : start + size]
            left -= 1
            if not left:
                return


def seed_local_rng(seed: int, device: torch.device) -> None:
    """What `torch.manual_seed(seed)` does for the generators a client draws from: the CPU's and, on a
    GPU, that device's. torch.manual_seed also seeds every other GPU and queues seeds for backends never
    initialised (XPU, MTIA, or CUDA on a CPU run), recording a Python stack trace for each queued call:
    0.4-0.5 ms a client, a fifth of a cross-device round on a GPU (measured on an H200)."""
    torch.default_generator.manual_seed(seed)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        torch.cuda.default_generators[index].manual_seed(seed)
    elif device.type != "cpu":
        torch.manual_seed(seed)


def train_client(flat: FlatModel, data, indices: list[torch.Tensor], runs: list[ClientRun], train_cfg, algorithm,
                 global_buffers: torch.Tensor, pack_step=None) -> Iterator[ClientRun]:
    """Train a pack of clients (`runs`, their data `indices`) from `runs[k].global_params` and
    `global_buffers`: the one entry of local training. Yields each run after training, in pack order, with
    its final model loaded into `flat` (the worker), its `loss_sum` set, for the caller to add its
    statistics. A pack of one trains on the worker itself through autograd (the method's
    `local_training`, by default one `run.train()`: see `LocalSGD`); a larger pack as one vectorised
    model through `pack_step` (a pack.PackStep). Both take their steps with `local.sgd_step`.

    All randomness (batch order, augmentation, dropout) comes from the torch global RNG seeded by
    (seed, round, client), so a client trains identically on whichever rank hosts it, alone or in a pack.
    """
    if len(runs) > 1:
        yield from pack_step.train(flat, data, indices, runs, train_cfg, algorithm, global_buffers)
        return
    run = runs[0]
    flat.load(run.global_params, global_buffers)
    algorithm.begin_client(run, flat)  # e.g. FedBN puts the client's own BatchNorm in
    seed_local_rng(client_seed(algorithm.seed, run.round_idx, run.client_id), flat.params.device)
    run.loss_sum = torch.zeros((), dtype=torch.float64, device=flat.params.device)
    # An object with the older hooks only (no local_training) trains one pass, as before the hook existed.
    body = getattr(algorithm, "local_training", None) or (lambda run, flat: run.train())
    body(run, flat)
    yield run


@dataclass
class LocalSGD:
    """Local SGD of the worker `flat` on one client's data (`indices` into `data`), under a method's
    hooks: what `ClientRun.train` runs. The caller seeds the torch RNG for the client first."""

    flat: FlatModel
    data: object
    indices: torch.Tensor
    train_cfg: object
    hooks: object

    def train(self, run: ClientRun, epochs: int = 0, steps: int = 0,
              trainable: torch.Tensor | None = None) -> torch.Tensor:
        """One pass (`ClientRun.train`); returns its loss sum (float64)."""
        flat, hooks, train_cfg = self.flat, self.hooks, self.train_cfg
        model = flat.module
        model.train()
        w, g = flat.params, flat.grads
        lr = round_lr(train_cfg, run.round_idx, train_cfg.rounds)
        frozen = None if trainable is None else ~trainable
        post_step = after_step_hook(hooks)
        velocity = None
        # The pass's loss sum in float64, batch by batch in order. On the host each batch's loss is read as
        # a Python float and summed there (the same IEEE double products and sums as the tensor ops, without
        # three tensor ops a step); on a GPU it stays on the device, never waited for.
        on_host = loss_sum_on_host(w.device)
        host_sum = 0.0
        loss_sum = None if on_host else torch.zeros((), dtype=torch.float64, device=w.device)
        # Plain SGD needs no flat gradient: each parameter takes its own gradient, the same arithmetic.
        overrides = getattr(hooks, "overrides", None)  # duck-typed hooks may lack it: the flat path
        plain = (not train_cfg.weight_decay and not train_cfg.momentum and frozen is None
                 and overrides is not None and not overrides("correct_gradient"))
        image = flat.channels_last
        flat.take_grads()
        try:
            for x, y in local_batches(self.data, self.indices, train_cfg, epochs, steps, flat.fold_single):
                if image and x.dim() == 4:
                    x = x.contiguous(memory_format=torch.channels_last)
                hooks.before_forward(w, run)
                loss = hooks.local_loss(model, x, y, run)
                loss.backward()
                if on_host:
                    host_sum += loss.item() * len(y)
                else:
                    loss_sum += loss.detach().double() * len(y)
                grads = flat.take_grads()
                if plain:
                    with torch.no_grad():
                        torch._foreach_add_([p for p, d in zip(flat.param_tensors, grads) if d is not None],
                                            [d for d in grads if d is not None], alpha=-lr)
                    if post_step is not None:
                        post_step(w, lr, run)
                    continue
                for view, d in zip(flat.grad_views, grads):
                    if d is None:
                        view.zero_()
                torch._foreach_copy_([v for v, d in zip(flat.grad_views, grads) if d is not None],
                                     [d for d in grads if d is not None])
                velocity = sgd_step(w, g, velocity, lr, train_cfg, hooks, [run], frozen)
        finally:
            flat.restore_grad_views()
        return torch.tensor(host_sum, dtype=torch.float64) if on_host else loss_sum


def loss_sum_on_host(device: torch.device) -> bool:
    """Whether local training sums a pass's loss as Python floats (on the host: fewer tensor ops a step) rather
    than on the device (a GPU: never waited for)."""
    return device.type == "cpu"


def sgd_step(w: torch.Tensor, g: torch.Tensor, velocity: torch.Tensor | None, lr: float, train_cfg, hooks,
             runs: list[ClientRun], frozen: torch.Tensor | None = None) -> torch.Tensor | None:
    """One local SGD step, in place, of one client (`w`, `g`: its flat parameters and gradient, `runs`:
    [its run]) or of a pack (`w`, `g`: P x N rows, `runs`: one per row): the step of torch.optim.SGD
    (coupled weight decay, dampening 0) on flat vectors, with each client's gradient correction
    (FedProx, SCAFFOLD, FedDyn, ...) added first and its post-step move after. `velocity`: the momentum
    buffer (None before the first step); returns the new one. `frozen`: coordinates that do not move."""
    rows = [(w, g)] if w.dim() == 1 else list(zip(w, g))
    for (wk, gk), run in zip(rows, runs):
        hooks.correct_gradient(wk, gk, run)
    if train_cfg.weight_decay:
        g.add_(w, alpha=train_cfg.weight_decay)
    if train_cfg.momentum:
        velocity = g.clone() if velocity is None else velocity.mul_(train_cfg.momentum).add_(g)
        step = velocity
    else:
        step = g
    if frozen is not None:
        step = step.masked_fill(frozen, 0.0)
    w.add_(step, alpha=-lr)
    post_step = after_step_hook(hooks)
    if post_step is not None:
        for (wk, _), run in zip(rows, runs):
            post_step(wk, lr, run)
    return velocity


def after_step_hook(hooks):
    """`hooks.after_step`, or None where it moves nothing (Algorithm's own, or duck-typed hooks without
    one): then no step calls it."""
    overrides = getattr(hooks, "overrides", None)
    if overrides is not None:
        return hooks.after_step if overrides("after_step") else None
    return getattr(hooks, "after_step", None)

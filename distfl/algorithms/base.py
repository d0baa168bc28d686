"""The algorithm interface: hooks into the runtime's round, never a round loop of its own.

A round, as the runtime runs it (federation/runner.py):
  begin_round(round_idx)                on every rank (the server lr of the schedule)
  for each client this rank hosts:      load global model -> begin_client -> local SGD steps:
                                          before_forward, local_loss, backward, correct_gradient, step,
                                          after_step
                                        -> client_statistics(run, worker, stats)
  stats.reduce()                        one all_reduce of every segment, summed over the cohort
  server_update(reduced)                identical on every rank

`FedAvg`-style defaults live here: the weighted model delta and the BatchNorm buffers are summed, and
the server optimizer (FedOpt) is applied to the averaged delta. A method overrides only what differs.

This class is public API, exported as `distfl.Algorithm`: a method in the user's own package subclasses
it and is named by `algorithm.name: package.module:ClassName` (docs/extending.md). The hooks' names and
signatures below are kept stable.

FedBN, GMA and DP are not part of a method: they wrap any method (algorithms/fedbn.py, gma.py, private.py;
`build_algorithm` in algorithms/__init__.py), overriding the hooks they change and passing the rest through.

Personalised methods (FedPer, FedRep, FedBABU, Ditto, APFL) use four more hooks, all additive:
  - `local_training(run, worker)`: the client's local training as calls of `run.train(...)` (passes
    with their own epochs, a mask of trainable coordinates, a name); default: one `run.train()`;
  - `local_samples(num_samples, train_cfg)`: the samples those recorded passes cover (train_loss);
  - `personalised = True`: each client is scored (eval.clients) with the model
    `load_evaluated_model(run, worker)` builds from its state, which may fine-tune with `run.train`
    (for `evaluated_finetune_epochs()` epochs);
  - `head_coordinates(worker, model_name)`: the flat coordinates of the model's classifier head (the
    rest is the body), the split FedPer, FedRep and FedBABU share.
"""
from __future__ import annotations

import torch

from ..errors import ConfigError
from ..federation.aggregate import Segment
from ..federation.local import samples_trained
from ..federation.schedule import round_lr
from .fedopt import build_server_optimizer


class Algorithm:
    # ---- what a method declares, read at config validation before any data loads ----------------
    name = "base"
    # The method's options: a dataclass of bool/int/float/str fields, each with a default and a trailing
    # comment (its documentation); metadata "range" (">= 0", "(0, 1]", ...) or "choices" is checked like a
    # config key's. `algorithm.options` is validated against it; the method reads `self.options`.
    Options = None
    # True if its clients release nothing but their model update (delta and buffers segments, weighted
    # run.weight) and its server uses nothing but their sum: it may run under privacy.mechanism=gaussian
    # (docs/privacy.md). Otherwise `why_not_private` says what else it releases (the refusal quotes it).
    private_release = False
    why_not_private = ""
    stateful = False  # True: keeps per-client state between rounds (client state store)
    client_store = False  # True: needs the client state store even when not stateful (TCT's stage 2)
    personalised = False  # True: eval.clients scores each client with load_evaluated_model (its own model)
    head_split = False  # True: splits the model into a shared body and a per-client learnable head (model.head=linear)
    # True if its clients send only a model update and its server step uses only the updates' weighted sum, so
    # stale updates of an asynchronous run (system.async_mode, docs/system.md) are defined for it.
    asynchronous = False
    # What the method needs of the model, each checked at validation from model.* (and, for a plugin model
    # whose BatchNorm layers only its build shows, again when the method is built):
    learnable_head = False  # True: it reads or trains the classifier head's parameters (model.head=linear)
    cross_entropy = ""  # why it needs softmax cross-entropy (model.head=linear, model.loss=auto|ce), or "": any loss
    no_batchnorm = ""  # why it cannot keep BatchNorm statistics right (a model without them), or "": it can
    tct_stage1 = False  # True: TCT may train its network with it (tct.stage1 lists the methods that declare this)

    @classmethod
    def check_config(cls, cfg) -> None:
        """Raise ConfigError for a config this method cannot run (one line naming the keys and what is
        valid). Called by config validation, before any data loads, with `cfg.algorithm.options` complete."""

    @classmethod
    def read_options(cls, cfg):
        """`cfg.algorithm.options` as an instance of `Options` (None for a method without options)."""
        return cls.Options(**cfg.algorithm.options) if cls.Options is not None else None

    @classmethod
    def trained_method(cls, cfg) -> type:
        """The class whose rounds train the model: this one, unless the method is a phase after another
        method's rounds (TCT: its stage 1)."""
        return cls

    @classmethod
    def phases(cls, cfg) -> list:
        """The method's phases after the training rounds (federation/phases.py; TCT: its stages)."""
        return []

    def __init__(self, cfg, population, worker, device: torch.device, model_factory=None):
        """`worker` is the rank's FlatModel (its layout: `param_slices`, `buffer_slices`);
        `model_factory()` builds a fresh model of the run's architecture on `device` (e.g. a teacher)."""
        self.cfg = cfg
        self.seed = cfg.seed
        self.population = population
        self.num_params = worker.num_params
        self.num_buffers = worker.buffers.numel()
        self.layout = worker
        self.device = device
        self.model_factory = model_factory
        self.options = self.read_options(cfg)
        self.server_opt = build_server_optimizer(cfg.server, self.num_params, device)
        self.round_metrics: dict[str, float] = {}  # set by server_update; logged per round (TensorBoard)
        # The method as the runtime calls it: itself, or wrapped in the run's features (FedBN, GMA, DP). A
        # hook that builds another model of a client calls `self.outer.load_own_model` (FedBN's BatchNorm).
        self.outer = self

    # ---- weights -------------------------------------------------------------------------------
    def client_weight(self, client_id: int, cohort: list[int]) -> float:
        """Aggregation weight of a client in this round's cohort; weights sum to 1 (DP replaces them:
        algorithms/private.py)."""
        if self.cfg.algorithm.weighting == "uniform":
            return 1.0 / len(cohort)
        sizes = self.population.token_counts if self.cfg.algorithm.weighting == "tokens" else self.population.sizes
        return float(sizes[client_id]) / float(sum(int(sizes[c]) for c in cohort))

    # ---- client side ---------------------------------------------------------------------------
    def init_client_state(self) -> dict:
        """State a client starts with the first time it is sampled (stateful methods)."""
        return {}

    def begin_client(self, run, worker) -> None:
        """After the global model is loaded into the worker, before local training."""
        self.load_own_model(run.state, worker)

    def load_own_model(self, state: dict, worker) -> None:
        """Turn the global model in the worker into the one this client uses, from its `state` (FedPer:
        with its own head); default: the global model itself."""

    def local_training(self, run, worker) -> None:
        """The client's local training, as calls of `run.train(epochs, steps, trainable, name, record)`
        on the model in `worker` (federation/local.py: each call is local SGD on the client's data,
        continuing its keyed random stream). Default: one pass of train.local_epochs / local_steps."""
        run.train()

    def local_samples(self, num_samples: int, train_cfg) -> int:
        """Samples the recorded passes of `local_training` cover in a round (a sample counts once per
        batch it is in): train_loss's denominator and the bound of its statistic."""
        return samples_trained(num_samples, train_cfg.batch_size, train_cfg.local_epochs, train_cfg.local_steps,
                               self.layout.fold_single)

    def load_evaluated_model(self, run, worker) -> None:
        """Turn the global model in the worker into the model client `run.client_id` is scored with
        (eval.clients). `run.state` is its state ({} if it has none yet); `run.train(...)` may fine-tune
        on its training data (randomness keyed by (seed, client), never by the rank). Used for every
        client of a `personalised` method (and FedBN); default: `load_own_model`."""
        self.load_own_model(run.state, worker)

    def evaluated_finetune_epochs(self) -> int | None:
        """A personalised method: the epochs `load_evaluated_model` fine-tunes a client's model before it
        is scored (summary.json's `client_finetune_epochs`); None: not stated (a plugin's default)."""
        return None

    def local_loss(self, model, x: torch.Tensor, y: torch.Tensor, run) -> torch.Tensor:
        """The loss of one local mini-batch: the model's loss (cross-entropy, or MSE for SphereFed's
        head), unless a method changes it."""
        return model.loss(model(x), y)

    def pack_refusal(self) -> str | None:
        """Why this method cannot train clients in vectorised packs (runtime.pack_size > 1), or None.
        A pack calls every hook per client except `local_loss`: its loss is the model's own."""
        if self.overrides("local_loss"):
            return "it changes the local loss (local_loss), which a vectorised pack does not call"
        if self.overrides("local_training"):
            return "it trains in passes of its own (local_training), which a vectorised pack does not run"
        return None

    def before_forward(self, w: torch.Tensor, run) -> None:
        """Move the flat parameters `w` in place before a step's forward pass (look-ahead methods)."""

    def correct_gradient(self, w: torch.Tensor, g: torch.Tensor, run) -> None:
        """Add method-specific terms to the flat gradient `g` in place, before weight decay and momentum."""

    def after_step(self, w: torch.Tensor, lr: float, run) -> None:
        """Move the flat parameters `w` in place after each local SGD step (weight decay, momentum and
        the step taken), outside the momentum buffer; `lr` is the lr that step used (schedules
        included). Called after every step of every pass, also a pass with a `trainable` mask."""

    def overrides(self, hook: str) -> bool:
        """Whether this method defines `hook` itself (the runtime skips a per-step hook that does
        nothing, e.g. the flat gradient nothing reads)."""
        return getattr(type(self), hook) is not getattr(Algorithm, hook)

    def segments(self) -> list[Segment]:
        return [Segment("delta", self.num_params), Segment("buffers", self.num_buffers)]

    def download_segments(self) -> list[Segment]:
        """What the server sends each client of a round (bytes_down, the virtual clock's download)."""
        return [Segment("params", self.num_params), Segment("buffers", self.num_buffers)]

    def client_statistics(self, run, worker, stats) -> None:
        """Add this client's contributions to the round's sums (after its local training)."""
        self.add_update(stats, worker.params - run.global_params, run.weight)
        stats.add("buffers", worker.buffers, run.weight)

    def add_update(self, stats, delta: torch.Tensor, weight: float) -> None:
        """The client's model update, weighted."""
        stats.add("delta", delta, weight)

    # ---- server side ---------------------------------------------------------------------------
    def begin_round(self, round_idx: int) -> None:
        """A round begins (on every rank, before its clients train): the server lr of its schedule."""
        self.server_opt.lr = round_lr(self.cfg.server, round_idx, self.cfg.train.rounds)

    def server_update(self, params: torch.Tensor, buffers: torch.Tensor, reduced) -> None:
        """Update the global model in place from the reduced sums."""
        self.server_opt.step(params, self.server_direction(params, reduced))
        buffers.copy_(reduced["buffers"])

    def server_direction(self, params: torch.Tensor, reduced) -> torch.Tensor:
        """The pseudo-gradient handed to the server optimizer: for FedAvg the weighted mean delta."""
        return reduced["delta"].to(params.dtype)

    def evaluation_model(self, params: torch.Tensor, buffers: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The (parameters, buffers) the evaluations score (test_acc, eval.clients): the global model,
        unless a method evaluates another one (FedExP: the mean of the last two global models). Training
        always continues from the global model itself."""
        return params, buffers

    def server_state(self) -> dict:
        """Everything the server keeps between rounds (checkpointed)."""
        return {"server_opt": self.server_opt.state_dict()}

    def load_server_state(self, state: dict) -> None:
        self.server_opt.load_state_dict(state["server_opt"])


def head_coordinates(worker, model_name: str) -> torch.Tensor:
    """Boolean mask over the flat parameters of the model's classifier head: the parameters of the
    `head` module of a `distfl.Classifier` (models/base.py: `forward(x) == head(features(x))`). The
    rest, `features`, is the body. A fixed head (model.head=sphere|fixed_random) has no parameters."""
    mask = torch.zeros(worker.num_params, dtype=torch.bool, device=worker.params.device)
    for name, where in worker.param_slices.items():
        if name.startswith("head."):
            mask[where] = True
    if not bool(mask.any()):
        raise ConfigError(f"model.name={model_name} has no learnable classifier head (model.head must be linear: "
                          "a Classifier's `head` module with parameters)")
    return mask


def check_model_needs(cls, cfg) -> None:
    """ConfigError if the run's model lacks what method `cls` declares it needs (`learnable_head`,
    `cross_entropy`, `no_batchnorm`), read from model.*: one line naming the keys and what is valid."""
    from ..models.base import has_batchnorm, loss_kind

    name, model = cfg.algorithm.name, cfg.model
    if cls.learnable_head and model.head != "linear":
        raise ConfigError(f"algorithm.name={name} trains the model's classifier head; model.head={model.head} is fixed: "
                          "use model.head=linear")
    if cls.cross_entropy and loss_kind(model.loss, model.head) != "ce":
        raise ConfigError(f"algorithm.name={name} {cls.cross_entropy}; this model is trained with MSE (model.head="
                          f"{model.head}, model.loss={model.loss}): use model.head=linear and model.loss=auto")
    if cls.no_batchnorm and has_batchnorm(model.name, model.norm):
        refuse_batchnorm(name, model.name, cls.no_batchnorm)


def check_built_model(cls, cfg, worker) -> None:
    """What `check_model_needs` checks, on the built model: a plugin model's BatchNorm is known only here."""
    if cls.no_batchnorm and (worker.buffers.numel() or worker.int_buffers):
        refuse_batchnorm(cfg.algorithm.name, cfg.model.name, cls.no_batchnorm)


def refuse_batchnorm(name: str, model_name: str, why: str) -> None:
    """ConfigError for a model with BatchNorm statistics, for a method that cannot keep them right (`why`)."""
    raise ConfigError(f"algorithm.name={name} {why}; model.name={model_name} has BatchNorm statistics: use a model "
                      "without BatchNorm (e.g. model.norm=gn)")


def flat_views(worker) -> list[tuple[str, slice, torch.Size]]:
    """(name, slice of the flat vector, shape) of each parameter, in the flat layout's order."""
    shapes = {name: p.shape for name, p in worker.module.named_parameters()}
    return [(name, where, shapes[name]) for name, where in worker.param_slices.items()]


def call_at(model, views, flat: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The model's output at the flat parameters `flat` (differentiable in `flat`), its own left as they are."""
    from torch.func import functional_call

    return functional_call(model, {name: flat[where].view(shape) for name, where, shape in views}, (x,))

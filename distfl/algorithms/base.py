"""The algorithm interface: hooks into the runtime's round (federation/round.py), never a round loop of
its own. Exported as `distfl.Algorithm`: a method in the user's own package subclasses it and is named by
`algorithm.name: package.module:ClassName`. docs/extending.md lists every hook in one table (when it is
called, what it may do, its default); their names and signatures are kept stable. The defaults are FedAvg's:
the weighted model delta and BatchNorm buffers summed, the server optimizer stepping on the mean delta.
FedBN, GMA, compression and DP wrap any method (`build_algorithm`, algorithms/__init__.py). What a method
may ask of the model: model_parts.py (its head, each parameter's view), models/needs.py (its declared needs).
"""
from __future__ import annotations

import torch

from ..federation.aggregate import Segment
from ..federation.local import samples_trained
from ..federation.schedule import round_lr
from .fedopt import build_server_optimizer
# Also importable from here (plugins, compressed.py and the run's checks name this module):
from ..models.needs import check_built_model, check_model_needs  # noqa: F401
from .model_parts import call_at, flat_views, head_coordinates  # noqa: F401


class Algorithm:
    # ---- what a method declares, read at config validation before any data loads ----------------
    # (each in one line of docs/extending.md's table "What a method declares")
    name = "base"
    Options = None  # a dataclass of the method's options (algorithm.options), read as `self.options`
    # True if its clients release nothing but their model update and its server uses nothing but their sum:
    # it may run under privacy.mechanism=gaussian. Otherwise `why_not_private` says what else it releases.
    private_release = False
    why_not_private = ""
    stateful = False  # True: keeps per-client state between rounds (client state store)
    client_store = False  # True: needs the client state store even when not stateful (TCT's stage 2)
    personalised = False  # True: eval.clients scores each client with load_evaluated_model (its own model)
    head_split = False  # True: splits the model into a shared body and a per-client learnable head (model.head=linear)
    asynchronous = False  # True: it sends only a model update, summed: stale updates (system.async_mode) are defined
    # What the method needs of the model, checked at validation (and, for a plugin model, when it is built):
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


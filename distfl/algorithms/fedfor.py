"""FedFOR (Tian, Smith & Kira 2022): FedAvg with a one-sided first-order penalty built from the last
global update. Stateless clients; the server (replicated on every rank) keeps one extra model.

Round t (1-based) sends W^{t-1} and, from round 2 on, W^{t-2}. With g = W^{t-2} - W^{t-1} (fixed for the
round) and s = w - W^{t-1} (the client's current displacement), client k minimises (Eq. 7)

    L_k(w) + (alpha / (lr * tau)) * sum_i U(g_i * s_i),        U(x) = x if x >= 0 else 0,

with tau the client's local steps this round (normalize = steps, the default; tau = 1 under
`none`, Eq. 7 as printed, which makes alpha = 5 a momentum of 5 on the global model and diverges), whose
gradient adds, per coordinate,

    (alpha / (lr * tau)) * g_i * 1[g_i * s_i >= 0]     (boundary = ge, the default)
    (alpha / (lr * tau)) * g_i * 1[g_i * s_i >  0]     (boundary = gt)

to the cross-entropy gradient (before weight decay and momentum; the paper uses neither). At the first
local step s = 0, so under `ge` every coordinate with g_i != 0 gets the step (alpha / tau) * (W^{t-1} - W^{t-2})
(the Polyak-momentum "kick" of the paper's Sec. 3.3); under `gt` the penalty only fires once a coordinate
has moved back towards W^{t-2}. Round 1 has no W^{t-2}: plain FedAvg local training.

The penalty covers every parameter (the flat parameter vector), never buffers (BatchNorm statistics
have no gradient). Aggregation is the base class's: the `algorithm.weighting` mean of the client models
through the server optimizer (paper: uniform mean, server sgd lr 1). No extra collective: W^{t-2} is
the pre-update global model, which every rank already holds.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..federation.schedule import round_lr
from ..config.values import check_derived
from .base import Algorithm


class FedFOR(Algorithm):
    name = "fedfor"
    tct_stage1 = True
    private_release = True

    @dataclass
    class Options:
        alpha: float = field(default=5.0, metadata={"range": ">= 0"})  # penalty weight alpha; the loss term is alpha / train.lr * U(...)
        boundary: str = field(default="ge", metadata={"choices": ["ge", "gt"]})  # penalty gradient active where the product is >= 0 (ge) or > 0 (gt)
        normalize: str = field(default="steps", metadata={"choices": ["steps", "none"]})  # steps (divide the penalty by the client's local steps this round: an active step moves alpha * g / steps) | none (alpha * g)

    @classmethod
    def check_config(cls, cfg):
        alpha, lr = cfg.algorithm.options["alpha"], cfg.train.lr
        check_derived("alpha / train.lr (FedFOR's penalty weight)", {"algorithm.options.alpha": alpha, "train.lr": lr},
                      lambda: alpha / lr)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.alpha = float(self.options.alpha)
        self.boundary = self.options.boundary
        self.normalize = self.options.normalize
        self.prev = torch.zeros(self.num_params, device=self.device)  # W^{t-2}: the global model one round back
        self.has_prev = False  # False until the first server update (round 1 trains plain FedAvg)
        self._g = None  # cached g = W^{t-2} - W^{t-1} of the round in `_g_round`
        self._g_round = None

    # ---- client side ---------------------------------------------------------------------------
    def direction(self, run) -> torch.Tensor:
        """g = W^{t-2} - W^{t-1}, computed once per round (the global model is fixed during a round)."""
        if self._g is None or self._g_round != run.round_idx:
            self._g = self.prev - run.global_params
            self._g_round = run.round_idx
        return self._g

    def correct_gradient(self, w, g, run):
        if not self.has_prev:
            return
        d = self.direction(run)
        active = torch.sub(w, run.global_params).mul_(d)  # g_i * s_i
        active = active.ge_(0) if self.boundary == "ge" else active.gt_(0)  # 1.0 / 0.0 in place
        g.addcmul_(d, active, value=self.scale(run))

    def scale(self, run) -> float:
        """The penalty weight alpha / eta (P2: an active step moves alpha * g whatever the round's lr eta is),
        divided by the client's local steps under fedfor_normalize=steps (then alpha * g / steps)."""
        lr = round_lr(self.cfg.train, run.round_idx, self.cfg.train.rounds)
        return self.alpha / (lr * (run.steps if self.normalize == "steps" else 1))

    # ---- server side ---------------------------------------------------------------------------
    def server_update(self, params, buffers, reduced):
        # The penalty direction used this round: ||W^{t-2} - W^{t-1}|| (0 in round 1, which has none).
        norm = float((self.prev - params).norm()) if self.has_prev else 0.0
        self.prev.copy_(params)  # W^{t-1} becomes next round's W^{t-2}
        super().server_update(params, buffers, reduced)
        self.has_prev = True
        self._g, self._g_round = None, None
        self.round_metrics = {"fedfor/prev_update_norm": norm}

    def server_state(self):
        return {**super().server_state(), "prev": self.prev.clone(), "has_prev": self.has_prev}

    def load_server_state(self, state):
        super().load_server_state(state)
        self.prev.copy_(state["prev"])
        self.has_prev = bool(state["has_prev"])
        self._g, self._g_round = None, None

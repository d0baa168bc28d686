"""FedFOR (Tian, Smith & Kira 2022): FedAvg with a one-sided first-order penalty built from the last
global update. Stateless clients; the server (replicated on every rank) keeps one extra model.

Round t (1-based) sends W^{t-1} and, from round 2 on, W^{t-2}. With g = W^{t-2} - W^{t-1} (fixed for the
round) and s = w - W^{t-1} (the client's current displacement), client k minimises (Eq. 7)

    L_k(w) + (alpha / (lr * tau)) * sum_i U(g_i * s_i),        U(x) = x if x >= 0 else 0,

with tau the client's local steps this round (fedfor_normalize = steps, the default; tau = 1 under
`none`, Eq. 7 as printed, which makes alpha = 5 a momentum of 5 on the global model and diverges), whose
gradient adds, per coordinate,

    (alpha / (lr * tau)) * g_i * 1[g_i * s_i >= 0]     (fedfor_boundary = ge, the default)
    (alpha / (lr * tau)) * g_i * 1[g_i * s_i >  0]     (fedfor_boundary = gt)

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

import torch

from ..errors import ConfigError
from ..federation.schedule import round_lr
from .base import Algorithm


class FedFOR(Algorithm):
    name = "fedfor"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        alpha = float(self.cfg.algorithm.fedfor_alpha)
        if not alpha >= 0:
            raise ConfigError(f"algorithm.fedfor_alpha must be >= 0, got {alpha!r}")
        boundary = self.cfg.algorithm.fedfor_boundary
        if boundary not in ("ge", "gt"):
            raise ConfigError(f"algorithm.fedfor_boundary must be ge or gt, got {boundary!r}")
        normalize = self.cfg.algorithm.fedfor_normalize
        if normalize not in ("steps", "none"):
            raise ConfigError(f"algorithm.fedfor_normalize must be steps or none, got {normalize!r}")
        self.alpha = alpha
        self.boundary = boundary
        self.normalize = normalize
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

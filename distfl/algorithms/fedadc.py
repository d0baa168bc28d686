"""FedADC and FedADC+ (Ozfatura, Ozfatura & Gündüz, "FedADC: Accelerated Federated Learning with
Drift Control"), Algorithm 3 and §III. SlowMo (Algorithm 2) is the same code with beta_local = 0
(slowmo.py). Notation and every choice: docs/algorithms/fedadc.md.

Local (client i, H_i = run.steps local steps, lr = eta, m = the server momentum of this round):
  m_bar = beta_local * m / H_i
  nesterov:   w <- w - eta m_bar;  g = grad f_i(w);  w <- w - eta g     (gradient at the shifted point)
  heavy_ball: g = grad f_i(w);     w <- w - eta (g + m_bar)
Either way the H_i steps embed exactly eta * beta_local * m (Eq. 4); weight decay, when configured,
acts on w and never on the shift.
Server (D = sum_i p_i (w_i - theta_t), p_i = the client weights, uniform in the paper):
  m <- -D / eta + (beta_global - beta_local) m            (Delta_bar = -D / eta)
  theta <- theta - alpha eta m  =  theta + alpha D - alpha eta (beta_global - beta_local) m_old
The second form is the one computed: with beta_local = beta_global and alpha = 1 it adds D exactly,
so the server step is bit-for-bit FedAvg's model average (and round 1, m = 0, is FedAvg always).

FedADC+ (kd_lambda > 0): loss = (1 - lam) CE(z, y) + lam tau^2 KL(p_hat || softmax(z / tau)), with the
self-confidence targets of Eqs. 8-9 built from the teacher = the round's global model.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import ConfigError
from ..federation.local import FlatModel
from ..config.values import check_derived
from ..models.base import loss_kind
from .base import Algorithm


def confidence(class_counts) -> torch.Tensor:
    """rho[k, c] = gamma_{c,k} / gamma_k^max = count[k, c] / max_c count[k, c]  (Eqs. 8-9), in [0, 1]."""
    counts = np.asarray(class_counts, dtype=np.float64)
    if counts.ndim == 1:
        counts = counts[None, :]
    peak = np.maximum(counts.max(axis=1, keepdims=True), 1.0)
    return torch.from_numpy(counts / peak).to(torch.float32)


def self_confidence_targets(teacher_probs: torch.Tensor, y: torch.Tensor, rho: torch.Tensor) -> torch.Tensor:
    """Eqs. 8-9: p_hat_i = (1 - rho_i) p_tilde_i for i != y, p_hat_y = 1 - sum_{i != y} p_hat_i.

    teacher_probs: B x C (rows sum to 1); y: B labels; rho: C confidences of the client.
    """
    target = teacher_probs * (1.0 - rho).to(teacher_probs.dtype)[None, :]
    rows = torch.arange(len(y), device=y.device)
    target[rows, y] = 0.0
    target[rows, y] = 1.0 - target.sum(dim=1)
    return target


def kd_loss(logits: torch.Tensor, target: torch.Tensor, temperature: float) -> torch.Tensor:
    """tau^2 * mean over the batch of KL(target || softmax(logits / tau)) (0 log 0 = 0)."""
    log_p = F.log_softmax(logits / temperature, dim=1)
    kl = (torch.xlogy(target, target) - target * log_p).sum(dim=1)
    return kl.mean() * temperature**2


class FedADC(Algorithm):
    name = "fedadc"
    tct_stage1 = True
    own_server_step = True  # its server step is its own, not the server optimizer's: GMA's masked step refuses it
    private_release = True

    @dataclass
    class Options:
        beta_local: float = field(default=0.9, metadata={"range": "[0, 1)"})  # share of the server momentum embedded in every local step
        beta_global: float = field(default=0.9, metadata={"range": "[0, 1)"})  # server momentum coefficient
        server_alpha: float = field(default=1.0, metadata={"range": "> 0"})  # server step scale (the paper's alpha)
        variant: str = field(default="nesterov", metadata={"choices": ["nesterov", "heavy_ball"]})  # nesterov (shift, then gradient at the shifted point) | heavy_ball
        kd_lambda: float = field(default=0.0, metadata={"range": "[0, 1]"})  # FedADC+ self-confidence distillation weight (0 = plain FedADC; paper: 0.35)
        kd_temperature: float = field(default=1.0, metadata={"range": "> 0"})  # with kd_lambda > 0: softmax temperature of teacher and student

    @classmethod
    def local_settings(cls, options) -> dict:
        """What the local steps embed: beta_local, variant, kd_lambda, kd_temperature."""
        return {key: getattr(options, key) for key in ("beta_local", "variant", "kd_lambda", "kd_temperature")}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        cfg, local = self.cfg, self.local_settings(self.options)
        self.lr = float(cfg.train.lr)
        self.beta_local = float(local["beta_local"])
        self.beta_global = float(self.options.beta_global)
        self.alpha = float(self.options.server_alpha)
        self.variant = local["variant"]
        self.kd_lambda = float(local["kd_lambda"])
        self.kd_temperature = float(local["kd_temperature"])
        # The server momentum m_t, in "summed gradient" units (Delta / eta, not divided by H); m_0 = 0.
        self.m = torch.zeros(self.num_params, device=self.device)
        self._mbar = None  # this client's beta_local * m / H_i (None: no shift this round)
        self._mbar_key = None  # (round, client) it was computed for
        self.teacher = None
        self._teacher_key = None
        if self.kd_lambda > 0:
            self.rho = confidence(self.population.class_counts).to(self.device)
            # A separate module (its own flat parameters), built without touching the global RNG
            # stream that seeded the worker; it never trains.
            with torch.random.fork_rng(devices=[]):
                self.teacher = FlatModel(self.model_factory())
            self.teacher.copy_frozen(self.layout)  # a frozen backbone: the worker's weights, not a fresh draw
            for p in self.teacher.module.parameters():
                p.requires_grad_(False)
            self.teacher.module.eval()

    # ---- configuration -------------------------------------------------------------------------
    @classmethod
    def check_config(cls, cfg) -> None:
        name, s, local = cls.name, cfg.server, cls.local_settings(cls.read_options(cfg))
        if local["kd_lambda"] > 0:
            temperature = local["kd_temperature"]
            check_derived("1 / kd_temperature (FedADC+'s logits / T)", {"algorithm.options.kd_temperature": temperature},
                          lambda: 1 / temperature)
        if s.optimizer != "sgd" or float(s.lr) != 1.0 or float(s.momentum) != 0.0:
            raise ConfigError(
                f"algorithm.name={name} has its own server step (algorithm.options.server_alpha, beta_global), "
                f"so server.optimizer must be sgd with server.lr=1 and server.momentum=0; got "
                f"server.optimizer={s.optimizer}, server.lr={s.lr}, server.momentum={s.momentum}")
        for section in ("train", "server"):
            if getattr(cfg, section).lr_schedule != "constant" or getattr(cfg, section).lr_warmup_rounds:
                raise ConfigError(
                    f"algorithm.name={name} divides the averaged update by train.lr to recover its momentum, "
                    f"so it needs a constant lr: {section}.lr_schedule must be constant and "
                    f"{section}.lr_warmup_rounds 0")
        if float(cfg.train.momentum) > 0:
            raise ConfigError(
                f"algorithm.name={name} uses plain local SGD (a local momentum buffer would absorb the embedded "
                f"server momentum); set train.momentum=0, got train.momentum={cfg.train.momentum}")
        if local["kd_lambda"] > 0 and loss_kind(cfg.model.loss, cfg.model.head) == "mse":
            raise ConfigError(
                "FedADC+ (algorithm.options.kd_lambda > 0) distils softmax outputs with cross-entropy; it is not defined "
                "for an MSE-trained model (model.head=sphere or model.loss=mse); set algorithm.options.kd_lambda=0")

    # ---- client side ---------------------------------------------------------------------------
    def _shift(self, run):
        """beta_local * m / H_i for this client (computed once per client and round)."""
        key = (run.round_idx, run.client_id)
        if self._mbar_key != key:
            self._mbar_key = key
            if self.beta_local == 0.0 or run.steps == 0 or not bool(self.m.any()):
                self._mbar = None  # nothing to embed (SlowMo, or m_0 = 0): plain SGD, bit for bit
            else:
                self._mbar = self.m * (self.beta_local / run.steps)
        return self._mbar

    def before_forward(self, w, run):
        if self.teacher is not None and self._teacher_key != (run.round_idx, run.client_id):
            # The worker still holds the model the client received: before_forward of its first step
            # comes before any forward or shift, so its buffers are those of that model too (with
            # FedBN, the client's own BatchNorm, so the teacher is loaded for every client).
            self.teacher.load(run.global_params, self.layout.buffers)
            self._teacher_key = (run.round_idx, run.client_id)
        if self.variant == "nesterov":
            mbar = self._shift(run)
            if mbar is not None:
                w.sub_(mbar, alpha=self.lr)

    def correct_gradient(self, w, g, run):
        if self.variant == "heavy_ball":
            mbar = self._shift(run)
            if mbar is not None:
                g.add_(mbar)

    def pack_refusal(self):
        if self.kd_lambda > 0:
            return "FedADC+ (algorithm.options.kd_lambda > 0) distils from a teacher model in its local loss"
        return None  # without distillation, local_loss is the model's loss

    def local_loss(self, model, x, y, run):
        logits = model(x)
        if self.kd_lambda == 0:
            return model.loss(logits, y)
        tau = self.kd_temperature
        with torch.no_grad():
            teacher_probs = F.softmax(self.teacher.module(x) / tau, dim=1)
            target = self_confidence_targets(teacher_probs, y, self.rho[run.client_id])
        lam = self.kd_lambda
        return (1.0 - lam) * F.cross_entropy(logits, y) + lam * kd_loss(logits, target, tau)

    # ---- server side ---------------------------------------------------------------------------
    def server_update(self, params, buffers, reduced):
        mean_delta = reduced["delta"]  # float64: sum_i p_i (w_i - theta_t) = -eta * Delta_bar
        m_old = self.m.to(torch.float64)
        carry = self.beta_global - self.beta_local
        m_new = mean_delta / (-self.lr) + carry * m_old
        # theta - alpha eta m_new, written so that the FedAvg case adds mean_delta exactly.
        step = self.alpha * mean_delta
        if carry != 0.0:
            step = step - (self.alpha * self.lr * carry) * m_old
        params.add_(step.to(params.dtype))
        self.m.copy_(m_new.to(self.m.dtype))
        buffers.copy_(reduced["buffers"])
        self.round_metrics = {"momentum_norm": float(self.m.norm())}

    def server_state(self):
        return {**super().server_state(), "m": self.m.clone()}

    def load_server_state(self, state):
        super().load_server_state(state)
        self.m.copy_(state["m"])

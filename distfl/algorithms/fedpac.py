"""FedPAC (Xu, Tong, Huang, "Personalized Federated Learning with Feature Alignment and Classifier
Collaboration", ICLR 2023), Algorithm 1; docs/algorithms/fedpac.md maps it to this file.

A shared feature extractor theta (the body) and a classifier head phi_i per client (`head_coordinates`),
features z = f_theta(x) of width d, K classes. Round t, client i of the cohort S_t (m clients):
  1. statistics with theta^t (eval mode, every training sample once): n_{i,k}, p_i(k) = n_{i,k} / n_i,
     h_i[k] = p_i(k) mu_{i,k} (mu_{i,k}: mean feature of class k) and
     V_i = (1 / n_i) (sum_k p_i(k) E[||z||^2 | y = k] - sum_k ||p_i(k) mu_{i,k}||^2)   (tr Cov of z y^T, over n_i)
  2. head pass: algorithm.options.head_epochs epochs of SGD on phi_i, body frozen at theta^t (paper: 1; its
     gradient times options.head_lr_scale)
  3. body pass: train.local_epochs / local_steps of SGD on theta, head frozen at the new phi_i, on
        CE(phi_i(z), y) + lam * R,  R = mean over the batch of ||z - c[y]||^2 / d   (align_reduction=mean; sum: no / d)
     c[k]: the global centroid of class k where the last round's cohort held class k, else the client's own
     centroid of step 1; no alignment before the first global centroids exist
  4. centroids with the trained theta_i (eval mode): sum_l 1(y_l = k) z_l and n_{i,k}
  send theta_i - theta^t (weighted), phi_i, V_i, h_i, the class sums
Server: theta^{t+1} by FedAvg on the body (the global head stays the initial one);
  c_k = sum_i n_{i,k} c_{i,k} / sum_i n_{i,k} over the cohort's clients holding class k;
  for each i in S_t: alpha_i = argmin_{alpha >= 0, sum alpha = 1}  alpha^T (diag(V) + D_i) alpha,
     D_i[j, j'] = sum_k <h_i[k] - h_j[k], h_i[k] - h_j'[k]>   (the paper's quadratic program, `simplex_qp`)
  and client i's head becomes phi_i^{t+1} = sum_j alpha_ij phi_j.
The clients' heads live in the server state (a client that has not been sampled uses the initial head);
eval.clients scores (theta^t, phi_i). Each client's values reach the server through one slot of the round's
segments: its place in the cohort, which `client_weight` is told.
"""
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ..errors import ConfigError
from ..federation.aggregate import Segment
from ..federation.local import samples_trained
from .base import Algorithm
from .model_parts import head_coordinates


@dataclass
class FedPACOptions:
    lam: float = field(default=1.0, metadata={"range": ">= 0"})  # weight of the feature alignment term R (the authors' code: 1, with align_reduction=mean)
    align_reduction: str = field(default="mean", metadata={"choices": ["mean", "sum"]})  # R per sample: mean (the authors' code, nn.MSELoss: ||z - c_y||^2 / d) | sum (the paper's ||z - c_y||^2)
    head_epochs: int = field(default=1, metadata={"range": ">= 1"})  # epochs of the head (body frozen) each round before the body's train.local_epochs (paper: 1)
    head_lr_scale: float = field(default=1.0, metadata={"range": "> 0"})  # the head pass's gradient is multiplied by it: its lr times the scale under plain SGD (the paper: one step size; the authors' code: 0.1 for the head, 0.01 for the body on FMNIST, i.e. 10)
    combine: bool = True  # classifier collaboration: each client's new head is the combination of the cohort's heads by its quadratic program's weights; false: it keeps its own head (the paper's ablation)
    min_weight: float = field(default=0.0, metadata={"range": "[0, 1)"})  # combination weights below it are set to 0 and the rest rescaled to sum 1 (the authors' code: 1e-3); 0: the program's weights as they are


class FedPAC(Algorithm):
    name = "fedpac"
    personalised = True
    head_split = True
    why_not_private = ("FedPAC releases each client's classifier head, feature statistics (V_i, h_i) and class feature "
                       "sums unclipped and unnoised beside its model update")
    Options = FedPACOptions

    @classmethod
    def check_config(cls, cfg):
        if cfg.train.cohort == "poisson":
            raise ConfigError("algorithm.name=fedpac combines the heads of a cohort of at most train.clients_per_round "
                              "clients; train.cohort=poisson has no such bound: use train.cohort=random or sequential")

    def __init__(self, cfg, population, worker, device, model_factory=None):
        super().__init__(cfg, population, worker, device, model_factory)
        self.head = head_coordinates(worker, cfg.model.name)
        self.body = ~self.head
        self.head_index = self.head.nonzero().squeeze(1)
        self.num_classes = int(population.class_counts.shape[1])
        self.dim = int(worker.module.feature_dim)
        self.slots = min(cfg.train.clients_per_round, len(population))
        self.heads: dict[int, torch.Tensor] = {}  # client -> its head phi_i (server state)
        self.centroids = torch.zeros(self.num_classes, self.dim, device=device)  # c^t
        self.present = torch.zeros(self.num_classes, dtype=torch.bool, device=device)
        self.slot_of: dict[int, int] = {}  # this round: client -> its place in the cohort
        self._targets = None  # the client training now: c[k] of its body pass, or None (no alignment)
        self._stats = self._phead = self._post = None  # ... its V_i and h_i, phi_i, and step 4's class sums

    def evaluated_finetune_epochs(self) -> int:
        return 0

    def client_weight(self, client_id, cohort):
        self.slot_of[client_id] = list(cohort).index(client_id)
        return super().client_weight(client_id, cohort)

    def local_samples(self, num_samples, train_cfg):
        fold = self.layout.fold_single
        return (samples_trained(num_samples, train_cfg.batch_size, self.options.head_epochs, fold_single=fold)
                + samples_trained(num_samples, train_cfg.batch_size, train_cfg.local_epochs, train_cfg.local_steps,
                                  fold))

    # ---- client ----------------------------------------------------------------------------------
    def _load_head(self, client_id, worker):
        if client_id in self.heads:
            worker.params[self.head_index] = self.heads[client_id]

    def begin_client(self, run, worker):
        super().begin_client(run, worker)
        self._load_head(run.client_id, worker)

    def load_evaluated_model(self, run, worker):
        self._load_head(run.client_id, worker)

    @torch.no_grad()
    def class_sums(self, run, worker):
        """Over the client's training samples (as its local SGD holds them, `run.sgd`), in order and in eval mode:
        per class k, n_k, sum z and sum ||z||^2 (float64). No random numbers are drawn, no augmentation applied."""
        model, sgd = worker.module, run.sgd
        model.eval()
        counts = torch.zeros(self.num_classes, dtype=torch.float64, device=self.device)
        sums = torch.zeros(self.num_classes, self.dim, dtype=torch.float64, device=self.device)
        squares = torch.zeros(self.num_classes, dtype=torch.float64, device=self.device)
        batch = self.cfg.eval.batch_size
        for start in range(0, len(sgd.indices), batch):
            idx = sgd.indices[start:start + batch]
            y = sgd.data.train_y[idx]
            z = model.represent(sgd.data.train_x[idx]).double()
            counts.index_add_(0, y, torch.ones_like(y, dtype=torch.float64))
            sums.index_add_(0, y, z)
            squares.index_add_(0, y, (z * z).sum(1))
        model.train()
        return counts, sums, squares

    def local_training(self, run, worker):
        counts, sums, squares = self.class_sums(run, worker)  # 1. statistics with theta^t
        n = counts.sum()
        self._stats = ((squares.sum() / n - (sums * sums).sum() / n ** 2) / n, sums / n)  # V_i, h_i = p_i(k) mu_ik
        own = sums / counts.clamp_min(1).unsqueeze(1)
        self._targets = (torch.where(self.present.unsqueeze(1), self.centroids.double(), own).float()
                         if bool(self.present.any()) else None)
        run.train(epochs=self.options.head_epochs, trainable=self.head, name="head")  # 2.
        self._phead = worker.params[self.head_index]  # phi_i (the body pass leaves it; index tensor indexing copies)
        run.train(trainable=self.body, name="body")  # 3.
        self._post = self.class_sums(run, worker)[:2]  # 4.

    def local_loss(self, model, x, y, run):
        if run.pass_name != "body" or self._targets is None or self.options.lam == 0:
            return super().local_loss(model, x, y, run)
        z = model.represent(x)
        gap = (z - self._targets[y]).pow(2)
        align = gap.mean() if self.options.align_reduction == "mean" else gap.sum(1).mean()
        return model.loss(model.head(z), y) + self.options.lam * align

    def correct_gradient(self, w, g, run):
        if run.pass_name == "head" and self.options.head_lr_scale != 1.0:
            g.mul_(self.options.head_lr_scale)

    def segments(self):
        m, k, d = self.slots, self.num_classes, self.dim
        return super().segments() + [
            Segment("pac_client", m, kind="int"),  # client id + 1 in its slot (0: empty)
            Segment("pac_head", m * len(self.head_index)),  # phi_i after the head pass
            Segment("pac_var", m, frac_bits=24),  # V_i
            Segment("pac_h", m * k * d),  # h_i
            Segment("pac_count", k, kind="int"),  # n_k over the cohort
            Segment("pac_sum", k * d, frac_bits=24),  # sum of the trained features of class k over the cohort
        ]

    def client_statistics(self, run, worker, stats):
        self.add_update(stats, (worker.params - run.global_params).masked_fill(self.head, 0.0), run.weight)
        stats.add("buffers", worker.buffers, run.weight)
        slot, m = self.slot_of.pop(run.client_id), self.slots
        var, h = self._stats
        one = torch.zeros(m, dtype=torch.int64, device=self.device)
        one[slot] = run.client_id + 1
        stats.add("pac_client", one)
        stats.add("pac_head", _in_slot(self._phead, slot, m))
        stats.add("pac_var", _in_slot(var.reshape(1), slot, m))
        stats.add("pac_h", _in_slot(h.reshape(-1), slot, m))
        counts, sums = self._post
        stats.add("pac_count", counts.round().long())
        stats.add("pac_sum", sums.reshape(-1))

    # ---- server ----------------------------------------------------------------------------------
    def server_update(self, params, buffers, reduced):
        super().server_update(params, buffers, reduced)
        k, d = self.num_classes, self.dim
        counts = reduced["pac_count"].to(self.device)
        sums = reduced["pac_sum"].to(self.device, torch.float64).view(k, d)
        self.present = counts > 0
        self.centroids = torch.where(self.present.unsqueeze(1), sums / counts.clamp_min(1).unsqueeze(1), 0.0).float()
        filled = reduced["pac_client"].nonzero().squeeze(1).tolist()
        clients = [int(reduced["pac_client"][s]) - 1 for s in filled]
        heads = reduced["pac_head"].to(self.device, torch.float64).view(self.slots, -1)[filled]
        var = reduced["pac_var"].to(self.device, torch.float64)[filled]
        h = reduced["pac_h"].to(self.device, torch.float64).view(self.slots, -1)[filled]
        own, support = 0.0, 0
        for i, client in enumerate(clients):
            if self.options.combine:
                alpha = combination_weights(var, h, i, self.options.min_weight)
                self.heads[client] = (alpha @ heads).float()
                own, support = own + float(alpha[i]), support + int((alpha > 0).sum())
            else:
                self.heads[client] = heads[i].float()
        if self.options.combine and clients:  # metrics.jsonl: how much each client keeps of its own head
            self.round_metrics.update(fedpac_own_weight=own / len(clients), fedpac_heads_combined=support / len(clients))

    def server_state(self):
        ids = sorted(self.heads)
        heads = (torch.stack([self.heads[c] for c in ids]) if ids
                 else torch.zeros(0, len(self.head_index), device=self.device))
        return {**super().server_state(), "head_clients": torch.tensor(ids, dtype=torch.int64), "heads": heads,
                "centroids": self.centroids.clone(), "present": self.present.clone()}

    def load_server_state(self, state):
        super().load_server_state(state)
        heads = state["heads"].to(self.device)
        self.heads = {int(c): heads[i] for i, c in enumerate(state["head_clients"].tolist())}
        self.centroids = state["centroids"].to(self.device)
        self.present = state["present"].to(self.device)


def _in_slot(values: torch.Tensor, slot: int, slots: int) -> torch.Tensor:
    """`values` in slot `slot` of `slots` equal parts, zeros elsewhere."""
    out = torch.zeros(slots, values.numel(), dtype=values.dtype, device=values.device)
    out[slot] = values.reshape(-1)
    return out.reshape(-1)


def combination_weights(var: torch.Tensor, h: torch.Tensor, i: int, min_weight: float = 0.0) -> torch.Tensor:
    """Client i's weights over the cohort: the paper's program with P = diag(V) + D_i, D_i = A A^T, the rows
    of A being h_i - h_j (`h`: one flattened h_j per row). Weights below `min_weight` are dropped."""
    gaps = h[i] - h
    alpha = simplex_qp(torch.diag(var) + gaps @ gaps.T)
    if min_weight > 0:
        keep = alpha >= min_weight
        keep[torch.argmax(alpha)] = True
        alpha = torch.where(keep, alpha, 0.0)
        alpha = alpha / alpha.sum()
    return alpha


def simplex_qp(P: torch.Tensor, max_iter: int = 0) -> torch.Tensor:
    """argmin a^T P a over the simplex {a >= 0, sum a = 1}, P symmetric positive semi-definite (float64): the
    primal active-set method (Nocedal & Wright, Numerical Optimization, Algorithm 16.3) from the best vertex.
    Each iterate is exact up to rounding (a linear solve per step), and a finite number of steps reaches the
    optimum; the solution is a function of P alone, so every rank finds the same."""
    m = P.shape[0]
    scale = float(P.abs().max()) or 1.0
    tol = 1e-12 * scale
    start = int(torch.argmin(torch.diagonal(P)))
    a = torch.zeros(m, dtype=torch.float64, device=P.device)
    a[start] = 1.0
    free = [start]
    for _ in range(max_iter or 20 * m + 20):
        support = torch.tensor(sorted(free), device=P.device)
        step = _affine_minimum(P[support][:, support]) - a[support]
        if float(step.abs().max()) <= 1e-12:
            grad = P @ a
            multipliers = grad - a @ grad  # of the bounds a_j >= 0, j outside the support
            outside = [j for j in range(m) if j not in free]
            if not outside:
                return a
            j = min(outside, key=lambda j: float(multipliers[j]))
            if float(multipliers[j]) >= -tol:
                return a
            free.append(j)
            continue
        t, block = 1.0, None
        for where, s in zip(support.tolist(), step.tolist()):
            if s < 0 and float(a[where]) / -s < t:
                t, block = float(a[where]) / -s, where
        a[support] = (a[support] + t * step).clamp_min(0.0)
        if block is not None:
            a[block] = 0.0
            free.remove(block)
    return a


def _affine_minimum(Q: torch.Tensor) -> torch.Tensor:
    """argmin x^T Q x subject to sum x = 1 (no sign constraint): the KKT system [2Q 1; 1^T 0] [x; nu] = [0; 1]
    (least squares where Q is singular on the constraint's plane)."""
    m = Q.shape[0]
    kkt = torch.zeros(m + 1, m + 1, dtype=torch.float64, device=Q.device)
    kkt[:m, :m], kkt[:m, m], kkt[m, :m] = 2 * Q, 1.0, 1.0
    rhs = torch.zeros(m + 1, dtype=torch.float64, device=Q.device)
    rhs[m] = 1.0
    try:
        return torch.linalg.solve(kkt, rhs)[:m]
    except RuntimeError:  # torch.linalg.LinAlgError: singular
        return torch.linalg.lstsq(kkt.unsqueeze(0), rhs.unsqueeze(0).unsqueeze(-1)).solution[0, :m, 0]

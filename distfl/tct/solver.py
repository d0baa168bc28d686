"""Stage-2 local solver of TCT: least squares on eNTK features, SCAFFOLD Algorithm 1 (tct.md §1.3-1.5).

Client k holds features Z (n x p, float32 or float16 storage) and centred targets Ytil = onehot - 1/C
(n x C). The model is psi = (W in R^{p x C}, b in R^C), kept as ONE float64 tensor of shape
(p+1) x C whose last row is b^T (p x C when `bias=False`). With the ones-augmented features
Zt = [Z, 1] the prediction is Zt psi, and the client gradient is the reference code's convention
(tct.md §1.3):

    g_k(psi) = (1/n) Zt^T (Zt psi - Ytil),

i.e. the gradient of (1/(2n)) ||Zt psi - Ytil||_F^2; its last row is the bias gradient
(1/n) sum_i (W^T z_i + b - y_i). Zt is never materialised: products with it are Z-products plus a
rank-one term, taken in row chunks so a float16 Z is converted to the compute dtype one block at a time.

Algorithm 1 (SCAFFOLD, "efficient implementation"), per client and round t:

    h_k <- h_k + (psi^t - psihat_k) / (M eta)                          (Eq. 2)
    psi_{m+1} = psi_m - eta (g_k(psi_m) - h_k),  m = 0..M-1, psi_0 = psi^t  (Eq. 3, full batch)
    psihat_k <- psi_M, sent to the server, which sets psi^{t+1} = sum_k p_k psihat_k, p_k = n_k/n.

`LocalLeastSquares.iterative` runs Eq. 3 literally; `LocalLeastSquares.closed_form` returns the same
psi_M at a cost independent of M. `scaffold_client_round` / `fedavg_client_round` are one client's
round of TCT and of the TCT-FedAvg ablation.
"""
from __future__ import annotations

import torch

__all__ = ["LocalLeastSquares", "new_client_state", "scaffold_client_round", "fedavg_client_round"]

# Row blocks of Z are converted to the compute dtype in pieces of at most this many bytes.
DEFAULT_CHUNK_BYTES = 256 * 2**20


class LocalLeastSquares:
    """One client's least-squares problem min_psi (1/(2n)) ||[Z, 1] psi - Y||_F^2 and its M-step GD solver.

    Args:
        Z: n x p features (float16/32/64); kept by reference, never copied whole.
        Y: n x C centred targets (copied to float64 on Z's device).
        bias: augment Z with a ones column (psi has p+1 rows, the last one b^T). The released code has
            no bias; Algorithm 2 has one.
        dtype_compute: dtype of the products with Z (float64 default; float32 is faster, with about
            1e-6 relative error). The kernel eigendecomposition is always float64, and psi, h and all
            results are float64.
        chunk_bytes: memory bound for one converted row block of Z.
        basis: which matrix `closed_form` eigendecomposes: "samples" (the n x n kernel), "features"
            (the (p+1) x (p+1) G), or "auto" (the smaller one). The results agree to round-off.

    All tensors live on Z's device.
    """

    def __init__(self, Z: torch.Tensor, Y: torch.Tensor, bias: bool = True,
                 dtype_compute: torch.dtype = torch.float64, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                 basis: str = "auto"):
        if Z.dim() != 2 or not Z.is_floating_point():
            raise ValueError(f"Z must be a 2-D floating tensor (got shape {tuple(Z.shape)}, dtype {Z.dtype})")
        if Y.dim() != 2 or Y.shape[0] != Z.shape[0]:
            raise ValueError(f"Y must be n x C with n = {Z.shape[0]} rows (got shape {tuple(Y.shape)})")
        if Z.shape[0] < 1:
            raise ValueError("a client needs at least one sample")
        if dtype_compute not in (torch.float32, torch.float64):
            raise ValueError(f"dtype_compute must be torch.float32 or torch.float64 (got {dtype_compute})")
        self.Z = Z
        self.device = Z.device
        self.Y = Y.to(self.device, torch.float64)
        self.bias = bool(bias)
        self.dtype = dtype_compute
        self.n, self.p = Z.shape
        self.num_classes = Y.shape[1]
        self.rows = max(1, int(chunk_bytes) // max(1, self.p * torch.empty((), dtype=dtype_compute).element_size()))
        # Cached by `decompose()`: kernel eigenvectors U (n x n), lambda = eigenvalues / n, Zt^T Y / n.
        self._U: torch.Tensor | None = None
        self._lam: torch.Tensor | None = None
        # Which side is decomposed: the n x n kernel ("samples") or, when p + 1 < n, the
        # (p+1) x (p+1) matrix G itself ("features", U then holds G's eigenvectors V).
        if basis not in ("auto", "samples", "features"):
            raise ValueError(f"basis must be auto, samples or features (got {basis!r})")
        self.basis = basis if basis != "auto" else ("features" if self.p + int(self.bias) < self.n else "samples")
        self._ZtY: torch.Tensor | None = None

    # ----- shapes -------------------------------------------------------------------------------
    @property
    def psi_shape(self) -> tuple[int, int]:
        """(p+1, C) with bias (last row = b^T), else (p, C)."""
        return (self.p + int(self.bias), self.num_classes)

    def zeros(self) -> torch.Tensor:
        """A float64 zero psi (W^0 = 0, b^0 = 0 as in Algorithm 2), also the initial control h."""
        return torch.zeros(self.psi_shape, dtype=torch.float64, device=self.device)

    def _as_psi(self, psi: torch.Tensor, what: str) -> torch.Tensor:
        if tuple(psi.shape) != self.psi_shape:
            raise ValueError(f"{what} must have shape {self.psi_shape} (got {tuple(psi.shape)})")
        return psi.to(self.device, torch.float64)

    # ----- products with Zt = [Z, 1], in row blocks -------------------------------------------------
    def _blocks(self):
        for start in range(0, self.n, self.rows):
            yield start, self.Z[start:start + self.rows].to(self.dtype)

    def _zt_mm(self, V: torch.Tensor) -> torch.Tensor:
        """Zt V (n x k, float64) for V of shape psi_shape[0] x k."""
        Vw = V[:self.p].to(self.dtype)
        out = torch.empty(self.n, V.shape[1], dtype=torch.float64, device=self.device)
        for start, Zb in self._blocks():
            out[start:start + Zb.shape[0]] = Zb @ Vw
        if self.bias:
            out += V[self.p]
        return out

    def _ztT_mm(self, R: torch.Tensor) -> torch.Tensor:
        """Zt^T R (psi_shape[0] x k, float64) for R of shape n x k."""
        out = torch.zeros(self.p + int(self.bias), R.shape[1], dtype=torch.float64, device=self.device)
        Rw = R.to(self.dtype)
        for start, Zb in self._blocks():
            out[:self.p] += Zb.T @ Rw[start:start + Zb.shape[0]]
        if self.bias:
            out[self.p] = R.sum(0)
        return out

    # ----- gradient and the plain loop ----------------------------------------------------------------
    def gradient(self, psi: torch.Tensor) -> torch.Tensor:
        """g_k(psi) = (1/n) Zt^T (Zt psi - Y): the full-batch gradient of Eq. 3 (tct.md §1.3 convention)."""
        psi = self._as_psi(psi, "psi")
        return self._ztT_mm(self._zt_mm(psi) - self.Y) / self.n

    def iterative(self, psi0: torch.Tensor, h: torch.Tensor, eta: float, M: int) -> torch.Tensor:
        """M local steps of Eq. 3, psi <- psi - eta (g_k(psi) - h), from psi0; the reference for `closed_form`."""
        psi, h = self._as_psi(psi0, "psi0").clone(), self._as_psi(h, "h")
        _check_steps(eta, M)
        for _ in range(M):
            psi -= eta * (self.gradient(psi) - h)
        return psi

    # ----- closed form ------------------------------------------------------------------------------
    def decompose(self) -> None:
        """Eigendecompose the kernel K = Zt Zt^T = U diag(s2) U^T once (float64 `eigh`); cached.

        K is accumulated block by block (each block of Z converted separately), so besides K and U
        only two converted row blocks are held. Called lazily by `closed_form`; the cache serves
        every later round of this client.
        """
        if self._U is not None:
            return
        if self.basis == "features":
            self._decompose_features()
            return
        K = torch.zeros(self.n, self.n, dtype=torch.float64, device=self.device)
        for i, Zi in self._blocks():
            for j, Zj in self._blocks():
                if j < i:
                    continue
                block = (Zi @ Zj.T).to(torch.float64)
                K[i:i + Zi.shape[0], j:j + Zj.shape[0]] = block
                if j != i:
                    K[j:j + Zj.shape[0], i:i + Zi.shape[0]] = block.T
        if self.bias:
            K += 1.0
        s2, U = torch.linalg.eigh(K)
        del K
        self._lam = s2 / self.n
        self._U = U
        self._ZtY = self._ztT_mm(self.Y) / self.n

    def _decompose_features(self) -> None:
        """G = Zt^T Zt / n = V diag(lambda) V^T directly, O(n p^2 + p^3): cheaper than the kernel when p + 1 < n."""
        q = self.p + int(self.bias)
        G = torch.zeros(q, q, dtype=torch.float64, device=self.device)
        for _, Zb in self._blocks():
            G[:self.p, :self.p] += (Zb.T @ Zb).to(torch.float64)
            if self.bias:
                G[:self.p, self.p] += Zb.sum(0).to(torch.float64)
        if self.bias:
            G[self.p, :self.p] = G[:self.p, self.p]
            G[self.p, self.p] = self.n
        lam, V = torch.linalg.eigh(G / self.n)
        self._lam, self._U = lam, V
        self._ZtY = self._ztT_mm(self.Y) / self.n

    def decomposition(self) -> dict:
        """What `decompose()` caches (U, lambda, Zt^T Y / n, and the basis), to be saved and given back to
        `use_decomposition` of a solver of the same Z, Y, bias, compute dtype and basis."""
        self.decompose()
        return {"basis": self.basis, "U": self._U, "lam": self._lam, "ZtY": self._ZtY}

    def use_decomposition(self, saved: dict) -> None:
        """Take `saved` (from `decomposition()`) as this solver's decomposition instead of computing it.
        The caller vouches that it is of the same Z, Y, bias and compute dtype; the basis, the shapes
        and the dtype are checked here (ValueError)."""
        d = self.n if self.basis == "samples" else self.p + int(self.bias)
        expected = {"U": (d, d), "lam": (d,), "ZtY": self.psi_shape}
        if saved.get("basis") != self.basis:
            raise ValueError(f"basis {saved.get('basis')!r}, not {self.basis!r}")
        for name, shape in expected.items():
            t = saved.get(name)
            if not isinstance(t, torch.Tensor) or tuple(t.shape) != shape or t.dtype != torch.float64:
                raise ValueError(f"{name} is not a float64 tensor of shape {shape}")
        self._U, self._lam, self._ZtY = (saved[name].to(self.device) for name in ("U", "lam", "ZtY"))

    @property
    def lambda_max(self) -> float:
        """Largest eigenvalue of G = Zt^T Zt / n; the M-step GD is stable iff eta < 2 / lambda_max."""
        self.decompose()
        return float(self._lam[-1].clamp_min(0))

    def memory_bytes(self) -> int:
        """Bytes held by the cached decomposition (U: n x n, lambda: n, Zt^T Y / n: (p+1) x C; all float64)."""
        cached = (self._U, self._lam, self._ZtY)
        return sum(t.numel() * t.element_size() for t in cached if t is not None)

    def _coefficients(self, eta: float, M: int) -> tuple[torch.Tensor, torch.Tensor]:
        """a_i = ((1 - eta l_i)^M - 1) / l_i and c_i = ((1 - (1 - eta l_i)^M) / l_i - M eta) / l_i.

        For 0 < eta l < 1, (1 - eta l)^M - 1 = expm1(M log1p(-eta l)) keeps full relative accuracy for
        small eta l. Below tol = max(n, p+1) * eps * lambda_max (round-off level, negative values
        included) the analytic limits a -> -M eta, c -> -M (M-1) eta^2 / 2 are used. For eta l >= 1 the
        power is taken directly; with |1 - eta l| > 1 it may overflow to +-inf (the GD diverges).
        """
        lam = self._lam
        u = eta * lam
        lam_max = float(lam[-1]) if lam.numel() else 0.0
        tol = max(self.n, self.p + 1) * torch.finfo(self.dtype).eps * max(lam_max, 0.0)
        small = lam <= tol
        safe = torch.where(small, torch.ones_like(lam), lam)
        contracting = (~small) & (u < 1)
        q_minus_1 = torch.where(
            contracting,
            torch.expm1(M * torch.log1p(-torch.where(contracting, u, torch.zeros_like(u)))),
            torch.pow(1 - u, M) - 1,
        )
        a = torch.where(small, torch.full_like(lam, -M * eta), q_minus_1 / safe)
        c = torch.where(small, torch.full_like(lam, -M * (M - 1) * eta * eta / 2),
                        (-q_minus_1 / safe - M * eta) / safe)
        return a, c

    def closed_form(self, psi0: torch.Tensor, h: torch.Tensor, eta: float, M: int) -> torch.Tensor:
        """psi_M of `iterative(psi0, h, eta, M)` exactly (up to round-off), at a cost independent of M.

        Derivation. With Zt = [Z, 1], G = Zt^T Zt / n and r = Zt^T Y / n + h, Eq. 3 reads

            psi_{m+1} = (I - eta G) psi_m + eta r,  so  psi_M = A^M psi_0 + sum_{j<M} A^j eta r,  A = I - eta G.

        Let Zt = U S V^T (thin SVD); U and s2 = S^2 come from the n x n kernel K = Zt Zt^T = U diag(s2) U^T,
        and G = V diag(lambda) V^T with lambda = s2 / n. Any f(G) - f(0) I = V diag(f(lambda) - f(0)) V^T
        = Zt^T U diag((f(lambda) - f(0)) / s2) U^T Zt (using V = Zt^T U S^-1). Applied to
        A^M (f = (1 - eta l)^M) and sum_{j<M} A^j eta (f = (1 - (1 - eta l)^M) / l):

            psi_M = psi_0 + M eta r + Zt^T U diag(a) U^T Zt psi_0 / n + Zt^T U diag(c) U^T Zt r / n,
            a_i = ((1 - eta l_i)^M - 1) / l_i,   c_i = ((1 - (1 - eta l_i)^M) / l_i - M eta) / l_i.

        The component of r outside the row space of Zt is simply added M eta times. Coefficients:
        `_coefficients` (stable for small and zero l_i). Round-off: along the row space the M eta r
        term cancels against the -M eta / l part of c, so the relative error grows like
        eps * M * eta * lambda_max (about 1e-13 at the paper's M eta = 0.025, eta lambda_max <= 2;
        about 1e-7 at M = 1e9, eta lambda_max = 0.5).

        When p + 1 < n the same formula is applied in the eigenbasis of G itself (`basis == "features"`,
        decomposed in O(n p^2 + p^3)), which is cheaper than the n x n kernel.

        Cost per call: K's eigendecomposition once per client (cached, O(n^2 p + n^3)), then two passes
        over Z (Zt [psi_0, r] and Zt^T (.), O(n p C)) and O(n^2 C) with U -- independent of M.

        Divergence: if eta lambda_max > 2 the GD iteration diverges and so does this formula: the result
        holds huge or non-finite values, returned as they are; the caller checks finiteness. A zero
        projection times an infinite coefficient counts as 0 (as in exact arithmetic), so NaN never
        arises from 0 * inf.
        """
        psi0, h = self._as_psi(psi0, "psi0"), self._as_psi(h, "h")
        _check_steps(eta, M)
        self.decompose()
        U = self._U
        r = self._ZtY + h
        C = self.num_classes
        if self.basis == "features":
            # In G's eigenbasis: (1 - eta l)^M = 1 + l a and (1 - (1 - eta l)^M) / l = M eta + l c.
            a, c = self._coefficients(eta, M)
            proj = U.T @ torch.cat([psi0, r], dim=1)
            w = _scale(self._lam * a, proj[:, :C]) + _scale(self._lam * c, proj[:, C:])
            return psi0 + (M * eta) * r + U @ w
        proj = U.T @ self._zt_mm(torch.cat([psi0, r], dim=1))  # U^T Zt [psi_0, r], n x 2C
        a, c = self._coefficients(eta, M)
        w = _scale(a, proj[:, :C]) + _scale(c, proj[:, C:])
        return psi0 + (M * eta) * r + self._ztT_mm(U @ w) / self.n


def _scale(coef: torch.Tensor, proj: torch.Tensor) -> torch.Tensor:
    """diag(coef) proj, with 0 where proj is exactly 0 (so an infinite coefficient gives no NaN there)."""
    return torch.where(proj == 0, torch.zeros_like(proj), coef[:, None] * proj)


def _check_steps(eta: float, M: int) -> None:
    if isinstance(M, bool) or not isinstance(M, int) or M < 1:
        raise ValueError(f"M (local steps) must be a positive integer (got {M!r})")
    if not eta > 0:
        raise ValueError(f"eta must be positive (got {eta!r})")


def _local_steps(solver: LocalLeastSquares, psi0, h, eta, M, method) -> torch.Tensor:
    if method == "closed_form":
        return solver.closed_form(psi0, h, eta, M)
    if method == "iterative":
        return solver.iterative(psi0, h, eta, M)
    raise ValueError(f"method must be 'closed_form' or 'iterative' (got {method!r})")


def new_client_state(solver: LocalLeastSquares) -> dict:
    """Algorithm 1's initial client state: h = 0 and no previous local model (`last` = None)."""
    return {"h": solver.zeros(), "last": None}


def scaffold_client_round(solver: LocalLeastSquares, psi_global: torch.Tensor, state: dict,
                          eta: float, M: int, method: str = "closed_form") -> torch.Tensor:
    """One client's round of Algorithm 1 (SCAFFOLD, tct.md §1.5); returns psihat_k = psi_M.

    `state` (see `new_client_state`) holds the control `h` (psi-shaped float64, starts at 0) and
    `last`, the client's own final local model of the previous round (None in round 0, which means
    psi_global, so h stays 0). The round updates `state` in place:

        h <- h + (psi_global - last) / (M eta)        (Eq. 2; skipped while last is None)
        psi_M = M steps of Eq. 3 from psi_global      (`method`: "closed_form" | "iterative")
        last <- psi_M

    M and eta must be the same every round: Eq. 2 divides the previous round's displacement by them.
    With weighted aggregation psi_global <- sum_k p_k psi_M^k (p_k = n_k / n, footnote 7) the controls
    satisfy sum_k p_k h_k = 0 (tct.md §1.5).
    """
    psi_global = solver._as_psi(psi_global, "psi_global")
    _check_steps(eta, M)
    if state.get("h") is None:
        state["h"] = solver.zeros()
    if state.get("last") is not None:
        state["h"] = state["h"] + (psi_global - state["last"]) / (M * eta)
    psi_M = _local_steps(solver, psi_global, state["h"], eta, M, method)
    state["last"] = psi_M
    return psi_M


def fedavg_client_round(solver: LocalLeastSquares, psi_global: torch.Tensor, state: dict | None,
                        eta: float, M: int, method: str = "closed_form") -> torch.Tensor:
    """One client's round of TCT-FedAvg (the ablation of tct.md §1.7): M local steps of Eq. 3 with h = 0.

    Same signature as `scaffold_client_round` so the two are interchangeable; `state` may be None,
    otherwise its `last` is set to psi_M (and `h` is not used).
    """
    psi_global = solver._as_psi(psi_global, "psi_global")
    psi_M = _local_steps(solver, psi_global, solver.zeros(), eta, M, method)
    if state is not None:
        state["last"] = psi_M
    return psi_M

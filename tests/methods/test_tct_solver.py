"""TCT stage-2 solver (distfl/tct/solver.py): the closed form against M literal GD steps, SCAFFOLD rounds."""
from __future__ import annotations

import pytest
import torch

from distfl.models import build_model
from distfl.config.schema import ModelConfig
from distfl.tct.features import coordinate_index, entk_features, reinit_head
from distfl.tct.solver import (
    LocalLeastSquares,
    fedavg_client_round,
    new_client_state,
    scaffold_client_round,
)

F64 = torch.float64


def rel(a, b):
    return float((a - b).norm() / b.norm())


def problem(n, p, C=4, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    Z = torch.randn(n, p, generator=g).to(dtype)
    Y = torch.randn(n, C, generator=g, dtype=F64)
    return Z, Y, g


def start(solver, g):
    psi0 = torch.randn(solver.psi_shape, generator=g, dtype=F64)
    h = 0.1 * torch.randn(solver.psi_shape, generator=g, dtype=F64)
    return psi0, h


def global_lstsq(Zs, Ys):
    Z = torch.cat([z.to(F64) for z in Zs])
    Zt = torch.cat([Z, torch.ones(len(Z), 1, dtype=F64)], 1)
    return torch.linalg.lstsq(Zt, torch.cat(Ys)).solution


@pytest.mark.parametrize("n,p", [(30, 50), (80, 20)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("chunk_bytes", [None, 1000])  # 1000 bytes: row blocks of a few rows
def test_closed_form_equals_iterative(n, p, bias, chunk_bytes):
    Z, Y, g = problem(n, p, seed=n + p + bias)
    kwargs = {} if chunk_bytes is None else {"chunk_bytes": chunk_bytes}
    solver = LocalLeastSquares(Z, Y, bias=bias, **kwargs)
    assert solver.psi_shape == (p + bias, 4)
    psi0, h = start(solver, g)
    eta = 0.5 / solver.lambda_max
    for M in (1, 7, 500):  # measured up to 1.3e-13 (round-off grows like eps M eta lambda_max)
        assert rel(solver.closed_form(psi0, h, eta, M), solver.iterative(psi0, h, eta, M)) < 1e-12


def test_fp16_storage_and_float32_compute():
    Z, Y, g = problem(40, 60, seed=3, dtype=torch.float16)
    exact = LocalLeastSquares(Z.to(F64), Y)
    psi0, h = start(exact, g)
    eta = 0.5 / exact.lambda_max
    ref = exact.iterative(psi0, h, eta, 50)
    assert rel(LocalLeastSquares(Z, Y).closed_form(psi0, h, eta, 50), ref) < 1e-10
    fast = LocalLeastSquares(Z, Y, dtype_compute=torch.float32)
    assert rel(fast.closed_form(psi0, h, eta, 50), ref) < 1e-4
    assert rel(fast.iterative(psi0, h, eta, 50), ref) < 1e-4


def test_gradient_convention_matches_autograd():
    Z, Y, g = problem(25, 8, seed=4)
    solver = LocalLeastSquares(Z, Y)
    psi = torch.randn(solver.psi_shape, generator=g, dtype=F64, requires_grad=True)
    pred = Z.to(F64) @ psi[:-1] + psi[-1]
    ((pred - Y).pow(2).sum() / (2 * 25)).backward()  # (1/(2n)) ||Zt psi - Y||_F^2
    assert torch.allclose(solver.gradient(psi.detach()), psi.grad, rtol=1e-12, atol=1e-12)
    bias_grad = (pred - Y).sum(0) / 25
    assert torch.allclose(solver.gradient(psi.detach())[-1], bias_grad.detach(), rtol=1e-12, atol=1e-12)


def test_divergence_matches_iterative():
    Z, Y, g = problem(30, 40, seed=5)
    solver = LocalLeastSquares(Z, Y)
    psi0, h = start(solver, g)
    eta = 3.0 / solver.lambda_max  # |1 - eta lambda_max| = 2
    for M in (7, 200):  # diverging but still finite: 2^200 ~ 1.6e60
        it = solver.iterative(psi0, h, eta, M)
        cf = solver.closed_form(psi0, h, eta, M)
        assert torch.isfinite(it).all() and torch.isfinite(cf).all()
        assert rel(cf, it) < 1e-12
    assert solver.closed_form(psi0, h, eta, 200).abs().max() > 1e50
    assert not torch.isfinite(solver.iterative(psi0, h, eta, 2000)).all()
    assert not torch.isfinite(solver.closed_form(psi0, h, eta, 2000)).all()


def test_divergent_direction_with_zero_projection_gives_no_nan():
    # psi0 = h = Y = 0: every GD iterate is exactly 0 however large eta is; the closed form has
    # infinite coefficients there, multiplied by exact zeros.
    Z, _, _ = problem(20, 30, seed=6)
    solver = LocalLeastSquares(Z, torch.zeros(20, 3, dtype=F64))
    eta = 3.0 / solver.lambda_max
    zero = solver.zeros()
    assert torch.equal(solver.iterative(zero, zero, eta, 5), zero)
    assert torch.equal(solver.closed_form(zero, zero, eta, 5000), zero)


@pytest.mark.parametrize("n_base,p", [(10, 30), (40, 15)])
def test_singular_kernel_is_stable(n_base, p):
    base, Y, g = problem(n_base, p, seed=7)
    Z = torch.cat([base, base, base[:5]])  # duplicate rows: K = Zt Zt^T is singular
    Y = torch.randn(len(Z), 4, generator=g, dtype=F64)
    solver = LocalLeastSquares(Z, Y)
    psi0, h = start(solver, g)
    eta = 0.5 / solver.lambda_max
    for M in (7, 500):
        cf = solver.closed_form(psi0, h, eta, M)
        assert torch.isfinite(cf).all()
        assert rel(cf, solver.iterative(psi0, h, eta, M)) < 1e-12


@pytest.mark.parametrize("n,p", [(30, 50), (80, 20)])
def test_kernel_and_feature_space_decompositions_agree(n, p):
    Z, Y, g = problem(n, p, seed=11)
    by_samples = LocalLeastSquares(Z, Y, basis="samples")
    by_features = LocalLeastSquares(Z, Y, basis="features")
    assert LocalLeastSquares(Z, Y).basis == ("features" if p + 1 < n else "samples")
    psi0, h = start(by_samples, g)
    eta = 0.5 / by_samples.lambda_max
    assert by_features.lambda_max == pytest.approx(by_samples.lambda_max, rel=1e-12)
    for M in (1, 500):
        reference = by_samples.iterative(psi0, h, eta, M)
        assert rel(by_samples.closed_form(psi0, h, eta, M), reference) < 1e-12
        assert rel(by_features.closed_form(psi0, h, eta, M), reference) < 1e-12


def test_huge_M_reaches_fixed_point_without_looping():
    # n > p + 1: strongly convex; GD converges to psi* solving G psi = Zt^T Y / n + h.
    Z, Y, g = problem(60, 10, seed=8)
    solver = LocalLeastSquares(Z, Y)
    psi0, h = start(solver, g)
    Zt = torch.cat([Z.to(F64), torch.ones(60, 1, dtype=F64)], 1)
    star = torch.linalg.solve(Zt.T @ Zt / 60, Zt.T @ Y / 60 + h)
    eta = 0.5 / solver.lambda_max
    assert rel(solver.closed_form(psi0, h, eta, 10**6), star) < 1e-8
    # Round-off grows like eps * M * eta * lambda_max (documented in closed_form): ~1e-7 here.
    assert rel(solver.closed_form(psi0, h, eta, 10**9), star) < 1e-6


def test_decomposition_is_computed_once(monkeypatch):
    Z, Y, g = problem(30, 50, seed=9)
    solver = LocalLeastSquares(Z, Y)
    psi0, h = start(solver, g)
    calls = []
    eigh = torch.linalg.eigh
    monkeypatch.setattr(torch.linalg, "eigh", lambda *a, **k: calls.append(1) or eigh(*a, **k))
    first = solver.closed_form(psi0, h, 1e-3, 10)
    second = solver.closed_form(psi0, 2 * h, 1e-3, 20)
    assert len(calls) == 1
    assert rel(second, solver.iterative(psi0, 2 * h, 1e-3, 20)) < 1e-12 and not torch.equal(first, second)


def test_argument_checks():
    Z, Y, g = problem(10, 5, seed=10)
    solver = LocalLeastSquares(Z, Y)
    with pytest.raises(ValueError, match="shape"):
        solver.closed_form(torch.zeros(5, 4, dtype=F64), solver.zeros(), 1e-3, 3)
    with pytest.raises(ValueError, match="M"):
        solver.closed_form(solver.zeros(), solver.zeros(), 1e-3, 0)
    with pytest.raises(ValueError, match="eta"):
        solver.iterative(solver.zeros(), solver.zeros(), 0.0, 3)
    with pytest.raises(ValueError, match="method"):
        scaffold_client_round(solver, solver.zeros(), new_client_state(solver), 1e-3, 3, "exact")
    with pytest.raises(ValueError):
        LocalLeastSquares(Z, Y[:9])


def heterogeneous_clients(seed=0, p=10, C=3, sizes=(15, 25, 40)):
    g = torch.Generator().manual_seed(seed)
    Zs, Ys = [], []
    for k, n in enumerate(sizes):
        Z = 0.5 * (1 + k) * torch.randn(n, p, generator=g) + 0.3 * torch.randn(p, generator=g)
        W = torch.randn(p, C, generator=g, dtype=F64)  # each client its own target map and offset
        Zs.append(Z)
        Ys.append(Z.to(F64) @ W + 0.1 * torch.randn(n, C, generator=g, dtype=F64) + k)
    return Zs, Ys


def run_rounds(solvers, round_fn, eta, M, rounds, method="closed_form", on_round=None):
    weights = [s.n / sum(s.n for s in solvers) for s in solvers]  # p_k = n_k / n (footnote 7)
    psi = solvers[0].zeros()
    states = [new_client_state(s) for s in solvers]
    for t in range(rounds):
        local = [round_fn(s, psi, st, eta, M, method) for s, st in zip(solvers, states)]
        psi = sum(w * x for w, x in zip(weights, local))
        if on_round:
            on_round(t, weights, states)
    return psi


def test_scaffold_controls_sum_to_zero_and_methods_agree():
    Zs, Ys = heterogeneous_clients()
    solvers = [LocalLeastSquares(Z, Y) for Z, Y in zip(Zs, Ys)]
    eta = 0.1 / max(s.lambda_max for s in solvers)
    checked = []

    def invariant(t, weights, states):
        total = sum(w * st["h"] for w, st in zip(weights, states))
        scale = max(float(st["h"].abs().max()) for st in states)
        if t > 0:
            assert scale > 0
        assert float(total.abs().max()) <= 1e-10 * max(scale, 1e-300), t
        checked.append(t)

    closed = run_rounds(solvers, scaffold_client_round, eta, 20, 4, on_round=invariant)
    assert checked == [0, 1, 2, 3]
    iterative = run_rounds(solvers, scaffold_client_round, eta, 20, 4, method="iterative", on_round=invariant)
    assert rel(closed, iterative) < 1e-12


def test_scaffold_converges_to_global_solution_fedavg_does_not():
    Zs, Ys = heterogeneous_clients()
    star = global_lstsq(Zs, Ys)
    solvers = [LocalLeastSquares(Z, Y) for Z, Y in zip(Zs, Ys)]
    eta = 0.1 / max(s.lambda_max for s in solvers)
    scaffold = rel(run_rounds(solvers, scaffold_client_round, eta, 50, 30), star)
    fedavg = rel(run_rounds(solvers, fedavg_client_round, eta, 50, 30), star)
    assert scaffold < 1e-4
    assert fedavg > 0.05  # client drift: FedAvg's fixed point is biased on this split
    first = solvers[0]
    assert torch.equal(fedavg_client_round(first, star, None, eta, 50), first.closed_form(star, first.zeros(), eta, 50))


def test_real_entk_features_closed_form_equals_iterative():
    torch.manual_seed(0)
    model = build_model(ModelConfig(name="simplecnn"), (1, 28, 28), 10)
    reinit_head(model, 1)
    index = coordinate_index(44426, 2000, 123)
    x = torch.rand(200, 1, 28, 28)  # FMNIST-shaped, in [0, 1]
    Z = entk_features(model, x, index, chunk_size=100)
    Z = (Z - Z.mean(0)) / Z.std(0, unbiased=False).clamp_min(1e-8)  # z-scoring as in Algorithm 2
    labels = torch.randint(0, 10, (200,), generator=torch.Generator().manual_seed(0))
    Y = torch.nn.functional.one_hot(labels, 10).to(F64) - 0.1
    solver = LocalLeastSquares(Z, Y)
    eta = 0.5 / solver.lambda_max
    zero = solver.zeros()
    psi0 = 0.01 * torch.randn(solver.psi_shape, dtype=F64)
    h = 1e-3 * torch.randn(solver.psi_shape, dtype=F64)
    for M in (1, 100):
        assert rel(solver.closed_form(zero, zero, eta, M), solver.iterative(zero, zero, eta, M)) < 1e-12
    assert rel(solver.closed_form(psi0, h, eta, 100), solver.iterative(psi0, h, eta, 100)) < 1e-12


@pytest.mark.parametrize("n,p", [(30, 50), (60, 8)])  # kernel (samples) basis, then G's (features) basis
def test_a_saved_decomposition_gives_the_same_bits_and_a_mismatched_one_is_refused(n, p, tmp_path):
    """What `decomposition()` returns, saved and loaded into a new solver of the same Z and Y, gives
    the same closed-form result bit for bit, without decomposing again; one of another shape or basis
    is refused."""
    Z, Y, g = problem(n, p)
    computed = LocalLeastSquares(Z, Y)
    torch.save(computed.decomposition(), tmp_path / "d.pt")
    psi0, h = start(computed, g)
    loaded = LocalLeastSquares(Z, Y)
    loaded.use_decomposition(torch.load(tmp_path / "d.pt", weights_only=True))
    assert torch.equal(loaded._U, computed._U)
    assert torch.equal(loaded.closed_form(psi0, h, 0.01, 40), computed.closed_form(psi0, h, 0.01, 40))
    other_size = LocalLeastSquares(*problem(n + 1, p + 1)[:2])
    with pytest.raises(ValueError, match="shape"):
        other_size.use_decomposition(computed.decomposition())
    other_basis = LocalLeastSquares(Z, Y, basis="features" if computed.basis == "samples" else "samples")
    with pytest.raises(ValueError, match="basis"):
        other_basis.use_decomposition(computed.decomposition())

"""Stage 2 of TCT (distfl/algorithms/tct.py) against the machine: the memory and disk it needs, its
threads, the predicted cost of a client's decomposition, and what tct.lr to try when it blows up."""
from __future__ import annotations

import contextlib
import math
import os
import shutil
import time
from pathlib import Path

import torch

from .features import feature_bytes
from .solver import LocalLeastSquares

DTYPES = {"float32": torch.float32, "float16": torch.float16, "float64": torch.float64}


def available_memory_bytes() -> int:
    """MemAvailable from /proc/meminfo (Linux), else total physical memory."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def memory_plan(sizes: list[int], test_samples: int, p: int, num_classes: int, cfg) -> dict:
    """Bytes stage 2 holds on one node: features (memory store), the cached decompositions, and the
    per-client psi-shaped state (h and the last local model)."""
    dtype = DTYPES[cfg.feature_dtype]
    q = p + 1
    features = feature_bytes(sum(sizes) + test_samples, p, dtype)
    decomposition = sum(8 * min(n, q) ** 2 for n in sizes) if cfg.local_solver == "closed_form" else 0
    state = len(sizes) * 2 * 8 * q * num_classes
    in_memory = (features if cfg.feature_store == "memory" else 0) + decomposition + state
    # the disk store writes the features and, per client, its decomposition with Zt^T Y / n (q x C float64)
    on_disk = features + decomposition + (len(sizes) * 8 * q * num_classes if decomposition else 0) \
        if cfg.feature_store == "disk" else 0
    return {"features": features, "decompositions": decomposition, "client_state": state, "total": in_memory,
            "disk": on_disk}


def disk_shortfall(run_dir: Path, need: int) -> tuple[int, int]:
    """(bytes missing, bytes free) for writing `need` bytes under RUN_DIR/tct, counting the files already
    there as space (a resume reuses them or rewrites them in place)."""
    tct_dir = Path(run_dir) / "tct"
    present = sum(f.stat().st_size for f in tct_dir.rglob("*") if f.is_file()) if tct_dir.exists() else 0
    existing = tct_dir
    while not existing.exists():
        existing = existing.parent
    free = shutil.disk_usage(existing).free
    return max(0, need - present - free), free


@contextlib.contextmanager
def phase_threads(threads: int):
    """torch's intra-op threads set to `threads` inside the block, restored after it."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def decomposition_seconds(solver: LocalLeastSquares, gemm_s: float, eigh_s: float) -> float:
    """Predicted seconds of `solver.decompose()`: building the d x d matrix (d^2 * other multiply-adds in
    the compute dtype, `gemm_s` seconds each) plus its float64 eigendecomposition (`eigh_s` per d^3), d being
    the side eigendecomposed (the samples or the features)."""
    q = solver.p + int(solver.bias)
    d, other = (solver.n, q) if solver.basis == "samples" else (q, solver.n)
    return gemm_s * float(d) ** 2 * other + eigh_s * float(d) ** 3


def probe_rates(dtype: torch.dtype) -> tuple[float, float]:
    """A first guess of (seconds per multiply-add of a Gram product in `dtype`, seconds per d^3 of a float64
    eigh), from problems large enough (~0.1 s) that per-call overheads do not dominate."""
    gen = torch.Generator().manual_seed(0)
    Z = torch.randn(512, 8192, generator=gen).to(dtype)
    t0 = time.perf_counter()
    K = Z @ Z.T
    gemm_s = (time.perf_counter() - t0) / (512 * 512 * 8192)
    K = K.to(torch.float64) / 8192 + torch.eye(512, dtype=torch.float64)
    t0 = time.perf_counter()
    torch.linalg.eigh(K)
    return gemm_s, (time.perf_counter() - t0) / 512 ** 3


# M * eta * lambda_max a stage-2 round aims at when a run must lower tct.lr. On FMNIST #C=1 eNTK features
# (p = 100,000) SCAFFOLD reached 84% at ~140, 83% at ~30, 13% at ~1,400 (docs/algorithms/tct.md): a client's
# control h moves toward its target by about 1 / (M eta lambda) a round, so far past 100 the rounds stall.
TARGET_STEP_TIME = 100.0


def divergence_advice(lr: float, steps: int, lam_max: float) -> str:
    """Why stage 2 blew up and a tct.lr to try (tct.local_steps unchanged), from the largest client eigenvalue."""
    if not lam_max:
        return f"tct.lr={lr:g} is too large; lower tct.lr"
    bound = 2 / lam_max
    why = (f"tct.lr={lr:g} is above 2 / lambda_max = {bound:.3g}, so a client's local steps diverge" if lr >= bound else
           f"tct.lr={lr:g} is below the local bound 2 / lambda_max = {bound:.3g}, so the models grew over the rounds "
           f"(M * eta * lambda_max = {steps * lr * lam_max:.0f}; SCAFFOLD's controls stall far above "
           f"{TARGET_STEP_TIME:.0f})")
    suggestion = round_down(min(TARGET_STEP_TIME / (steps * lam_max), 1 / lam_max))
    return f"{why}; lower tct.lr, e.g. tct.lr={suggestion:g} tct.local_steps={steps}"


def round_down(x: float) -> float:
    """x rounded down to one significant digit."""
    scale = 10.0 ** math.floor(math.log10(x))
    return math.floor(x / scale) * scale

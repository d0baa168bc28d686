"""What every `distfl bench` suite shares: the harness overrides, the log, in-process timing of a
Trainer's rounds (`InProcess`) beside the plain centralised loop over the same SGD steps, and
subprocesses that never outlive the bench (each in its own session, its group killed at the end)."""
from __future__ import annotations

import copy
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

# Bench-only settings: no evaluation before the last round, no checkpoints before the last round,
# no TensorBoard, no progress output.
HARNESS = [
    "eval.every=1000000",
    "checkpoint.every=0",
    "output.tensorboard=false",
    "output.progress=none",
]


SUBPROCESS_TIMEOUT_S = 1800


REPO_ROOT = Path(__file__).resolve().parents[2]


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def batch_sizes_of_rounds(population, cfg, rounds: int) -> list[list[int]]:
    """Per round, the batch sizes of every local SGD step the round's clients take, in order.

    The cohorts are the runner's (Population.cohort with the config's seed, size and rule); a client
    with n samples takes the batches of `federation.local.batch_sizes` (ceil(n / batch) an epoch, the last
    one partial, or train.local_steps of them).
    """
    from ..federation.local import batch_sizes

    tc = cfg.train
    batch_size, local_epochs, local_steps = tc.batch_size, tc.local_epochs, tc.local_steps
    rule = {"rule": tc.cohort} if hasattr(tc, "cohort") else {}
    out = []
    for t in range(1, rounds + 1):
        sizes = []
        for c in population.cohort(cfg.seed, t, tc.clients_per_round, **rule):
            sizes += batch_sizes(int(population.sizes[c]), batch_size, local_epochs, local_steps)
        out.append(sizes)
    return out


def client_batches_of_rounds(trainer, rounds: int) -> list[list[torch.Tensor]]:
    """Per round, the sample indices of every local SGD step the round's clients take: each client's own
    keyed batch stream (its generator seeded as `train_client` seeds it, then `federation.local.batch_indices`),
    so a plain loop over them trains on exactly the batches the FL rounds train on. Drawn outside every
    timing; the torch RNG state is put back afterwards."""
    from ..federation.local import batch_indices, seed_local_rng
    from ..federation.population import client_seed

    cfg, tc = trainer.cfg, trainer.cfg.train
    rule = {"rule": tc.cohort} if hasattr(tc, "cohort") else {}
    state = torch.get_rng_state()
    out = []
    try:
        for t in range(1, rounds + 1):
            batches = []
            for c in trainer.population.cohort(cfg.seed, t, tc.clients_per_round, **rule):
                indices = trainer.client_indices[c]
                seed_local_rng(client_seed(trainer.algorithm.seed, t, c), indices.device)
                batches += list(batch_indices(indices, tc, fold_single=trainer.worker.fold_single))
            out.append(batches)
    finally:
        torch.set_rng_state(state)
    return out


def plain_loop(model: torch.nn.Module, train_x: torch.Tensor, train_y: torch.Tensor, batches: list[torch.Tensor],
               lr: float, step: str = "optim") -> dict:
    """A plain PyTorch training loop over `batches` (sample indices, each batch gathered from the training
    set as it is used, as a client's are); returns the loop's wall time and this process's CPU time
    (`wall_s`, `cpu_s`; on a GPU the loop waits for the device at its end, as a round does).
    `step`: "optim" is the loop a user writes (torch.optim.SGD, zero_grad() then step()); "lean" hands each
    backward pass's gradients over (`.grad` unset) and adds them to the parameters with one
    `torch._foreach_add_`, the arithmetic of distfl's plain-SGD local step with nothing else around it: the
    stricter reference."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=lr) if step == "optim" else None
    model.train()
    t0, c0 = time.perf_counter(), time.process_time()
    for idx in batches:
        x, y = train_x[idx], train_y[idx]
        loss = F.cross_entropy(model(x), y)
        if opt is not None:
            opt.zero_grad()
            loss.backward()
            opt.step()
            continue
        loss.backward()
        with torch.no_grad():
            torch._foreach_add_(params, [p.grad for p in params], alpha=-lr)
        for p in params:
            p.grad = None
    if params and params[0].is_cuda:
        torch.cuda.synchronize(params[0].device)
    return {"wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0}


def centralised_loop(model: torch.nn.Module, train_x: torch.Tensor, train_y: torch.Tensor,
                     batch_sizes: list[int], lr: float, seed: int) -> float:
    """Plain SGD over `batch_sizes` batches drawn (without replacement, epoch by epoch) from the
    whole training set; returns the wall time of the loop."""
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    model.train()
    n = len(train_y)
    perm, pos = None, n
    t0 = time.perf_counter()
    for bs in batch_sizes:
        if pos + bs > n:
            perm, pos = torch.randperm(n, generator=gen), 0
        idx = perm[pos : pos + bs]
        pos += bs
        x, y = train_x[idx], train_y[idx]
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return time.perf_counter() - t0


def fresh_model(cfg, data) -> torch.nn.Module:
    from ..models import build_model

    torch.manual_seed(cfg.seed)
    return build_model(cfg.model, data.input_shape, data.num_classes)


class InProcess:
    """One Trainer (world size 1) whose rounds are timed, reset to its initial state before each run."""

    def __init__(self, rounds: int, overrides: list[str]):
        from .. import dist
        from ..config import load_config
        from ..federation.runner import Trainer

        self.rounds = rounds
        self.cfg = load_config(None, overrides)
        self.ctx = dist.init(self.cfg.runtime.device, self.cfg.runtime.threads, tf32=self.cfg.runtime.tf32)
        self.trainer = Trainer(self.cfg, self.ctx)
        tr = self.trainer
        self.init_params = tr.global_params.clone()
        self.init_buffers = tr.global_buffers.clone()
        self.init_int = [t.clone() for t in tr.worker._int_snapshot]
        self.init_server = copy.deepcopy(tr.algorithm.server_state())
        self.batches = batch_sizes_of_rounds(tr.population, self.cfg, rounds)
        self.client_batches = client_batches_of_rounds(tr, rounds)
        if [[len(b) for b in r] for r in self.client_batches] != self.batches:
            raise RuntimeError("bench: the clients' batches do not have the sizes of the round's steps")

    def reset(self) -> None:
        tr = self.trainer
        tr.global_params.copy_(self.init_params)
        tr.global_buffers.copy_(self.init_buffers)
        tr.worker._int_snapshot = [t.clone() for t in self.init_int]
        tr.algorithm.load_server_state(copy.deepcopy(self.init_server))

    def time_fl(self, rounds: int | None = None) -> dict:
        from .. import dist

        rounds = self.rounds if rounds is None else rounds
        self.reset()
        calls0 = dist.COLLECTIVE_CALLS["round_stats"]
        bytes0 = dist.COLLECTIVE_BYTES["round_stats"]
        round_s, samples = [], 0
        t0, c0 = time.perf_counter(), time.process_time()
        for t in range(1, rounds + 1):
            t1 = time.perf_counter()
            row = self.trainer.run_round(t)
            round_s.append(time.perf_counter() - t1)
            samples += row["samples"]
        total, cpu = time.perf_counter() - t0, time.process_time() - c0
        return {"total_s": total, "cpu_s": cpu, "round_s": round_s, "samples": samples,
                "all_reduce_calls": dist.COLLECTIVE_CALLS["round_stats"] - calls0,
                "all_reduce_bytes": dist.COLLECTIVE_BYTES["round_stats"] - bytes0,
                "bytes_reduced_reported": row["bytes_reduced"]}

    def time_centralised(self, rounds: int | None = None, step: str = "optim") -> dict:
        """`plain_loop` (`step`) of a fresh model over the batches the clients of the first `rounds` rounds
        (all by default) train on, in their order: the same steps on the same samples as `time_fl`."""
        rounds = self.rounds if rounds is None else rounds
        model = fresh_model(self.cfg, self.trainer.data)
        data = self.trainer.data
        batches = [idx for r in self.client_batches[:rounds] for idx in r]
        return plain_loop(model, data.train_x, data.train_y, batches, self.cfg.train.lr, step)


def write_config(path: Path, overrides: list[str], base: str | None = None) -> Path:
    """The YAML config of `base` (a config file, or the defaults) with `overrides`, written to `path`
    for a `distfl train` subprocess."""
    from ..config import dump_config, load_config

    path.write_text(dump_config(load_config(base, overrides)))
    return path


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
    env["OMP_NUM_THREADS"] = "1"
    env["MKL_NUM_THREADS"] = "1"
    env.pop("WORLD_SIZE", None)
    env.pop("RANK", None)
    env.pop("LOCAL_RANK", None)
    return env


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill the process group the bench started for `proc` (its own session), then reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass


def _popen(cmd: list[str], cwd: str, env: dict | None = None, **kw) -> subprocess.Popen:
    return subprocess.Popen(cmd, cwd=cwd, env=env or _env(), start_new_session=True, text=True, **kw)


def _run(cmd: list[str], cwd: str, what: str) -> str:
    proc = _popen(cmd, cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        out, _ = proc.communicate(timeout=SUBPROCESS_TIMEOUT_S)
    finally:
        _kill_group(proc)  # torchrun's workers included; a no-op when all have exited
    if proc.returncode != 0:
        lines = out.splitlines()
        # The workers' tracebacks come first; torchrun's summary of the failure last.
        text = "\n".join(lines[:120] + (["..."] if len(lines) > 160 else []) + lines[max(120, len(lines) - 40):])
        raise RuntimeError(f"bench: {what} failed (exit {proc.returncode}): {' '.join(cmd)}\n{text}")
    return out


def _command_line() -> str:
    argv = list(sys.argv)
    if argv and Path(argv[0]).name == "__main__.py" and Path(argv[0]).parent.name == "distfl":
        argv[0:1] = [sys.executable, "-m", "distfl"]
    return " ".join(argv)


def _median(xs):
    return statistics.median(xs)

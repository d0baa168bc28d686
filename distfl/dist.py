"""Process group, device and the counted collectives.

One code path for every launch: a plain process (world size 1, no process group), torchrun (RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT in the environment). gloo on CPU, NCCL on CUDA with one device
per local rank. Every collective distfl issues goes through this module, which counts calls and bytes
so tests and `distfl bench` can check "one all_reduce per round".
"""
from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as torch_dist

# name -> number of calls / bytes moved, since the process started (or the last reset()).
COLLECTIVE_CALLS: Counter = Counter()
COLLECTIVE_BYTES: Counter = Counter()


def reset_counters() -> None:
    COLLECTIVE_CALLS.clear()
    COLLECTIVE_BYTES.clear()


@dataclass
class DistContext:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str | None  # None when running as a single plain process

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init(device_choice: str = "auto", threads: int = 1) -> DistContext:
    """Join the process group described by the environment, or run alone when there is none."""
    torch.set_num_threads(threads)
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))

    use_cuda = device_choice == "cuda" or (device_choice == "auto" and torch.cuda.is_available())
    if device_choice == "cuda" and not torch.cuda.is_available():
        from .errors import ConfigError

        raise ConfigError("runtime.device=cuda but torch sees no CUDA device; use runtime.device=cpu or auto")
    if use_cuda:
        # Deterministic cuBLAS needs this before the first CUDA call.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    else:
        device = torch.device("cpu")
    # warn_only: a few CUDA backward kernels (adaptive pooling) have no deterministic version.
    torch.use_deterministic_algorithms(True, warn_only=True)

    backend = None
    if world_size > 1:
        backend = "nccl" if use_cuda else "gloo"
        if not torch_dist.is_initialized():
            torch_dist.init_process_group(backend=backend, timeout=timedelta(minutes=30))
    return DistContext(rank=rank, world_size=world_size, local_rank=local_rank, device=device, backend=backend)


def all_reduce_sum(tensor: torch.Tensor, ctx: DistContext, name: str) -> torch.Tensor:
    """In-place SUM over ranks. Counted under `name` even at world size 1, where it is the identity."""
    COLLECTIVE_CALLS[name] += 1
    COLLECTIVE_BYTES[name] += tensor.numel() * tensor.element_size()
    if ctx.world_size > 1:
        torch_dist.all_reduce(tensor, op=torch_dist.ReduceOp.SUM)
    return tensor


def barrier(ctx: DistContext) -> None:
    if ctx.world_size > 1:
        COLLECTIVE_CALLS["barrier"] += 1
        if ctx.backend == "nccl":
            torch_dist.barrier(device_ids=[ctx.device.index])
        else:
            torch_dist.barrier()


def check_same_on_all_ranks(value: int, ctx: DistContext, what: str) -> None:
    """Fail loudly if ranks disagree on `value` (e.g. a config or partition fingerprint)."""
    if ctx.world_size == 1:
        return
    t = torch.tensor([value, -value], dtype=torch.int64, device=ctx.device)
    torch_dist.all_reduce(t, op=torch_dist.ReduceOp.MAX)
    COLLECTIVE_CALLS["check"] += 1
    if int(t[0]) != value or int(-t[1]) != value:
        raise RuntimeError(f"ranks disagree on {what}: every rank must start from the same config and data")


def shutdown(ctx: DistContext) -> None:
    if ctx.world_size > 1 and torch_dist.is_initialized():
        torch_dist.destroy_process_group()

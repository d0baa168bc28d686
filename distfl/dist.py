"""Process group, device and the counted collectives.

One code path for every launch: a plain process (world size 1, no process group), torchrun (RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT in the environment), or one task per rank under `srun` (Slurm:
SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_LOCALID; the master is the first host of the step's node list
and the port is derived from the job id, see `slurm_environment`). gloo on CPU; on CUDA, NCCL when every
rank of a node has a GPU of its own, else gloo over the CUDA tensors (several ranks sharing a GPU, see
`choose_backend`). Every collective distfl issues goes through this module, which counts calls and bytes
so tests and `distfl bench` can check "one all_reduce per round".
"""
from __future__ import annotations

import hashlib
import os
import sys
import time
from collections import Counter
from contextlib import contextmanager
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


def expand_hostlist(nodelist: str) -> list[str]:
    """Slurm's compressed host list -> host names: "gpu[01-03,07],cpu5" -> gpu01 gpu02 gpu03 gpu07 cpu5.

    The same expansion as `scontrol show hostnames`, without running it. Nested ranges such as
    "rack[1-2]-node[01-02]" expand to every combination.
    """
    hosts, group, depth = [], "", 0
    for ch in nodelist.strip() + ",":
        if ch == "," and depth == 0:
            if group:
                hosts.extend(_expand_group(group))
            group = ""
            continue
        depth += (ch == "[") - (ch == "]")
        group += ch
    return hosts


def _expand_group(group: str) -> list[str]:
    start = group.find("[")
    if start < 0:
        return [group]
    end = group.index("]", start)
    prefixes = []
    for part in group[start + 1 : end].split(","):
        lo, _, hi = part.partition("-")
        if hi:
            prefixes += [f"{i:0{len(lo)}d}" for i in range(int(lo), int(hi) + 1)]
        else:
            prefixes.append(lo)
    return [group[:start] + p + rest for p in prefixes for rest in _expand_group(group[end + 1 :])]


def slurm_port(job_id: int, restart_count: int = 0) -> int:
    """The rendezvous port of a Slurm job: a function of the job id (every task computes the same one
    without talking), moved on each requeue so a new allocation never meets a socket of the old one.
    20000-31999: below Linux's ephemeral range (32768+), so no outgoing connection holds it."""
    return 20000 + (job_id + 7919 * restart_count) % 12000


def slurm_environment(env=os.environ) -> dict[str, str] | None:
    """RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT for a task that `srun` started, or None.

    Only inside a job step (SLURM_STEP_ID set): a batch script itself also sees SLURM_PROCID=0 and
    SLURM_NTASKS=N, but it is one process, not N ranks. MASTER_ADDR/MASTER_PORT already in the
    environment win over the derived ones.
    """
    if "SLURM_PROCID" not in env or "SLURM_STEP_ID" not in env:
        return None
    world = env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS") or "1"
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or "localhost"
    job_id = int(env.get("SLURM_JOB_ID", "0"))
    restarts = int(env.get("SLURM_RESTART_COUNT", "0") or 0)
    return {
        "RANK": env["SLURM_PROCID"],
        "WORLD_SIZE": world,
        "LOCAL_RANK": env.get("SLURM_LOCALID", "0"),
        "MASTER_ADDR": env.get("MASTER_ADDR") or expand_hostlist(nodelist)[0],
        "MASTER_PORT": env.get("MASTER_PORT") or str(slurm_port(job_id, restarts)),
    }


def local_world_size(env=os.environ) -> int:
    """How many ranks run on this node: torchrun's LOCAL_WORLD_SIZE, else the largest task count per
    node of the srun step (SLURM_STEP_TASKS_PER_NODE, e.g. "4(x2),3"), else 1."""
    if "LOCAL_WORLD_SIZE" in env:
        return int(env["LOCAL_WORLD_SIZE"])
    tasks = env.get("SLURM_STEP_TASKS_PER_NODE") if "SLURM_STEP_ID" in env else None
    if tasks:
        return max(int(part.split("(")[0]) for part in tasks.split(","))
    return 1


def choose_backend(use_cuda: bool, ranks_per_node: int, gpus: int) -> str:
    """gloo on CPU. On CUDA: NCCL when each rank of the node has a GPU of its own; NCCL refuses two ranks
    on one GPU ("Duplicate GPU detected"), so ranks sharing GPUs use gloo, which all_reduces CUDA tensors
    (through host memory: slower per byte, the same exact int64 sum)."""
    if not use_cuda:
        return "gloo"
    return "nccl" if ranks_per_node <= gpus else "gloo"


def set_deterministic(mode: bool, warn_only: bool = False) -> None:
    """torch.use_deterministic_algorithms without its start-up cost. The public call also sets
    torch._inductor.config.deterministic, and importing that module pulls in torch._dynamo and
    torch._inductor: about 1.9 s of every rank's start (as long as importing torch itself). distfl never
    compiles a model, so it sets only the kernels' switch, unless inductor is already loaded (code that
    compiles imported it), when the public call costs nothing more and covers compiled code too."""
    if "torch._inductor.config" in sys.modules or not hasattr(torch._C, "_set_deterministic_algorithms"):
        torch.use_deterministic_algorithms(mode, warn_only=warn_only)
    else:
        torch._C._set_deterministic_algorithms(mode, warn_only=warn_only)


def cuda_float32_numerics(tf32: bool = False) -> None:
    """What every CUDA run of distfl computes with: cuDNN deterministic with benchmarking off, and TF32
    off for matmuls and convolutions. TF32 rounds their inputs to 10 mantissa bits; off, CUDA results
    are float32 maths. (torch's default leaves TF32 on for convolutions.) Also for code that computes
    on a GPU outside a run, such as `distfl bench`, so it measures what a run computes.
    tf32 (runtime.tf32): TF32 on for both, as torch's default has it for convolutions: tensor-core
    kernels, still deterministic, other bits."""
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32


# How long the rendezvous of init_process_group waits for every rank to join (a rank whose peers never
# come stops then, instead of after the collectives' bound), and how long a collective then waits for
# the other ranks (one rank's round, or rank 0's checkpoint, may take far longer than another's). A
# torchrun worker whose launcher dies stops sooner (distfl/launcher.py).
RENDEZVOUS_TIMEOUT = timedelta(minutes=10)
COLLECTIVE_TIMEOUT = timedelta(minutes=30)


def init(device_choice: str = "auto", threads: int = 1, deterministic: bool = True, tf32: bool = False) -> DistContext:
    """Join the process group described by the environment, or run alone when there is none.

    deterministic: torch must use deterministic kernels, and an op that has none raises (turned into a
    ConfigError by `deterministic_ops`); False lets such ops run, with a warning, giving up bit-identity.
    tf32: runtime.tf32 (`cuda_float32_numerics`).
    """
    torch.set_num_threads(threads)
    if "RANK" not in os.environ:  # torchrun's variables win; else a task that srun started
        slurm = slurm_environment()
        if slurm is not None:
            # In the environment, so env:// rendezvous and the CLI's rank-0-only printing see them.
            os.environ.update(slurm)
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))

    use_cuda = device_choice == "cuda" or (device_choice == "auto" and torch.cuda.is_available())
    if device_choice == "cuda" and not torch.cuda.is_available():
        from .errors import ConfigError

        raise ConfigError("runtime.device=cuda but torch sees no CUDA device; use runtime.device=cpu or auto")
    gpus = torch.cuda.device_count() if use_cuda else 0
    if use_cuda:
        device = torch.device("cuda", local_rank % gpus)
        torch.cuda.set_device(device)
        cuda_float32_numerics(tf32)
    else:
        device = torch.device("cpu")
    set_deterministic(True, warn_only=not deterministic)
    # Deterministic mode also fills every new tensor with NaN (torch.empty included): a pass over memory
    # per allocation that changes no result, since distfl reads no uninitialised memory.
    torch.utils.deterministic.fill_uninitialized_memory = False

    backend = None
    if world_size > 1:
        backend = choose_backend(use_cuda, local_world_size(os.environ), gpus)
        if not torch_dist.is_initialized():
            if hasattr(torch_dist, "set_timeout"):  # torch >= 2.6
                torch_dist.init_process_group(backend=backend, timeout=RENDEZVOUS_TIMEOUT)
                torch_dist.set_timeout(COLLECTIVE_TIMEOUT)
            else:
                torch_dist.init_process_group(backend=backend, timeout=COLLECTIVE_TIMEOUT)
    return DistContext(rank=rank, world_size=world_size, local_rank=local_rank, device=device, backend=backend)


# How torch words the error of an op without a deterministic kernel under use_deterministic_algorithms(True).
_NONDETERMINISTIC = " does not have a deterministic implementation"


@contextmanager
def deterministic_ops():
    """Turn torch's error for an op with no deterministic kernel (e.g. adaptive_avg_pool2d_backward_cuda,
    nll_loss2d_forward_out_cuda_template) into a ConfigError naming the op and the option that proceeds."""
    try:
        yield
    except RuntimeError as exc:
        text = str(exc)
        if _NONDETERMINISTIC not in text:
            raise
        from .errors import ConfigError

        op = text.split(_NONDETERMINISTIC)[0].strip()
        raise ConfigError(
            f"{op} has no deterministic implementation on this device, and runtime.deterministic=true (the "
            "default) requires one, so that runs are bit-identical. Set runtime.deterministic=false to run it "
            "anyway (torch then warns, and results may differ between runs and numbers of ranks), or use a "
            "model without this op") from exc


def all_reduce_sum(tensor: torch.Tensor, ctx: DistContext, name: str) -> torch.Tensor:
    """In-place SUM over ranks. Counted under `name` even at world size 1, where it is the identity."""
    return _counted(tensor, ctx, name, "SUM")


def all_reduce_max(tensor: torch.Tensor, ctx: DistContext, name: str) -> torch.Tensor:
    """In-place MAX over ranks (exact in any order), counted under `name` like `all_reduce_sum`."""
    return _counted(tensor, ctx, name, "MAX")


def _counted(tensor: torch.Tensor, ctx: DistContext, name: str, op: str) -> torch.Tensor:
    COLLECTIVE_CALLS[name] += 1
    COLLECTIVE_BYTES[name] += tensor.numel() * tensor.element_size()
    if ctx.world_size > 1:
        _all_reduce(tensor, getattr(torch_dist.ReduceOp, op), ctx)
    return tensor


# Seconds to wait for gloo to let go of a collective's tensor, and whether waiting is still on (it goes
# off, with a warning, if a torch build ever keeps the reference longer).
GLOO_RELEASE_WAIT_S = 5.0
_wait_for_gloo = True


def _all_reduce(tensor: torch.Tensor, op, ctx: DistContext) -> None:
    """torch_dist.all_reduce, returning only once gloo has let go of `tensor`.

    gloo runs each collective on a worker thread of its own, which drops its reference to the tensor just
    after all_reduce has returned here; that drop takes the GIL (the tensor owns a Python object). If
    this process has begun to exit by then, the thread cannot have the GIL and the process aborts
    ("terminate called without an active exception", SIGABRT) after a run that has finished and saved:
    2 of 40 two-rank runs on 2 busy cores, and one CI run. Waiting here, with the GIL released, until the
    tensor's reference count is back where it was, leaves gloo nothing to release at exit."""
    global _wait_for_gloo
    refs = sys.getrefcount(tensor)
    torch_dist.all_reduce(tensor, op=op)
    if ctx.backend != "gloo" or not _wait_for_gloo:
        return
    deadline = time.monotonic() + GLOO_RELEASE_WAIT_S
    while sys.getrefcount(tensor) > refs:
        if time.monotonic() > deadline:
            _wait_for_gloo = False
            print(f"distfl: warning: gloo still holds a collective's tensor {GLOO_RELEASE_WAIT_S:g}s after "
                  "all_reduce returned; no longer waiting for it (this torch build may abort at exit)",
                  file=sys.stderr, flush=True)
            return
        time.sleep(1e-4)  # releases the GIL, which gloo's thread needs to let go


def barrier(ctx: DistContext) -> None:
    if ctx.world_size > 1:
        COLLECTIVE_CALLS["barrier"] += 1
        if ctx.backend == "nccl":
            torch_dist.barrier(device_ids=[ctx.device.index])
        else:
            torch_dist.barrier()


def fingerprint(data: torch.Tensor | str) -> int:
    """A 56-bit hash of a tensor's float32 bytes or of a text, for `check_same_on_all_ranks`."""
    if isinstance(data, str):
        raw = data.encode()
    else:
        raw = data.detach().to(torch.float32).contiguous().cpu().numpy().tobytes()
    return int.from_bytes(hashlib.sha256(raw).digest()[:7], "little")


def check_same_on_all_ranks(value: int, ctx: DistContext, what: str) -> None:
    """Fail loudly if ranks disagree on `value` (e.g. a config or partition fingerprint)."""
    if ctx.world_size == 1:
        return
    t = torch.tensor([value, -value], dtype=torch.int64, device=ctx.device)
    _all_reduce(t, torch_dist.ReduceOp.MAX, ctx)
    COLLECTIVE_CALLS["check"] += 1
    if int(t[0]) != value or int(-t[1]) != value:
        from .errors import RankDisagreement

        raise RankDisagreement(f"ranks disagree on {what}: every rank must start from the same config and "
                               "data, with the same torch build, on the same device type")


def shutdown(ctx: DistContext) -> None:
    if ctx.world_size > 1 and torch_dist.is_initialized():
        torch_dist.destroy_process_group()

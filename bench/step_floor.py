"""One local SGD step of the cross-device shape (pfl_cnn, batch 10, 3x32x32, 1 thread), against the
cost of its kernels alone: the per-step numbers of docs/performance.md ("Why 0.8x is out of reach here").

    PYTHONPATH=. python bench/step_floor.py [--alternations 30] [--steps 10] [--repeats 30]

Times are CPU time of this process (time.process_time: the least noisy measure on a shared machine).
- the plain loop, as pfl-research runs it: torch.optim.SGD, zero_grad(), NCHW batches;
- the same loop on channels_last batches with each gradient added to its parameter where autograd
  hands it over (distfl's plain-SGD local step, federation/local.py, without its per-client work);
  both medians of `alternations` interleaved runs of `steps` steps, ms a step;
- the kernel floor: each op of one step (forward and backward, the faster memory format) timed alone,
  minimum of `repeats`, and their sum; the ratio floor / plain loop bounds how far below the plain loop
  any trainer's step can go on this shape without changing what is computed.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

from distfl.models.pfl_cnn import build_pfl_cnn

BATCH, SHAPE, CLASSES, LR = 10, (3, 32, 32), 10, 0.1


def cpu_ms(fn, n: int) -> float:
    start = time.process_time()
    for _ in range(n):
        fn()
    return (time.process_time() - start) * 1000 / n


def plain_loop(model, x, y):
    opt = torch.optim.SGD(model.parameters(), lr=LR)

    def step():
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return step


def handed_over(model, x, y):
    x = x.contiguous(memory_format=torch.channels_last)
    params = list(model.parameters())

    @torch.no_grad()
    def update():
        for p in params:
            p.add_(p.grad, alpha=-LR)
            p.grad = None

    def step():
        F.cross_entropy(model(x), y).backward()
        update()
    return step


def kernel_floor(x, y, repeats: int) -> dict:
    """Minimum CPU ms of each op of one step, forward and backward, in the faster memory format."""
    model = build_pfl_cnn(SHAPE, CLASSES)
    f = model.features
    out = {}

    def best(name, make_inputs, op):
        times = []
        for fmt in (torch.contiguous_format, torch.channels_last):
            inputs = make_inputs(fmt)
            times.append(min(cpu_ms(lambda: op(*inputs), 1) for _ in range(repeats)))
        out[name] = min(times)

    def fwd_bwd(module):
        def op(inp):
            module.zero_grad(set_to_none=True)
            module(inp).sum().backward()
        return op

    def act(shape, fmt, grad=True):
        t = torch.randn(BATCH, *shape)
        t = t.contiguous(memory_format=fmt) if t.dim() == 4 else t
        return (t.requires_grad_(grad),)

    best("conv1", lambda fmt: act(SHAPE, fmt, grad=False), fwd_bwd(f.conv1))
    best("relu1", lambda fmt: act((32, 30, 30), fmt), fwd_bwd(f.relu1))
    best("conv2", lambda fmt: act((32, 30, 30), fmt), fwd_bwd(f.conv2))
    best("relu2", lambda fmt: act((64, 28, 28), fmt), fwd_bwd(f.relu2))
    best("max-pool", lambda fmt: act((64, 28, 28), fmt), fwd_bwd(f.pool))
    best("fc1", lambda fmt: act((64 * 14 * 14,), fmt), fwd_bwd(f.fc1))
    best("relu3", lambda fmt: act((128,), fmt), fwd_bwd(f.relu3))
    best("head + loss", lambda fmt: act((128,), fmt),
         lambda inp: F.cross_entropy(model.head(inp), y).backward())
    params = [p.detach() for p in model.parameters()]
    grads = [torch.randn_like(p) for p in params]

    def sgd_update():
        for p, g in zip(params, grads):
            p.add_(g, alpha=-LR)
    out["SGD update"] = min(cpu_ms(sgd_update, 1) for _ in range(repeats))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--alternations", type=int, default=30)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    x, y = torch.randn(BATCH, *SHAPE), torch.randint(0, CLASSES, (BATCH,))
    steps = {"plain loop (NCHW, torch.optim.SGD)": plain_loop(build_pfl_cnn(SHAPE, CLASSES), x, y),
             "channels_last + handed-over gradients": handed_over(build_pfl_cnn(SHAPE, CLASSES), x, y)}
    for step in steps.values():  # warm-up: oneDNN primitives, allocator
        cpu_ms(step, 5)
    times = {name: [] for name in steps}
    for i in range(args.alternations):
        order = list(steps) if i % 2 == 0 else list(reversed(steps))
        for name in order:
            times[name].append(cpu_ms(steps[name], args.steps))
    medians = {name: statistics.median(t) for name, t in times.items()}
    floor = kernel_floor(x, y, args.repeats)
    plain = medians["plain loop (NCHW, torch.optim.SGD)"]
    print(f"torch {torch.__version__}, 1 thread, pfl_cnn, batch {BATCH}, CPU ms a step")
    for name, ms in medians.items():
        print(f"  {name:45s} {ms:7.2f}  ({ms / plain:.2f} of the plain loop)")
    print("  kernels alone (min of %d):" % args.repeats)
    for name, ms in floor.items():
        print(f"    {name:43s} {ms:7.2f}")
    total = sum(floor.values())
    print(f"  {'kernel floor (sum)':45s} {total:7.2f}  ({total / plain:.2f} of the plain loop)")
    print(json.dumps({"step_ms": medians, "kernels_ms": floor, "floor_ms": total, "floor_over_plain": total / plain}))


if __name__ == "__main__":
    main()

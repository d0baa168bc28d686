"""One client's local SGD step of the cross-device shape on a GPU (pfl_cnn, batch 10, 3x32x32), four
ways, to choose how distfl should drive many small clients on CUDA (runtime.pack_size, README
"Client packs"): the numbers of docs/performance.md ("On a GPU").

    PYTHONPATH=. python bench/cuda_step.py [--steps 200] [--repeats 5] [--packs 1,10,50]

- eager: the plain loop (torch.optim.SGD, zero_grad, backward, step), one client;
- graphed: the same step captured once in a CUDA graph and replayed (static input buffers);
- pack P: P clients' steps in one call, `vmap(grad(functional_call))` over stacked parameters, as
  distfl's packs (federation/pack.py) run them, then one fused update of the stacked parameters;
- pack P graphed: that call captured in a CUDA graph;
- pack P graphed unfold: the same, with each convolution computed as `unfold` and a batched matrix
  product (`unfold_conv2d`) instead of cuDNN's grouped convolution, which on an H200 ran one client at a
  time (bench/results/cuda_round_profile_2026-11-27.txt): a candidate for the packs' convolutions, to measure.
`--numerics strict` (default) computes as a distfl run does (`distfl.dist.cuda_float32_numerics`: TF32
off, deterministic cuDNN); `torch` keeps torch's defaults (TF32 convolutions), as the 2026-11-26 numbers did.
Each: milliseconds per client step (wall time between two synchronisations, divided by steps x P),
median of `repeats` measurements after warm-up. A variant that fails (capture refused, say) reports why.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time

import torch
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap

from distfl.models.pfl_cnn import build_pfl_cnn
from step_floor import plain_loop  # bench/: the plain loop pfl-research runs, shared with the CPU floor

BATCH, SHAPE, CLASSES, LR = 10, (3, 32, 32), 10, 0.1


def per_step_ms(step, steps: int, repeats: int, clients: int) -> float:
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1000 / (steps * clients))
    return statistics.median(times)


def batch(clients: int | None = None):
    lead = (clients,) if clients else ()
    x = torch.randn(*lead, BATCH, *SHAPE, device="cuda")
    y = torch.randint(0, CLASSES, (*lead, BATCH), device="cuda")
    return x, y


def eager_step(model):
    return plain_loop(model, *batch())


def graphed_step(model):
    x, y = batch()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture, as torch's docs require
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            opt.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return graph.replay


def unfold_conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """F.conv2d of one client's batch as unfold + a matrix product (vmap turns the product over clients
    into one batched GEMM); groups > 1 or string padding: F.conv2d itself."""
    if groups != 1 or isinstance(padding, str):
        return CONV2D(x, weight, bias, stride, padding, dilation, groups)
    pair = (lambda v: (v, v) if isinstance(v, int) else tuple(v))
    (sh, sw), (ph, pw), (dh, dw) = pair(stride), pair(padding), pair(dilation)
    out_c, _, kh, kw = weight.shape
    cols = F.unfold(x, (kh, kw), dilation=(dh, dw), padding=(ph, pw), stride=(sh, sw))  # B x C*kh*kw x L
    out = weight.reshape(out_c, -1) @ cols
    if bias is not None:
        out = out + bias[:, None]
    height = (x.shape[-2] + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    width = (x.shape[-1] + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    return out.reshape(x.shape[0], out_c, height, width)


CONV2D = F.conv2d


@contextlib.contextmanager
def convolutions(kind: str):
    """F.conv2d as `kind` computes it while the block runs: cudnn (torch's own) or unfold."""
    if kind == "unfold":
        F.conv2d = unfold_conv2d
    try:
        yield
    finally:
        F.conv2d = CONV2D


def pack_step(model, clients: int, graphed: bool, conv: str = "cudnn"):
    names = [n for n, _ in model.named_parameters()]
    stacked = [p.detach().unsqueeze(0).repeat(clients, *([1] * p.dim())).contiguous() for p in model.parameters()]
    x, y = batch(clients)

    def loss(params, xb, yb):
        return F.cross_entropy(functional_call(model, dict(zip(names, params)), (xb,)), yb)

    per_client_grad = vmap(grad(loss), in_dims=(0, 0, 0))

    def step():
        with convolutions(conv):
            grads = per_client_grad(stacked, x, y)
        torch._foreach_add_(stacked, grads, alpha=-LR)
    if not graphed:
        return step
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph.replay


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--packs", default="1,10,50")
    parser.add_argument("--numerics", choices=["strict", "torch"], default="strict")
    args = parser.parse_args()
    if args.numerics == "strict":
        from distfl.dist import cuda_float32_numerics
        cuda_float32_numerics()
    torch.manual_seed(0)
    model = build_pfl_cnn(SHAPE, CLASSES).cuda()
    variants = {"eager": (lambda: eager_step(model), 1), "graphed": (lambda: graphed_step(model), 1)}
    for p in (int(v) for v in args.packs.split(",")):
        variants[f"pack {p}"] = (lambda p=p: pack_step(model, p, False), p)
        variants[f"pack {p} graphed"] = (lambda p=p: pack_step(model, p, True), p)
        variants[f"pack {p} graphed unfold"] = (lambda p=p: pack_step(model, p, True, "unfold"), p)
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "batch": BATCH,
               "numerics": args.numerics,
               "steps": args.steps, "repeats": args.repeats, "ms_per_client_step": {}}
    for name, (make, clients) in variants.items():
        try:
            ms = per_step_ms(make(), args.steps, args.repeats, clients)
        except Exception as e:  # report and go on: one refused capture must not hide the other rows
            ms = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
        results["ms_per_client_step"][name] = ms
        print(f"{name:>18}: {ms if isinstance(ms, str) else f'{ms:.4f} ms per client step'}", flush=True)
    print(json.dumps(results))


if __name__ == "__main__":
    main()

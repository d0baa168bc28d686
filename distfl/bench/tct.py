"""`distfl bench --suite tct`: what TCT's two heavy parts cost, each beside its reference (see `bench`)."""
from __future__ import annotations

import statistics
import time

def _bench_features(model_name: str, p: int | None, data, repeats: int, log, device=None) -> dict:
    """eNTK features of 256 FMNIST training samples for `model_name` at p coordinates (None: all P):
    `entk_features` (the TCT phase's defaults: chunks of `tct.chunk_size`, coordinates in
    `tct.coordinate_order`) and Algorithm 3's loop on the same coordinates, interleaved, alternating which goes first;
    beside them one batched forward + backward pass over the same samples (logit 0 summed, gradients
    with respect to the parameters) for scale. What an exact method computes per sample is the
    multiply-adds of the Linear and Conv2d layers' forward pass, their input gradients (all but the
    first layer's) and their per-sample weight gradients, each as many as the forward's
    (`_layer_macs`; the Linear ones an upper bound when p < P): at this thread's
    float32 matmul rate (`_matmul_gflops`) that gives the least time any method can take, and the
    speedup over the loop it allows. On a GPU (`device`), each timing waits for the GPU's queue before
    it starts and ends; the matmul rate is the GPU's."""
    import torch

    from ..config import load_config
    from ..models import build_model
    from ..tct.features import coordinate_index, entk_features, entk_features_loop, feature_method

    cfg = load_config(None, ["data.dataset=fmnist", f"model.name={model_name}"])
    torch.manual_seed(0)
    device = torch.device(device or "cpu")
    model = build_model(cfg.model, data.input_shape, data.num_classes).to(device)
    num = sum(q.numel() for q in model.parameters())
    tct = cfg.tct
    index = coordinate_index(num, num if p is None else p, tct.coordinate_seed, tct.coordinate_order)
    x = data.train_x[:256].to(device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def forward_backward():
        model.eval()
        torch.autograd.grad(model(x)[:, 0].sum(), list(model.parameters()))

    # Wall-clock seconds, and the CPU seconds of this thread (all the work runs on it with 1 torch
    # thread): on a loaded machine the second is less affected by how much of a core the bench gets.
    entk_features(model, x[:8], index)  # warm-up (untimed): one-time allocations and kernel set-up
    entk_features_loop(model, x[:8], index)
    forward_backward()
    sync()
    wall = {"fast": [], "loop": [], "pass": []}
    cpu = {"fast": [], "loop": [], "pass": []}
    for rep in range(repeats):
        for what in (("fast", "loop", "pass") if rep % 2 == 0 else ("loop", "fast", "pass")):
            t0, c0 = time.perf_counter(), time.thread_time()
            if what == "fast":
                fast = entk_features(model, x, index, chunk_size=tct.chunk_size)
            elif what == "loop":
                ref = entk_features_loop(model, x, index)
            else:
                forward_backward()
            sync()
            wall[what].append(time.perf_counter() - t0)
            cpu[what].append(time.thread_time() - c0)
        log(f"features {model_name} repeat {rep + 1}/{repeats}: fast {wall['fast'][-1]:.3f} s, "
            f"loop {wall['loop'][-1]:.3f} s")
    med = statistics.median
    fast_s, loop_s, pass_s = wall["fast"], wall["loop"], wall["pass"]
    macs, first = _layer_macs(model, x[:1])
    flops = 2 * (3 * macs - first) * len(x)
    gflops = _matmul_gflops(device)
    return {"model": model_name, "device": str(device),
            "where": torch.cuda.get_device_name(device) if device.type == "cuda" else "1 thread", "flops": flops, "matmul_gflops": gflops,
            "loop_gflops": flops / med(loop_s) / 1e9, "vectorised_gflops": flops / med(fast_s) / 1e9,
            "speedup_at_matmul_rate": med(loop_s) / (flops / (gflops * 1e9)), "samples": len(x), "params": num, "coordinates": index.numel(),
            "method": feature_method(model), "chunk_size": tct.chunk_size,
            "coordinate_order": tct.coordinate_order, "repeats": repeats,
            "vectorised_s": med(fast_s), "loop_s": med(loop_s), "forward_backward_s": med(pass_s),
            "vectorised_s_all": fast_s, "loop_s_all": loop_s, "forward_backward_s_all": pass_s,
            "speedup": med(loop_s) / med(fast_s), "speedup_bound": med(loop_s) / med(pass_s),
            "cpu_s": {k: med(v) for k, v in cpu.items()}, "cpu_s_all": cpu,
            "cpu_speedup": med(cpu["loop"]) / med(cpu["fast"]), "cpu_speedup_bound": med(cpu["loop"]) / med(cpu["pass"]),
            "target_speedup": 10, "max_relative_difference": float((fast - ref).abs().max() / ref.abs().max()),
            "vectorised_samples_per_s": len(x) / med(fast_s), "loop_samples_per_s": len(x) / med(loop_s)}


def _layer_macs(model, x1) -> tuple[int, int]:
    """Multiply-adds of one forward pass of the model's Linear and Conv2d layers on one sample: all of
    them, and the first layer's."""
    import torch
    from torch import nn

    macs, handles = [], []

    def count(module, args, output):
        per_output = module.in_features if isinstance(module, nn.Linear) else \
            module.in_channels // module.groups * module.kernel_size[0] * module.kernel_size[1]
        macs.append(output.numel() * per_output)

    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Conv2d)):
            handles.append(module.register_forward_hook(count))
    try:
        with torch.no_grad():
            model.eval()(x1)
    finally:
        for handle in handles:
            handle.remove()
    return sum(macs), macs[0]


def _matmul_gflops(device=None) -> float:
    """This thread's (or GPU's) float32 rate on a 1024 x 1024 matmul (median of 5), in GFLOP/s: about
    the most any kernel of the features reaches on it."""
    import torch

    device = torch.device(device or "cpu")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    a, b = torch.randn(1024, 1024, device=device), torch.randn(1024, 1024, device=device)
    a @ b
    sync()
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        a @ b
        sync()
        times.append(time.perf_counter() - t0)
    return 2 * 1024 ** 3 / statistics.median(times) / 1e9


def bench(repeats: int, log, device: str | None = None) -> dict:
    """TCT's two heavy parts, each beside its reference, on real Fashion-MNIST inputs, 1 thread:
    - eNTK features (`_bench_features`): SimpleCNN with all 44,426 coordinates, and the paper's network
      tct_cnn (454,922 parameters) at the paper's p = 100,000; features are short and noisy on a loaded
      machine, so they run 3 x `repeats` interleaved repeats;
    - stage 2 on one client: the closed-form M = 500 steps vs 500 literal steps (n = 1,000 samples,
      p = 4,096 coordinates, float64), both from the same start; the closed form's one-time
      decomposition is reported apart and amortised over the paper's 100 rounds.
    `device` ("cuda"): the features on the GPU (stage 2 stays on the host, as in a TCT run).
    """
    import torch

    from ..config import load_config
    from ..data.datasets import load_dataset
    from ..dist import cuda_float32_numerics
    from ..models import build_model
    from ..tct.features import coordinate_index, entk_features
    from ..tct.solver import LocalLeastSquares

    import os

    load_at_start = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    torch.set_num_threads(1)
    if device == "cuda":
        # A run's numerics (float32). With torch's default, TF32 convolutions, the two feature methods
        # differed by 1.5e-1 for tct_cnn on an H100; bench/tf32_emulation.py shows TF32 rounding moves
        # the features that far.
        cuda_float32_numerics()
    data = load_dataset(load_config(None, ["data.dataset=fmnist"]).data, 0)
    features = _bench_features("simplecnn", None, data, 3 * repeats, log, device)
    features_tct_cnn = _bench_features("tct_cnn", 100_000, data, 3 * repeats, log, device)

    cfg = load_config(None, ["data.dataset=fmnist", "model.name=simplecnn"])
    torch.manual_seed(0)
    model = build_model(cfg.model, data.input_shape, data.num_classes)
    num = sum(p.numel() for p in model.parameters())
    n, p, c, m, eta = 1000, 4096, 10, 500, 5e-5
    z = entk_features(model, data.train_x[:n], coordinate_index(num, p, 123), chunk_size=128)
    std = z.std(0)
    z = torch.where(std > 1e-7 * std.max(), (z - z.mean(0)) / std, torch.zeros_like(z))  # as the TCT phase
    y = torch.nn.functional.one_hot(data.train_y[:n], c).double() - 1.0 / c
    closed_s, iter_s, decompose_s = [], [], []
    for rep in range(repeats):
        solver = LocalLeastSquares(z, y)
        psi0, h = solver.zeros(), solver.zeros()
        t0 = time.perf_counter()
        solver.decompose()
        decompose_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        closed = solver.closed_form(psi0, h, eta, m)
        closed_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        iterative = solver.iterative(psi0, h, eta, m)
        iter_s.append(time.perf_counter() - t0)
        log(f"stage 2 repeat {rep + 1}/{repeats}: closed form {closed_s[-1]:.3f} s, iterative {iter_s[-1]:.1f} s")
    med = statistics.median
    rounds = 100
    return {
        "features": features, "features_tct_cnn": features_tct_cnn,
        "stage2": {"n": n, "p": p, "classes": c, "local_steps": m, "lr": eta, "basis": solver.basis,
                   "decompose_s": med(decompose_s), "closed_form_round_s": med(closed_s),
                   "iterative_round_s": med(iter_s), "per_round_speedup": med(iter_s) / med(closed_s),
                   "speedup_over_100_rounds": rounds * med(iter_s) / (med(decompose_s) + rounds * med(closed_s)),
                   "target_speedup": 20,
                   "relative_difference": float((closed - iterative).norm() / iterative.norm())},
        "repeats": repeats, "threads": 1, "loadavg_at_start": load_at_start,
    }


def _features_rows(f: dict) -> list[tuple[str, str, str]]:
    coords = "all" if f["coordinates"] == f["params"] else "p"
    return [
        (f"eNTK features, {f['samples']} FMNIST samples x {f['coordinates']:,} coordinates ({coords}), "
         f"{f['model']} ({f['params']:,} params), {f.get('where', '1 thread')}: batched, {f['method']}",
         f"{f['vectorised_s']:.3f} s ({f['vectorised_samples_per_s']:.0f} samples/s)", ""),
        ("... Algorithm 3's per-sample loop", f"{f['loop_s']:.3f} s ({f['loop_samples_per_s']:.0f} samples/s)", ""),
        ("... speedup, median of interleaved repeats (max relative difference)",
         f"{f['speedup']:.2f}x over {f['repeats']} ({f['max_relative_difference']:.1e})",
         f">= {f['target_speedup']}x: {'met' if f['speedup'] >= f['target_speedup'] else '**not met**'}"),
        ("... the same in thread CPU time: batched / loop (speedup)",
         f"{f['cpu_s']['fast']:.3f} s / {f['cpu_s']['loop']:.3f} s ({f['cpu_speedup']:.2f}x)", ""),
        ("... one batched forward + backward with parameter gradients, for scale (loop / this; in CPU time)",
         f"{f['forward_backward_s']:.3f} s ({f['speedup_bound']:.1f}x; {f['cpu_speedup_bound']:.1f}x)", ""),
    ] + ([(f"... arithmetic: ~{f['flops'] / 1e9:.1f} GFLOP (forward, input and per-sample weight gradients); the loop runs it at "
           f"{f['loop_gflops']:.0f} GFLOP/s, the batched at {f['vectorised_gflops']:.0f}, "
           f"{'this thread' if f.get('where', '1 thread') == '1 thread' else 'the GPU'}'s 1024^2 "
           "matmul at (speedup that rate would give)",
           f"{f['matmul_gflops']:.0f} GFLOP/s ({f['speedup_at_matmul_rate']:.1f}x)", "")] if "flops" in f else [])


def markdown(res: dict) -> str:
    s = res["stage2"]
    rows = _features_rows(res["features"]) + _features_rows(res["features_tct_cnn"]) + [
        (f"Stage 2, one client (n = {s['n']}, p = {s['p']:,}): {s['local_steps']} iterative steps",
         f"{s['iterative_round_s']:.2f} s per round", ""),
        ("... closed form (basis: " + s["basis"] + ")", f"{s['closed_form_round_s']:.4f} s per round + "
         f"{s['decompose_s']:.2f} s once", ""),
        ("... speedup per round / over 100 rounds (decomposition included)",
         f"{s['per_round_speedup']:.0f}x / {s['speedup_over_100_rounds']:.1f}x (relative difference {s['relative_difference']:.1e})",
         f">= {s['target_speedup']}x: {'met' if s['speedup_over_100_rounds'] >= s['target_speedup'] else '**not met**'}"),
    ]
    lines = ["| TCT cost | measured | target |", "|---|---|---|"] + [f"| {a} | {b} | {c} |" for a, b, c in rows]
    machine = res.get("machine") or {}
    if res.get("loadavg_at_start") and machine.get("loadavg"):
        lines += ["", f"Load average (1/5/15 min) at the start: {'/'.join(f'{x:.2f}' for x in res['loadavg_at_start'])}, "
                      f"at the end: {'/'.join(f'{x:.2f}' for x in machine['loadavg'])}, on {machine.get('cpu_count')} CPUs."]
    return "\n".join(lines) + "\n"

"""`distfl bench --suite compression`: what each compressor costs a client, per million parameters.

For every compressor of distfl/compression (and error feedback around top-k, PowerSGD on weight-shaped
segments, the count sketch), the seconds to compress and decode one client's update of 10^6 float32
values (PowerSGD: a 1000 x 1000 weight), on the CPU with one thread, medians of `repeats` interleaved
measurements, beside the seconds of a float32 copy of the same vector (the floor). The keyed generator
is built inside the timing, as a client builds it.

Packs: a pack of PACK clients, each with an update of 10^6 / PACK values, compressed one row at a time
(`compress`) and at once over the [pack, d] tensor (`compress_rows`: one top-k, one pass of QSGD's
rounding, ...), in seconds per client per million parameters, on `--device` (default the CPU).
"""
from __future__ import annotations

import statistics
import time

NUMEL = 1_000_000
PACK = 8


def _cases():
    from ..compression import (CountSketch, Drive, Eden, ErrorFeedback, HalfPrecision, PowerSGD, QSGD, RandK,
                               ScaledSign, TopK, keyed_generator)

    sketch = {}

    def run_sketch(x, key):
        if "table" not in sketch:
            sketch["table"] = CountSketch(NUMEL, rows=5, columns=NUMEL // 100, generator=keyed_generator(0))
        return sketch["table"].unsketch(sketch["table"].sketch(x), k=NUMEL // 100)

    feedback, residual = ErrorFeedback(TopK(density=0.01)), {}
    return {
        "copy (floor)": lambda x, key: x.clone(),
        "topk 1%": lambda x, key: TopK(density=0.01).compress(x),
        "topk 10%": lambda x, key: TopK(density=0.1).compress(x),
        "topk 1% + error feedback": lambda x, key: residual.update(r=feedback.compress(x, residual.get("r"))[1]),
        "randk 1%": lambda x, key: RandK(density=0.01).compress(x, keyed_generator(*key)),
        "qsgd 4 bits": lambda x, key: QSGD(bits=4).compress(x, keyed_generator(*key)),
        "qsgd 8 bits": lambda x, key: QSGD(bits=8).compress(x, keyed_generator(*key)),
        "signsgd": lambda x, key: ScaledSign().compress(x),
        "drive": lambda x, key: Drive().compress(x, keyed_generator(*key)),
        "eden 2 bits": lambda x, key: Eden(bits=2).compress(x, keyed_generator(*key)),
        "bf16": lambda x, key: HalfPrecision("bf16").compress(x),
        "powersgd rank 4 (1000 x 1000)": lambda x, key: PowerSGD(rank=4).compress_matrix(
            x.view(1000, 1000), None, keyed_generator(*key)),
        "count sketch 5 x 10^4, top 1%": run_sketch,
    }


def _pack_cases():
    """The compressors with a vectorised `compress_rows` (the others loop over the rows)."""
    from ..compression import QSGD, HalfPrecision, TopK

    return {"topk 1%": TopK(density=0.01), "qsgd 8 bits": QSGD(bits=8), "bf16": HalfPrecision("bf16")}


def bench_packs(repeats: int, log, device) -> dict:
    """Seconds per client per 10^6 parameters of each pack case, one row at a time and over the pack."""
    import torch

    from ..compression import keyed_generator

    rows = torch.randn(PACK, NUMEL // PACK, generator=torch.Generator().manual_seed(1)).to(device)
    sync = torch.cuda.synchronize if rows.is_cuda else (lambda: None)
    ways = {"one at a time": lambda c, gens: [c.compress(row, g) for row, g in zip(rows, gens)],
            "pack": lambda c, gens: c.compress_rows(rows, gens)}
    cases = _pack_cases()
    times = {name: {way: [] for way in ways} for name in cases}
    for rep in range(repeats + 1):  # the first pass warms up, untimed
        for name, compressor in cases.items():
            for way, fn in ways.items():
                sync()
                t0 = time.perf_counter()
                fn(compressor, [keyed_generator(rep, 1, client) for client in range(PACK)])
                sync()
                if rep:
                    times[name][way].append(time.perf_counter() - t0)
        log(f"packs: repeat {rep}/{repeats} done" if rep else "packs: warm-up done")
    return {"pack": PACK, "numel_per_client": NUMEL // PACK, "device": str(rows.device),
            "median_s_per_million": {name: {way: statistics.median(t) * 1e6 / NUMEL for way, t in by_way.items()}
                                     for name, by_way in times.items()}}


def bench(repeats: int, log, device=None) -> dict:
    import torch

    torch.set_num_threads(1)
    x = torch.randn(NUMEL, generator=torch.Generator().manual_seed(0))
    cases = _cases()
    for name, fn in cases.items():  # warm-up (and the sketch's hashes) untimed
        fn(x, (0, 0))
    times = {name: [] for name in cases}
    for rep in range(repeats):
        order = list(cases) if rep % 2 == 0 else list(reversed(cases))
        for name in order:
            t0 = time.perf_counter()
            cases[name](x, (rep, 1))
            times[name].append(time.perf_counter() - t0)
        log(f"repeat {rep + 1}/{repeats} done")
    return {"numel": NUMEL, "threads": 1, "seconds": times,
            "median_s_per_million": {name: statistics.median(t) * 1e6 / NUMEL for name, t in times.items()},
            "packs": bench_packs(repeats, log, device or "cpu")}


def markdown(res: dict) -> str:
    rows = ["| compressor | seconds per client per 10^6 parameters (median) |", "|---|---|"]
    rows += [f"| {name} | {s:.4f} |" for name, s in res["median_s_per_million"].items()]
    return (f"# Compression cost per client (`{res['bench']}`)\n\nCPU, 1 thread, {res['numel']:,} float32 values, "
            f"medians over {len(next(iter(res['seconds'].values())))} interleaved repeats.\n\n" + "\n".join(rows) + "\n"
            + _packs_markdown(res["packs"]))


def _packs_markdown(packs: dict) -> str:
    rows = ["| compressor | one at a time | over the pack |", "|---|---|---|"]
    rows += [f"| {name} | {s['one at a time']:.4f} | {s['pack']:.4f} |" for name, s in packs["median_s_per_million"].items()]
    return (f"\n## In packs\n\n{packs['pack']} clients of {packs['numel_per_client']:,} values on {packs['device']}, "
            "seconds per client per 10^6 parameters (median).\n\n" + "\n".join(rows) + "\n")

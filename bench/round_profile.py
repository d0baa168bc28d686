"""Where a packed cross-device round spends its time on a GPU: seconds per round for pack sizes with
runtime.cuda_graphs on and off, then one round profiled (host functions by cProfile; GPU kernel time by
torch.profiler), to tell the local steps from the work around them.

    PYTHONPATH=. python bench/round_profile.py [--rounds 10] [--variants 1:off,50:off,50:on] [--profile 50:on]

The workload is `distfl bench --suite cross-device`'s (pfl-research's CIFAR-10 shape, pfl_cnn, batch 10).
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import tempfile

import torch

from distfl.bench.cross_device import WORKLOAD
from distfl.bench.harness import HARNESS, InProcess


def trainer(tmp: str, pack: int, graphs: str, rounds: int, device: str) -> InProcess:
    return InProcess(rounds, WORKLOAD + HARNESS + [f"runtime.device={device}", f"train.rounds={rounds}",
                                                   f"runtime.pack_size={pack}", f"runtime.cuda_graphs={graphs}",
                                                   f"output.dir={tmp}/p{pack}{graphs}"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--variants", default="1:off,10:on,50:off,50:on")
    parser.add_argument("--profile", default="50:on")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    variants = [(int(v.split(":")[0]), v.split(":")[1]) for v in args.variants.split(",")]
    result = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
              "torch": torch.__version__, "rounds": args.rounds, "s_per_round": {}, "hash": {}}
    with tempfile.TemporaryDirectory() as tmp:
        runs = {}
        for pack, graphs in variants:
            runs[(pack, graphs)] = run = trainer(tmp, pack, graphs, args.rounds, args.device)
            run.time_fl(1)  # warm-up (captures the graphs)
        for rep in range(args.repeats):
            for key, run in runs.items():
                res = run.time_fl(args.rounds)
                result["s_per_round"].setdefault(f"{key[0]}:{key[1]}", []).append(statistics.mean(res["round_s"]))
        for key, run in runs.items():
            name = f"{key[0]}:{key[1]}"
            med = statistics.median(result["s_per_round"][name])
            result["hash"][name] = run.trainer.worker.state_sha256()[:16]
            status = run.trainer.pack_step.graphed if run.trainer.pack_step is not None else None
            print(f"{name:>8}: {med:.4f} s/round  {50 / med:8.0f} client updates/s  model {result['hash'][name]}  "
                  f"graphs {'-' if status is None else (status.failed or len(status.graphs))}", flush=True)
        pack, graphs = int(args.profile.split(":")[0]), args.profile.split(":")[1]
        run = runs.get((pack, graphs)) or trainer(tmp, pack, graphs, args.rounds, args.device)
        run.time_fl(2)
        profiler = cProfile.Profile()
        profiler.enable()
        run.time_fl(3)
        profiler.disable()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(45)
        print(text.getvalue()[:9000])
        if args.device == "cuda":
            from torch.profiler import ProfilerActivity, profile
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                run.time_fl(1)
                torch.cuda.synchronize()
            table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=30)
            print(table)
            events = prof.key_averages()
            result["profile_round_cuda_ms"] = sum(e.self_device_time_total for e in events) / 1000
            result["profile_round_cpu_ms"] = sum(e.self_cpu_time_total for e in events) / 1000
            print(f"one round: GPU kernels {result['profile_round_cuda_ms']:.1f} ms, host ops "
                  f"{result['profile_round_cpu_ms']:.1f} ms (profiled)")
    print(json.dumps(result))
    if args.out:
        json.dump(result, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()

"""`distfl bench --suite lora`: memory and seconds per round of LoRA rounds against full fine-tuning of the
same model, one client at a time and in packs.

The model is the `mlp` of 784 -> 512 -> 512 -> 10 (about 0.67 M parameters) on synthetic 28 x 28 images;
the LoRA runs put rank-8 adapters on its three Linear layers, with `fedit` (A and B averaged) and `stack`
(FLoRA: the clients' products summed exactly and merged). Every configuration trains in its own process
(one thread, FedAvg, 10 of 100 clients a round, batch 10, local momentum 0.9), so each peak RSS is its
own. Per configuration and repeat: the median seconds of the timed rounds after one untimed round; the
growth of the process's peak RSS over its RSS after set-up; and the tensor bytes distfl holds for training,
counted from the run: the model's parameters (the frozen base once per rank), and per client trained at
once the trained vector, its gradient and its momentum buffer, and the round's exact-sum buffer (int64,
bytes_reduced). Repeats run the configurations interleaved; the table shows medians.
"""
from __future__ import annotations

import json
import resource
import statistics
import sys
import time

CONFIGS = {
    "full fine-tuning": [],
    "LoRA r=8, fedit": ["model.lora_rank=8", "model.lora_aggregate=fedit"],
    "LoRA r=8, stack": ["model.lora_rank=8", "model.lora_aggregate=stack"],
}
PACK_SIZES = (1, 10)
WORKLOAD = ["model.name=mlp", "model.mlp_hidden=512", "data.dataset=synthetic", "data.synthetic_image_size=28",
            "data.synthetic_train=5000", "data.synthetic_test=100", "partition.num_clients=100",
            "train.clients_per_round=10", "train.batch_size=10", "train.lr=0.05", "train.momentum=0.9",
            "runtime.threads=1", "runtime.device=cpu"]


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def measure(overrides: list[str], rounds: int) -> dict:
    """One configuration, in this process: set-up, one untimed round, `rounds` timed rounds."""
    import tempfile

    import torch

    from .. import dist
    from ..config import load_config
    from ..federation.runner import Trainer
    from .harness import HARNESS

    with tempfile.TemporaryDirectory() as out:
        cfg = load_config(None, [*WORKLOAD, *overrides, *HARNESS, f"output.dir={out}/run"])
        trainer = Trainer(cfg, dist.init("cpu", 1))
        try:
            rss_setup = _rss_bytes()
            seconds, row = [], trainer.run_round(1)
            for t in range(2, rounds + 2):
                t0 = time.perf_counter()
                row = trainer.run_round(t)
                seconds.append(time.perf_counter() - t0)
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
            module = trainer.worker.module
            trained = trainer.worker.num_params
            at_once = trainer.pack_size
            tensors = {
                "model_parameters": sum(p.numel() * p.element_size() for p in module.parameters()),
                "trained_per_client": 4 * trained,
                "gradients_per_client": 4 * trained,
                "momentum_per_client": 4 * trained if cfg.train.momentum else 0,
                "round_sum_buffer": int(row["bytes_reduced"]),
            }
            total = (tensors["model_parameters"] + tensors["round_sum_buffer"]
                     + at_once * (tensors["trained_per_client"] + tensors["gradients_per_client"]
                                  + tensors["momentum_per_client"]))
            return {"round_s": seconds, "median_round_s": statistics.median(seconds), "peak_rss_growth_bytes":
                    max(0, peak - rss_setup), "tracked_tensor_bytes": total, "tensors": tensors,
                    "trained_parameters": trained, "pack_size": at_once, "bytes_up_per_round": row["bytes_up"],
                    "bytes_down_per_round": row["bytes_down"], "torch_threads": torch.get_num_threads()}
        finally:
            trainer.close()


def bench(rounds: int, repeats: int, log) -> dict:
    from .harness import REPO_ROOT, _run

    cases = {f"{name}, pack {p}": [*overrides, f"runtime.pack_size={p}"]
             for name, overrides in CONFIGS.items() for p in PACK_SIZES}
    runs = {name: [] for name in cases}
    for rep in range(repeats):
        for name in (list(cases) if rep % 2 == 0 else list(reversed(cases))):
            out = _run([sys.executable, "-m", "distfl.bench.lora", json.dumps(cases[name]), str(rounds)],
                       str(REPO_ROOT), f"lora bench {name}")
            runs[name].append(json.loads(out.strip().splitlines()[-1]))
            log(f"repeat {rep + 1}/{repeats}: {name}: {runs[name][-1]['median_round_s']:.3f} s a round")
    summary = {}
    for name, results in runs.items():
        first = results[0]
        summary[name] = {"median_round_s": statistics.median(r["median_round_s"] for r in results),
                         "peak_rss_growth_mib": statistics.median(r["peak_rss_growth_bytes"] for r in results) / 2**20,
                         "tracked_tensor_mib": first["tracked_tensor_bytes"] / 2**20,
                         "trained_parameters": first["trained_parameters"],
                         "bytes_up_per_round": first["bytes_up_per_round"],
                         "bytes_down_per_round": first["bytes_down_per_round"]}
    return {"workload": WORKLOAD, "configs": cases, "timed_rounds": rounds, "repeats": repeats, "runs": runs,
            "summary": summary}


def markdown(res: dict) -> str:
    rows = ["| configuration | trained parameters | s per round (median) | tracked tensors (MiB) | peak RSS growth (MiB) "
            "| bytes up per round | bytes down per round |", "|---|---|---|---|---|---|---|"]
    for name, s in res["summary"].items():
        rows.append(f"| {name} | {s['trained_parameters']:,} | {s['median_round_s']:.3f} | {s['tracked_tensor_mib']:.2f} "
                    f"| {s['peak_rss_growth_mib']:.1f} | {s['bytes_up_per_round']:,} | {s['bytes_down_per_round']:,} |")
    return (f"# LoRA against full fine-tuning (`{res['bench']}`)\n\n{res['date']}, CPU, one thread a process, "
            f"{res['timed_rounds']} timed rounds after one untimed, medians over {res['repeats']} interleaved repeats. "
            f"Workload: {' '.join(res['workload'])}.\n\nTracked tensors: the model's parameters once, the round's exact-sum "
            "buffer, and per client trained at once its trained vector, gradient and momentum. Peak RSS growth: the "
            "process's peak RSS over its RSS after set-up.\n\n" + "\n".join(rows) + "\n")


if __name__ == "__main__":  # one configuration, in a process of its own: its JSON on the last line
    print(json.dumps(measure(json.loads(sys.argv[1]), int(sys.argv[2]))))

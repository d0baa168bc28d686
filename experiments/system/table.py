"""Tables of experiments/system/run.sh's runs (docs/evidence.md rows D1, D2):
    python experiments/system/table.py > experiments/system/results.md
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

RUNS = Path(__file__).parent / "runs"


def rows(name: str) -> list[dict] | None:
    path = RUNS / name / "metrics.jsonl"
    if not (RUNS / name / "summary.json").exists():
        return None
    return [json.loads(line) for line in path.read_text().splitlines()]


def first_time(metrics: list[dict], target: float):
    hit = next((r for r in metrics if r.get("test_acc", 0) >= target), None)
    return (hit["virtual_time_s"], hit["round"]) if hit else (None, None)


def buff_table(targets=(0.60, 0.70)) -> str:
    out = ["## D1: FedBuff against synchronous FedAvg, heterogeneous speeds (FMNIST)", "",
           "Virtual seconds (and round / server step) at which the global model first reaches the target test "
           "accuracy (evaluated every 2); both run 400 client updates (40 x 10).", "",
           "| seed | method | " + " | ".join(f"to {100 * t:.0f}%" for t in targets) +
           " | final acc | best acc | virtual time at the end |", "|---|---|" + "---|" * (len(targets) + 3)]
    for seed in (0, 1):
        for method in ("sync", "fedbuff"):
            metrics = rows(f"{method}_s{seed}")
            if metrics is None:
                continue
            cells = []
            for t in targets:
                time, step = first_time(metrics, t)
                cells.append("never" if time is None else f"{time:,.0f} s (step {step})")
            accs = [r["test_acc"] for r in metrics if "test_acc" in r]
            out.append(f"| {seed} | {method} | " + " | ".join(cells) +
                       f" | {100 * accs[-1]:.2f} | {100 * max(accs):.2f} | {metrics[-1]['virtual_time_s']:,.0f} s |")
    return "\n".join(out) + "\n"


def straggler_table() -> str:
    out = ["## D2: FedProx's stragglers on FMNIST (shards, E = 5, deadline)", "",
           "Per run: stragglers' share of the sampled clients, test accuracy (final, best, mean and std over the "
           "last 10 rounds), training loss (mean over the last 10 rounds, and its largest round-to-round rise).", "",
           "| stragglers | seed | method | late or partial / sampled | final | best | last-10 mean ± std | "
           "train loss last-10 | largest loss rise |", "|---|---|---|---|---|---|---|---|---|"]
    for level in (50, 90):
        for seed in (0, 1):
            for method in ("fedavg_drop", "fedprox0_partial", "fedprox1_partial"):
                metrics = rows(f"{method}_{level}_s{seed}")
                if metrics is None:
                    continue
                accs = [r["test_acc"] for r in metrics]
                losses = [r["train_loss"] for r in metrics]
                last = accs[-10:]
                slow = sum(r["late"] + r["partial"] for r in metrics)
                sampled = sum(r["sampled"] for r in metrics)
                rise = max(b - a for a, b in zip(losses, losses[1:]))
                out.append(f"| {level}% | {seed} | {method} | {slow}/{sampled} | {100 * accs[-1]:.2f} | "
                           f"{100 * max(accs):.2f} | {100 * statistics.mean(last):.2f} ± {100 * statistics.stdev(last):.2f} "
                           f"| {statistics.mean(losses[-10:]):.4f} | {rise:+.4f} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.stdout.write("# Devices that differ: evidence runs\n\nCommands: `experiments/system/run.sh buff SEED` and "
                     "`experiments/system/run.sh stragglers SEED`; each run's exact command line is "
                     "`runs/NAME.cmd`, its metrics `runs/NAME/metrics.jsonl`.\n\n")
    sys.stdout.write(buff_table() + "\n" + straggler_table())

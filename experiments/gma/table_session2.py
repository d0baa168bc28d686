"""Summarise experiments/gma/results_session2/ (client momentum 0.9, 100 clients, 10 a round, #C=2, 30 rounds)
or, with --session3, experiments/gma/results_session3/ (the same for 300 rounds, and 10 clients all every
round for 150 rounds; run_session3.sh):

    python experiments/gma/table_session2.py [--session3]

Per sweep (local lr, server lr) and mask: best test accuracy and the mean of the evaluations in the last
10 rounds (the paper's two metrics), each as mean ± sample std over the finished seeds; then GMA − AVG
paired by seed (each seed has its own split, so the pair shares its data), over the seeds both finished,
with the 95% t-interval of the mean difference.
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results_session2"
# (sweep directory, clients / per round, local lr, server lr)
SWEEPS = [("gma_m09_slr1.0", "100 / 10", "0.05", "1"), ("gma_m09_lr0.02_slr1.0", "100 / 10", "0.02", "1"),
          ("gma_m09_lr0.02_slr2.0", "100 / 10", "0.02", "2")]
RESULTS3 = RESULTS.parent / "results_session3"
SWEEPS3 = [("gma300_m09_lr0.02_slr1.0", "100 / 10", "0.02", "1"), ("gma300_m09_lr0.02_slr1.5", "100 / 10", "0.02", "1.5"),
           ("gma10c_m09_lr0.01_slr1.0", "10 / 10", "0.01", "1"), ("gma10c_m09_lr0.01_slr1.5", "10 / 10", "0.01", "1.5"),
           ("gma10c_m09_lr0.01_slr2.0", "10 / 10", "0.01", "2"),
           ("gma10c_split0_m09_lr0.01_slr1.0", "10 / 10, seed 0's split", "0.01", "1"),
           ("gma10c_split0_m09_lr0.01_slr2.0", "10 / 10, seed 0's split", "0.01", "2"),
           ("gma10c_m0_lr0.1_slr1.0", "10 / 10, client momentum 0", "0.1", "1")]
# Runs of another sweep that belong to a sweep's rows too: seed 0's runs are on seed 0's split.
ALSO = {"gma10c_split0_m09_lr0.01_slr1.0": [("gma10c_m09_lr0.01_slr1.0", "0")]}


def seed_metrics(run: Path) -> tuple[float, float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    evals = [(r["round"], r["test_acc"]) for r in rows if "test_acc" in r]
    last = evals[-1][0]
    tail = [a for t, a in evals if t > last - 10]
    return 100 * max(a for _, a in evals), 100 * sum(tail) / len(tail)


# Two-sided 95% quantiles of Student's t by degrees of freedom, for the paired differences' interval.
T975 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36}


def paired(values: list[float]) -> str:
    """mean ± std, and the 95% t-interval of the mean difference when there are 2-8 pairs."""
    text = mean_std(values)
    if 2 <= len(values) <= 8:
        half = T975[len(values) - 1] * statistics.stdev(values) / len(values) ** 0.5
        text += f", 95% CI [{statistics.mean(values) - half:+.2f}, {statistics.mean(values) + half:+.2f}]"
    return text


def mean_std(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.2f} (1 seed)"
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f} ({len(values)} seeds)"


def main(results: Path = RESULTS, sweeps=SWEEPS) -> None:
    print("| clients / per round | local lr | server lr | mask | best | mean of last 10 rounds | per seed (best / last-10) |")
    print("|---|---|---|---|---|---|---|")
    for sweep, clients, lr, slr in sweeps:
        by_mask = {}
        for mask in ("none", "gma"):
            runs = sorted((results / sweep).glob(f"aggregation.mask={mask}_seed=*"))
            runs += [results / other / f"aggregation.mask={mask}_seed={seed}" for other, seed in ALSO.get(sweep, [])
                     if (results / other / f"aggregation.mask={mask}_seed={seed}").is_dir()]
            runs.sort(key=lambda run: int(run.name.split("_seed=")[1]))
            if not runs:
                continue
            by_mask[mask] = {run.name.split("_seed=")[1]: seed_metrics(run) for run in runs}
            got = list(by_mask[mask].values())
            per_seed = ", ".join(f"{b:.2f} / {m:.2f}" for b, m in got)
            label = "AVG" if mask == "none" else "GMA"
            print(f"| {clients} | {lr} | {slr} | {label} | {mean_std([b for b, _ in got])} | {mean_std([m for _, m in got])} | {per_seed} |")
        seeds = sorted(set(by_mask.get("none", {})) & set(by_mask.get("gma", {})), key=int)
        if seeds:
            diff = [tuple(g - a for g, a in zip(by_mask["gma"][k], by_mask["none"][k])) for k in seeds]
            per_seed = ", ".join(f"{b:+.2f} / {m:+.2f}" for b, m in diff)
            print(f"| {clients} | {lr} | {slr} | GMA − AVG, paired (seeds {', '.join(seeds)}) | "
                  f"{paired([b for b, _ in diff])} | {paired([m for _, m in diff])} | {per_seed} |")


if __name__ == "__main__":
    if "--session3" in sys.argv[1:]:
        main(RESULTS3, SWEEPS3)
    else:
        main()

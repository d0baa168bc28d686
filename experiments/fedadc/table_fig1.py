"""Tables of FedADC's Experiment A on Fashion-MNIST (experiments/fedadc/run_fig1.sh):

    python experiments/fedadc/table_fig1.py [RESULTS_DIR]

RESULTS_DIR (default experiments/fedadc/results_fig1, or runs/evidence/fedadc_fig1 while the runs go on)
holds one sweep directory per method and beta (fedavg, slowmo_bB, fedadc_bB, fedadc_plus_bB), each with
train.lr=LR/seed=S/metrics.jsonl. Printed:
1. the seed-0 grid: per method and beta, per local lr, the mean test accuracy of the last three
   evaluations (the tuning criterion: end accuracy, robust to one lucky evaluation) and the best;
2. each method at its seed-0 best: rounds to 70/75/80 % (first evaluation at or above), best and
   last-three mean, per seed and as mean ± sample std.
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

DEFAULT = Path(__file__).resolve().parent / "results_fig1"
METHODS = ("fedavg", "slowmo", "fedadc", "fedadc_plus")
LABEL = {"fedavg": "FedAvg", "slowmo": "SlowMo", "fedadc": "FedADC (nesterov)",
         "fedadc_plus": "FedADC+ (λ = 0.35)"}
TARGETS = (70, 75, 80)


def evaluations(run: Path) -> list[tuple[int, float]]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [(r["round"], 100 * r["test_acc"]) for r in rows if "test_acc" in r]


def finished(run: Path) -> bool:
    return (run / "summary.json").exists()


def scores(evals: list[tuple[int, float]]) -> dict:
    accs = [a for _, a in evals]
    out = {"end": statistics.mean(accs[-3:]), "best": max(accs), "rounds": evals[-1][0]}
    for target in TARGETS:
        out[target] = next((t for t, a in evals if a >= target), None)
    return out


def collect(root: Path) -> dict:
    """(method, beta or None, lr) -> {seed: scores} over finished runs."""
    table: dict = {}
    for sweep in sorted(p for p in root.iterdir() if p.is_dir()):
        method, _, beta = sweep.name.rpartition("_b") if "_b" in sweep.name else (sweep.name, "", "")
        if method not in METHODS:
            continue
        for run in sweep.glob("train.lr=*/seed=*"):
            if not finished(run):
                continue
            lr = run.parent.name.split("=", 1)[1]
            seed = int(run.name.split("=", 1)[1])
            table.setdefault((method, beta or None, lr), {})[seed] = scores(evaluations(run))
    return table


def mean_std(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"


def grid_table(table: dict) -> list[str]:
    lrs = sorted({lr for _, _, lr in table}, key=float)
    lines = ["| method | β | " + " | ".join(f"lr {lr}" for lr in lrs) + " |",
             "|---|---|" + "---:|" * len(lrs)]
    for method in METHODS:
        for beta in sorted({b for m, b, _ in table if m == method}, key=lambda b: float(b or 0)):
            cells = []
            for lr in lrs:
                s = table.get((method, beta, lr), {}).get(0)
                cells.append(f"{s['end']:.2f} ({s['best']:.2f})" if s else "")
            lines.append(f"| {LABEL[method]} | {beta or '—'} | " + " | ".join(cells) + " |")
    return lines


def best_settings(table: dict) -> dict:
    """method -> (beta, lr) with the highest seed-0 end accuracy."""
    best = {}
    for (method, beta, lr), seeds in table.items():
        if 0 in seeds and (method not in best or seeds[0]["end"] > table[(method, *best[method])][0]["end"]):
            best[method] = (beta, lr)
    return best


def seeds_table(table: dict, best: dict) -> list[str]:
    lines = ["| method | β | lr | seeds | " + " | ".join(f"rounds to {t} %" for t in TARGETS)
             + " | best | mean of last 3 evaluations |", "|---|---|---|---|" + "---:|" * (len(TARGETS) + 2)]
    for method in METHODS:
        if method not in best:
            continue
        beta, lr = best[method]
        seeds = table[(method, beta, lr)]
        order = sorted(seeds)
        reach = [" / ".join(str(seeds[s][t]) if seeds[s][t] else f"> {seeds[s]['rounds']}" for s in order)
                 for t in TARGETS]
        lines.append(f"| {LABEL[method]} | {beta or '—'} | {lr} | {', '.join(map(str, order))} | "
                     + " | ".join(reach) + f" | {mean_std([seeds[s]['best'] for s in order])} | "
                     f"{mean_std([seeds[s]['end'] for s in order])} |")
    return lines


def main(argv: list[str]) -> None:
    root = Path(argv[0]) if argv else DEFAULT
    table = collect(root)
    print("Seed 0, per method, β and local lr: mean of the last 3 evaluations (best)\n")
    print("\n".join(grid_table(table)))
    best = best_settings(table)
    # FedADC+ is run at FedADC's best setting only; it is reported at that setting.
    plus = [(b, lr) for (m, b, lr) in table if m == "fedadc_plus"]
    if plus:
        best["fedadc_plus"] = plus[0]
    print("\nEach method at its seed-0 best (by the mean of the last 3 evaluations)\n")
    print("\n".join(seeds_table(table, best)))


if __name__ == "__main__":
    main(sys.argv[1:])

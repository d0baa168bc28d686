"""The table of experiments/baselines/run_moon_fedexp.sh: MOON and FedExP against FedAvg on FMNIST Dir(0.1).

Usage: python experiments/baselines/table_moon_fedexp.py [> experiments/baselines/moon_fedexp.md]
Per method and seed: final accuracy (round 100), the mean of the last four evaluations (rounds 85-100),
the best, the accuracy at round 25, the mean over all 20 evaluations (every 5 rounds: the area under
the accuracy curve, a measure of speed), and the first evaluated round at or above THRESHOLD; then the
mean over seeds and the difference to FedAvg (seed by seed, same split).
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

OUT = Path(__file__).resolve().parent / "moon_fedexp"
METHODS = ("fedavg", "moon", "fedexp", "moon_mu5")  # moon_mu5: algorithm.moon_mu=5, seed 0 only
SEEDS = (0, 1)
THRESHOLD = 0.60


def load(method: str, seed: int) -> dict | None:
    run = OUT / f"{method}_seed{seed}"
    if not (run / "summary.json").is_file():
        return None
    summary = json.loads((run / "summary.json").read_text())
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [(r["round"], r["test_acc"]) for r in rows if "test_acc" in r]
    reached = next((t for t, acc in evals if acc >= THRESHOLD), None)
    etas = [r["fedexp_eta_g"] for r in rows if "fedexp_eta_g" in r]
    return {"mean": statistics.mean(acc for _, acc in evals), "final": summary["final_test_acc"], "last4": statistics.mean(acc for _, acc in evals[-4:]),
            "best": summary["best_test_acc"], "at25": dict(evals).get(25), "reached": reached,
            "eta": statistics.mean(etas) if etas else None, "wall": summary["wall_s"]}


def pct(x):
    return "-" if x is None else f"{100 * x:.2f}"


def main() -> None:
    runs = {(m, s): load(m, s) for m in METHODS for s in SEEDS}
    print(f"| method | seed | final | last 4 evals | best | round 25 | mean of all evals | first round >= {100 * THRESHOLD:.0f}% | mean eta_g | wall s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (m, s), r in runs.items():
        if r is None:
            continue
        eta = "-" if r["eta"] is None else f"{r['eta']:.2f}"
        print(f"| {m} | {s} | {pct(r['final'])} | {pct(r['last4'])} | {pct(r['best'])} | {pct(r['at25'])} | "
              f"{pct(r['mean'])} | {r['reached'] or '-'} | {eta} | {r['wall']:.0f} |")
    print()
    print("| method | final (mean over seeds) | last 4 evals | - FedAvg, final (per seed) | - FedAvg, last 4 (per seed) | - FedAvg, round 25 (per seed) | - FedAvg, mean of all evals (per seed) |")
    print("|---|---|---|---|---|---|---|")
    for m in METHODS:
        done = [s for s in SEEDS if runs[(m, s)] is not None and runs[("fedavg", s)] is not None]
        if not done:
            continue

        def diffs(key):
            return ", ".join(f"{100 * (runs[(m, s)][key] - runs[('fedavg', s)][key]):+.2f}" for s in done
                             if runs[(m, s)][key] is not None and runs[("fedavg", s)][key] is not None)

        print(f"| {m} | {pct(statistics.mean(runs[(m, s)]['final'] for s in done))} | "
              f"{pct(statistics.mean(runs[(m, s)]['last4'] for s in done))} | {diffs('final')} | {diffs('last4')} | "
              f"{diffs('at25')} | {diffs('mean')} |")


if __name__ == "__main__":
    main()

"""The table of experiments/fedprox_synthetic/results: per federation, method and seed, the global model's
training loss over all devices' training samples (FedProx's Figure 2 quantity) at rounds 10, 20, 40, 100
and 200 (those up to --upto), its worst rise from one round to the next, the rounds in which it rose, and the
test accuracy at round --upto. The runs are 200 rounds long; --upto 40 and --upto 100 read their first rounds
(a run's first N rounds are what an N-round run writes):

    python experiments/fedprox_synthetic/table.py --plot experiments/fedprox_synthetic/loss_200.png > experiments/fedprox_synthetic/results.md
    python experiments/fedprox_synthetic/table.py --upto 100 > experiments/fedprox_synthetic/results_100.md
    python experiments/fedprox_synthetic/table.py --upto 40 > experiments/fedprox_synthetic/results_40.md

--plot: the training-loss curves, one panel per federation (as FedProx's Figure 2, top row).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = ["synthetic_iid", "synthetic_0_0", "synthetic_0.5_0.5", "synthetic_1_1"]
METHODS = {"fedavg": "FedAvg (= FedProx mu 0)", "fedprox_mu1": "FedProx mu 1"}


def rows(name: str, upto: int) -> list[dict] | None:
    path = HERE / "results" / name / "metrics.jsonl"
    if not path.exists():
        return None
    out = [json.loads(line) for line in path.read_text().splitlines()]
    return [r for r in out if r["round"] <= upto]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--upto", type=int, default=200, help="the last round read (at most the runs' length, 200)")
    parser.add_argument("--plot", help="also draw the training-loss curves into this PNG")
    args = parser.parse_args()
    if args.plot:
        plot(args.plot, args.upto)
    marks = sorted({m for m in (10, 20, 40, 100, 200) if m < args.upto} | {args.upto})
    print(f"Global training loss (all 30 devices' training samples) and test accuracy, rounds 1-{args.upto}; "
          f"`rises`: rounds whose loss exceeds the previous round's; `worst rise`: the largest such step.\n")
    head = " | ".join(f"loss @{m}" for m in marks)
    print(f"| federation | method | seed | {head} | worst rise | rises | test acc @{args.upto} |")
    print("|" + "---|" * (6 + len(marks)))
    final = {}
    for data in DATA:
        for method, label in METHODS.items():
            for seed in (0, 1):
                r = rows(f"{data}_{method}_s{seed}", args.upto)
                if not r or len(r) < args.upto:
                    have = f"{len(r)} rounds" if r else "not run"
                    print(f"| {data} | {label} | {seed} | {' | '.join('' for _ in marks)} | | | {have} |")
                    continue
                loss = [x["global_train_loss"] for x in r]
                steps = [b - a for a, b in zip(loss, loss[1:])]
                worst = max(steps)
                cells = " | ".join(f"{loss[m - 1]:.4f}" for m in marks)
                acc = r[-1]["test_acc"]
                final[(data, method, seed)] = (loss[-1], acc)
                print(f"| {data} | {label} | {seed} | {cells} | {max(worst, 0):.4f} | {sum(s > 0 for s in steps)} | "
                      f"{100 * acc:.2f} |")
    print(f"\nFedProx mu 1 minus FedAvg at round {args.upto}, per seed (training loss; test accuracy in points):\n")
    print("| federation | seed 0 loss | seed 1 loss | seed 0 acc | seed 1 acc |")
    print("|---|---|---|---|---|")
    for data in DATA:
        cells = []
        for i in (0, 1):  # 0: loss, 1: accuracy
            for seed in (0, 1):
                a, b = final.get((data, "fedavg", seed)), final.get((data, "fedprox_mu1", seed))
                cells.append("" if a is None or b is None else
                             (f"{b[0] - a[0]:+.4f}" if i == 0 else f"{100 * (b[1] - a[1]):+.2f}"))
        print(f"| {data} | " + " | ".join(cells) + " |")


def plot(path: str, upto: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(DATA), figsize=(4 * len(DATA), 3.2), sharey=False)
    for ax, data in zip(axes, DATA):
        for method, style in (("fedavg", "-"), ("fedprox_mu1", "--")):
            for seed, color in ((0, "tab:blue"), (1, "tab:orange")):
                r = rows(f"{data}_{method}_s{seed}", upto)
                if r:
                    ax.plot([x["round"] for x in r], [x["global_train_loss"] for x in r], style, color=color,
                            label=f"{METHODS[method]}, seed {seed}")
        ax.set_title(data)
        ax.set_xlabel("round")
        ax.set_yscale("log")
    axes[0].set_ylabel("global training loss")
    axes[0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()

"""Tables of experiments/system/run.sh's runs (docs/evidence.md rows D1, D2, D3; D2 over 200 rounds and over
the first 100 rounds, seeds 0, 1 and 2):
    python experiments/system/table.py [--plot experiments/system/synthetic_stragglers.png] > experiments/system/results.md
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
           "accuracy (evaluated every 2); both run 400 client updates (40 x 10). The FedBuff runs have no dropouts "
           "and no staleness bound, so no update is thrown away and no buffered client could be started again: "
           "rerun after that was fixed (every step applies K distinct clients), both seeds gave the same "
           "model_sha256 and metrics, bit for bit.", "",
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


SYNTHETIC = ("fedavg_drop", "fedprox0_partial", "fedprox1_partial")
LABELS = {"fedavg_drop": "FedAvg (drops stragglers)", "fedprox0_partial": "FedProx mu = 0 (partial work)",
          "fedprox1_partial": "FedProx mu = 1 (partial work)"}


def partial_rows(name: str) -> list[dict]:
    """A run's metrics so far (a run still going counts up to its last finished round)."""
    path = RUNS / name / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


# Without stragglers the runs are X1's (experiments/fedprox_synthetic): the same federation, config and
# model (system.stragglers=0 equals the plain run bit for bit, tests/integration/test_system.py), and FedProx mu = 0 is
# FedAvg bit for bit (tests/methods/test_algorithms.py), so no 0% run is repeated here.
NO_STRAGGLERS = Path(__file__).parent.parent / "fedprox_synthetic" / "results"
UPTO = 200  # rounds compared: the paper's 200 (a shorter run is left out of that table and read in the 100-round one)


def synthetic_runs() -> dict:
    """(level, seed, method) -> metrics rows of `run.sh stragglers` (0%: X1's runs)."""
    runs = {}
    for seed in (0, 1):
        for method, x1 in (("fedavg_drop", "fedavg"), ("fedprox1_partial", "fedprox_mu1")):
            path = NO_STRAGGLERS / f"synthetic_1_1_{x1}_s{seed}" / "metrics.jsonl"
            if path.exists():
                runs[0, seed, method] = [json.loads(line) for line in path.read_text().splitlines()]
    for seed in (0, 1, 2):
        for level in (50, 90):
            for method in SYNTHETIC:
                rows_ = partial_rows(f"synthetic_{method}_{level}_s{seed}")
                if rows_:
                    runs[level, seed, method] = rows_
    return runs


def synthetic_table(upto: int = UPTO, checkpoints=(10, 20, 50, 100, 200)) -> str:
    """D2 on FedProx's Synthetic(1,1): Figure 1's metric (the global model's training loss over all training
    samples) at a few rounds, its instability (rounds in which it rose, the largest rise), and test accuracy,
    over the first `upto` rounds of every run that ran that far (a run's first N rounds are what an N-round
    run writes)."""
    checkpoints = [c for c in checkpoints if c <= upto]
    runs = synthetic_runs()
    short = sorted(f"{method} {level}% seed {seed} ({len(m)} rounds)" for (level, seed, method), m in runs.items()
                   if len(m) < upto)
    out = [f"## D2: FedProx's stragglers on Synthetic(1,1) (the paper's Figure 1 setting), rounds 1-{upto}", "",
           "`experiments/system/run.sh stragglers SEED`: 30 devices, 10 a round, E = 20, batch 10, lr 0.01, mclr; "
           "in each round 50% or 90% of the sampled devices are stragglers doing 1-19 epochs "
           "(`system.round=stragglers`); 0%: X1's runs (`experiments/fedprox_synthetic`, the same federation and "
           f"model). Over the first {upto} rounds: global training loss (Figure 1's y-axis) at rounds "
           + ", ".join(map(str, checkpoints)) + ", the rounds in which it rose and its largest rise; "
           f"test accuracy at round {upto} and its mean over rounds {upto - 9}-{upto}."
           + (f" Not in this table (shorter runs): {', '.join(short)}." if short else ""), "",
           "| stragglers | seed | method | rounds run | " + " | ".join(f"loss @{c}" for c in checkpoints) +
           " | loss rose in | largest rise | test acc | test acc last-10 mean |",
           "|---|---|---|---|" + "---|" * (len(checkpoints) + 4)]
    for (level, seed, method), metrics in sorted(runs.items()):
        ran = len(metrics)
        if ran < upto:
            continue
        metrics = metrics[:upto]
        losses = [r["global_train_loss"] for r in metrics]
        accs = [r["test_acc"] for r in metrics]
        rises = [b - a for a, b in zip(losses, losses[1:])]
        at = [f"{losses[c - 1]:.4f}" if len(losses) >= c else "—" for c in checkpoints]
        out.append(f"| {level}% | {seed} | {method} | {ran} | " + " | ".join(at) +
                   f" | {sum(r > 0 for r in rises)} | {max(rises, default=0):+.4f} | {100 * accs[-1]:.2f} | "
                   f"{100 * statistics.mean(accs[-10:]):.2f} |")
    return "\n".join(out) + "\n"


def synthetic_plot(path: str) -> None:
    """Figure 1's synthetic column: global training loss against rounds, one panel per straggler level."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = synthetic_runs()
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6), sharey=True)
    colors = {"fedavg_drop": "tab:blue", "fedprox0_partial": "tab:orange", "fedprox1_partial": "tab:green"}
    for ax, level in zip(axes, (0, 50, 90)):
        for (lvl, seed, method), metrics in sorted(runs.items()):
            if lvl != level:
                continue
            metrics = metrics[:UPTO]
            ax.plot([r["round"] for r in metrics], [r["global_train_loss"] for r in metrics], color=colors[method],
                    linestyle=("-", "--", ":")[seed], linewidth=1,
                    label=f"{LABELS[method]}, seed {seed}")
        ax.set_title(f"Synthetic(1,1), {level}% stragglers")
        ax.set_xlabel("round")
        ax.set_yscale("log")
    axes[0].set_ylabel("global training loss")
    handles, labels = axes[2].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=3, fontsize=8, bbox_to_anchor=(0.5, -0.02))
    fig.savefig(path, bbox_inches="tight", dpi=120)


def straggler_table() -> str:
    out = ["## D3: FedProx's stragglers transferred to FMNIST (shards, E = 5, deadline)", "",
           "`experiments/system/run.sh stragglers_fmnist SEED` (its runs predate FedProx's own straggler model).", "",
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
    if "--plot" in sys.argv:
        synthetic_plot(sys.argv[sys.argv.index("--plot") + 1])
    sys.stdout.write("# Devices that differ: evidence runs\n\nCommands: `experiments/system/run.sh buff SEED`, "
                     "`experiments/system/run.sh stragglers SEED` and `experiments/system/run.sh stragglers_fmnist SEED`; "
                     "each run's exact command line is `runs/NAME.cmd`, its metrics `runs/NAME/metrics.jsonl`.\n\n")
    sys.stdout.write(buff_table() + "\n" + synthetic_table() + "\n" + synthetic_table(100) + "\n" + straggler_table())

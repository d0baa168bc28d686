"""Tables and plot of experiments/compression/run.sh's runs (docs/evidence.md rows U1, U2, U3), from each
run's committed summary.json and metrics.jsonl only (trains nothing):

    python experiments/compression/table.py [--plot] > experiments/compression/results.md
    python experiments/compression/table.py --check docs/evidence.md

--plot writes experiments/compression/acc_vs_bytes.png and .pdf (test accuracy against cumulative upload
bytes, every run; beside it, against simulated seconds). --check recomputes the tables and fails (exit 1),
naming them, if numbers in the measured column or the verdict of docs/evidence.md's rows U1-U3 are not
among them.
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/rows.py
from rows import check_rows, load_run  # noqa: E402

HERE = Path(__file__).resolve().parent
RUNS = HERE / "runs"
SEEDS = (0, 1)
NAMES = ("fedavg", "topk1", "topk1_ef", "topk10", "topk10_ef", "qsgd2", "qsgd4", "qsgd8")
LABELS = {"fedavg": "FedAvg (float32)", "topk1": "top-k 1%", "topk1_ef": "top-k 1% + EF", "topk10": "top-k 10%",
          "topk10_ef": "top-k 10% + EF", "qsgd2": "QSGD 2 bits", "qsgd4": "QSGD 4 bits", "qsgd8": "QSGD 8 bits"}
TARGETS = (0.60, 0.70)  # test accuracy targets for rounds, bytes and simulated time to accuracy
LAST = 5  # evaluations averaged for "last-5 mean" (evaluated every 2 rounds: the last 10 rounds)




def curve(run: dict) -> list[dict]:
    """Per evaluated round: round, test accuracy (%), cumulative upload bytes and virtual seconds."""
    points, up = [], 0
    for row in run["metrics"]:
        up += row["bytes_up"]
        if "test_acc" in row:
            points.append({"round": row["round"], "acc": 100 * row["test_acc"], "bytes_up": up,
                           "time": row["virtual_time_s"]})
    return points


def first(points: list[dict], target: float) -> dict | None:
    return next((p for p in points if p["acc"] >= 100 * target), None)


def runs() -> dict:
    return {(name, seed): run for name in NAMES for seed in SEEDS if (run := load_run(RUNS, name, seed)) is not None}


def mean_std(values: list[float], fmt: str = "{:.2f}") -> str:
    if not values:
        return "—"
    if len(values) == 1:
        return fmt.format(values[0]) + " (1 seed)"
    return f"{fmt.format(statistics.mean(values))} ± {fmt.format(statistics.stdev(values))}"


def per_run_table(all_runs: dict) -> str:
    out = ["## Every run", "",
           "Final and best test accuracy (%), mean of the last 5 evaluations (rounds 42-50), total upload bytes "
           "(summed `bytes_up`) and its share of FedAvg's, mean vNMSE of the uploads (`compression_vnmse` over the "
           "rounds), and for each target the first evaluated round, the cumulative upload bytes and the virtual "
           "seconds at which the test accuracy reached it (`never` if it did not within the run).", "",
           "| run | seed | rounds | final | best | last-5 mean | upload MB | share of FedAvg's | mean vNMSE | "
           + " | ".join(f"to {100 * t:.0f}%: round, MB up, virtual s" for t in TARGETS) + " |",
           "|---|---|---|---|---|---|---|---|---|" + "---|" * len(TARGETS)]
    for (name, seed), run in all_runs.items():
        points, s = curve(run), run["summary"]
        accs = [p["acc"] for p in points]
        base = all_runs.get(("fedavg", seed))
        share = f"{s['bytes_up'] / base['summary']['bytes_up']:.4f}" if base else "—"
        vnmse = [r["compression_vnmse"] for r in run["metrics"] if "compression_vnmse" in r]
        cells = []
        for t in TARGETS:
            hit = first(points, t)
            cells.append("never" if hit is None else f"{hit['round']}, {hit['bytes_up'] / 1e6:.3f}, {hit['time']:,.0f}")
        vnmse_cell = f"{statistics.mean(vnmse):.4f}" if vnmse else "—"
        out.append(f"| {LABELS[name]} | {seed} | {s['rounds']} | {accs[-1]:.2f} | {max(accs):.2f} | "
                   f"{statistics.mean(accs[-LAST:]):.2f} | {s['bytes_up'] / 1e6:.3f} | {share} | {vnmse_cell} | "
                   + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def compare_table(all_runs: dict, names: tuple, title: str, note: str) -> str:
    """Over seeds: last-5 mean accuracy (mean ± std), its difference to FedAvg's on the same seed, rounds to each
    target (per seed) and the upload bytes' share of FedAvg's."""
    out = [f"## {title}", "", note, "",
           "| run | seeds | last-5 mean acc | − FedAvg, per seed | final acc | "
           + " | ".join(f"rounds to {100 * t:.0f}%, per seed" for t in TARGETS) + " | upload share of FedAvg's |",
           "|---|---|---|---|---|" + "---|" * len(TARGETS) + "---|"]
    for name in ("fedavg",) + names:
        seeds = [seed for seed in SEEDS if (name, seed) in all_runs]
        if not seeds:
            out.append(f"| {LABELS[name]} | not run | | | |" + " |" * len(TARGETS) + " |")
            continue
        last5 = {seed: statistics.mean([p["acc"] for p in curve(all_runs[name, seed])][-LAST:]) for seed in seeds}
        final = [curve(all_runs[name, seed])[-1]["acc"] for seed in seeds]
        diffs = []
        for seed in seeds:
            if ("fedavg", seed) in all_runs:
                base = statistics.mean([p["acc"] for p in curve(all_runs["fedavg", seed])][-LAST:])
                diffs.append(f"{last5[seed] - base:+.2f}")
        rounds = []
        for t in TARGETS:
            hits = [first(curve(all_runs[name, seed]), t) for seed in seeds]
            rounds.append(", ".join("never" if h is None else str(h["round"]) for h in hits))
        shares = sorted({f"{all_runs[name, seed]['summary']['bytes_up'] / all_runs['fedavg', seed]['summary']['bytes_up']:.4f}"
                         for seed in seeds if ("fedavg", seed) in all_runs})
        out.append(f"| {LABELS[name]} | {', '.join(map(str, seeds))} | {mean_std(list(last5.values()))} | "
                   f"{', '.join(diffs) if name != 'fedavg' else '—'} | {mean_std(final)} | {' | '.join(rounds)} | "
                   f"{', '.join(shares)} |")
    return "\n".join(out) + "\n"


def feedback_gain(all_runs: dict) -> str:
    """Last-5 mean accuracy with error feedback minus without, per seed, at each density."""
    cells = []
    for density in ("1", "10"):
        gains = [statistics.mean([p["acc"] for p in curve(all_runs[f"topk{density}_ef", seed])][-LAST:])
                 - statistics.mean([p["acc"] for p in curve(all_runs[f"topk{density}", seed])][-LAST:])
                 for seed in SEEDS if (f"topk{density}_ef", seed) in all_runs and (f"topk{density}", seed) in all_runs]
        cells.append(f"{density}%: " + (", ".join(f"{g:+.2f}" for g in gains) or "not run"))
    return "Error feedback's gain (last-5 mean with it minus without), per seed: " + "; ".join(cells) + ".\n"


def time_table(all_runs: dict) -> str:
    out = ["## U3: simulated time to accuracy on slow uploads", "",
           "Virtual seconds (`virtual_time_s`, docs/system.md) at the first evaluation with test accuracy at or above "
           "the target, and FedAvg's time divided by the run's (above 1: the compressed run got there sooner), per seed. "
           "Every run waits for all 10 clients a round; a round lasts as long as its slowest client's download + "
           "compute + upload, the upload's size being the encoded `bytes_up`.", "",
           "| run | " + " | ".join(f"seed {seed}: to {100 * t:.0f}% (FedAvg / run)" for seed in SEEDS for t in TARGETS)
           + " | virtual s for 50 rounds, per seed |",
           "|---|" + "---|" * (len(SEEDS) * len(TARGETS) + 1)]
    for name in NAMES:
        cells = []
        for seed in SEEDS:
            for t in TARGETS:
                run, base = all_runs.get((name, seed)), all_runs.get(("fedavg", seed))
                if run is None:
                    cells.append("not run")
                    continue
                hit = first(curve(run), t)
                if hit is None:
                    cells.append("never")
                    continue
                ref = first(curve(base), t) if base else None
                ratio = f" ({ref['time'] / hit['time']:.2f}x)" if ref and name != "fedavg" else ""
                cells.append(f"{hit['time']:,.0f} s{ratio}")
        ends = [f"{all_runs[name, seed]['summary']['virtual_time_s']:,.0f}" for seed in SEEDS if (name, seed) in all_runs]
        out.append(f"| {LABELS[name]} | " + " | ".join(cells) + f" | {', '.join(ends) or 'not run'} |")
    return "\n".join(out) + "\n"


def plot(all_runs: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"fedavg": "black", "topk1": "tab:red", "topk1_ef": "tab:orange", "topk10": "tab:blue",
              "topk10_ef": "tab:cyan", "qsgd2": "tab:green", "qsgd4": "tab:olive", "qsgd8": "tab:purple"}
    fig, (ax, ax_time) = plt.subplots(1, 2, figsize=(13, 4.6), sharey=True)
    for name, seed in [(name, seed) for name in NAMES for seed in SEEDS if (name, seed) in all_runs]:
        points = curve(all_runs[name, seed])
        style = dict(color=colors[name], linestyle=("-", "--")[seed], linewidth=1.2, marker=".", markersize=3)
        ax.plot([p["bytes_up"] for p in points], [p["acc"] for p in points], label=f"{LABELS[name]}, seed {seed}",
                **style)
        ax_time.plot([p["time"] for p in points], [p["acc"] for p in points], **style)
    ax.set_xscale("log")
    ax.set_xlabel("cumulative upload bytes (all clients, encoded sizes)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title("Fashion-MNIST, SimpleCNN, 100 clients, 10 a round")
    ax_time.set_xlabel("simulated seconds (slow lognormal uploads)")
    ax_time.set_title("the same runs against the virtual clock")
    for a in (ax, ax_time):
        a.grid(alpha=0.3)
    fig.legend(*ax.get_legend_handles_labels(), loc="upper center", ncol=4, fontsize=8, bbox_to_anchor=(0.5, -0.01))
    for ext in ("png", "pdf"):
        fig.savefig(HERE / f"acc_vs_bytes.{ext}", bbox_inches="tight", dpi=130)


def machine_load_run(RUNS, all_runs: dict) -> str:
    """The range of the 1-minute load average sampled once a minute while the runs ran (load.txt)."""
    path = HERE / "load.txt"
    if not path.exists():
        return ""
    loads = [float(line.split()[1]) for line in path.read_text().splitlines() if line.strip()]
    lines = path.read_text().splitlines()
    walls = [run["summary"]["wall_s"] for run in all_runs.values()]
    return (f"Machine: 2 shared vCPUs, no GPU; 1-minute load average {min(loads):.1f}-{max(loads):.1f} "
            f"(median {statistics.median(loads):.1f}; sampled each minute from {lines[0].split()[0]} to "
            f"{lines[-1].split()[0]} UTC, `load.txt`) while other sessions' jobs shared the cores. Runs went two at "
            f"a time, each on one thread at nice 10; a run's wall time {min(walls):.0f}-{max(walls):.0f} s (summary.json "
            "`wall_s`).\n\n")


def report() -> str:
    all_runs = runs()
    missing = [f"{name} seed {seed}" for seed in SEEDS for name in NAMES if (name, seed) not in all_runs]
    head = ("# Compressed uploads on Fashion-MNIST: evidence runs\n\n"
            "Commands: `experiments/compression/run.sh 0` then `experiments/compression/run.sh 1` (config "
            "`fmnist.yaml`); each run's exact command line is `runs/NAME_sSEED.cmd`, its metrics "
            "`runs/NAME_sSEED/metrics.jsonl`. Tables: `python experiments/compression/table.py --plot`.\n\n"
            + "Setting: real Fashion-MNIST, SimpleCNN, 100 clients, Dirichlet(0.5), 10 clients a round, 1 local epoch, "
            "batch 32, lr 0.1, server SGD lr 1 (configs/quickstart.yaml's), **50 rounds**, test accuracy every 2 rounds; "
            "virtual clock: speed exp(N(0, 1)) ms a sample, download exp(N(8.5, 1)) kbit/s (median 4,915), upload "
            "exp(N(6, 1)) kbit/s (median 403), every client waited for. FedAvg's upload is 177,704 bytes a client "
            "(44,426 float32 values).\n\n" + machine_load_run(RUNS, all_runs)
            + (f"Not run (no completed run by 07:30 UTC): {', '.join(missing)}; each would run with "
               "`experiments/compression/run.sh SEED NAME`.\n\n" if missing else ""))
    return (head + per_run_table(all_runs) + "\n"
            + compare_table(all_runs, ("topk1", "topk1_ef", "topk10", "topk10_ef"),
                            "U1: top-k with and without error feedback against FedAvg",
                            "Stich et al. 2018: top-k with memory converges at the rate of uncompressed SGD. Last-5 mean = "
                            "test accuracy averaged over the last 5 evaluations (rounds 42-50).")
            + "\n" + feedback_gain(all_runs)
            + "\n" + compare_table(all_runs, ("qsgd2", "qsgd4", "qsgd8"), "U2: QSGD at 2, 4 and 8 bits against FedAvg",
                                   "FedPAQ (Reisizadeh et al. 2020): quantised updates reach near FedAvg's accuracy at a "
                                   "fraction of the bits.")
            + "\n" + time_table(all_runs))






def check(evidence: Path) -> int:
    return check_rows(evidence, report(), "U[123]", "U1-U3")


if __name__ == "__main__":
    if "--check" in sys.argv:
        sys.exit(check(Path(sys.argv[sys.argv.index("--check") + 1])))
    if "--plot" in sys.argv:
        plot(runs())
    sys.stdout.write(report())

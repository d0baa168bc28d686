"""Tables of experiments/secagg/run.sh's runs (docs/evidence.md rows V1, V2), from each run's committed
summary.json and metrics.jsonl only (trains nothing):

    python experiments/secagg/table.py > experiments/secagg/results.md
    python experiments/secagg/table.py --check docs/evidence.md

--check recomputes the tables and fails (exit 1), naming them, if numbers in the measured column or the
verdict of docs/evidence.md's rows V1-V2 are not among them.

Bytes per client and round: a private run withholds `bytes_up` (docs/privacy.md), so they are computed here by
the formulas a run's `bytes_up` uses (docs/secagg.md "Bytes", secagg/cost.py; the test
`test_bytes_up_are_the_protocols` checks them against a run): central DP uploads the 7,850 float32 values;
DDGauss uploads the rotated vector of d' = 8,192 values at b bits each and SecAgg's messages with 99
neighbours (the complete graph of the 100 clients).
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/rows.py
from rows import check_rows, load_run  # noqa: E402

from distfl.secagg import cost

HERE = Path(__file__).resolve().parent
RUNS = HERE / "runs"
SEEDS = (0, 1)
BITS = (20, 18, 16, 14, 12, 10)
NAMES = ("central",) + tuple(f"ddgauss{b}" for b in BITS)
VALUES, PADDED, NEIGHBOURS = 7850, 8192, 99
LAST = 5  # evaluations averaged for "last-5 mean" (every 2 rounds: rounds 22-30)


def label(name: str) -> str:
    return "central DP-FedAvg (float32)" if name == "central" else f"DDGauss {name[7:]} bits"


def bytes_up(name: str) -> int:
    """A client's upload in one round."""
    return 4 * VALUES if name == "central" else cost.upload_bytes(PADDED, int(name[7:]), NEIGHBOURS)




def runs() -> dict:
    return {(name, seed): run for name in NAMES for seed in SEEDS if (run := load_run(RUNS, name, seed)) is not None}


def accuracies(run: dict) -> list[float]:
    return [100 * row["test_acc"] for row in run["metrics"] if "test_acc" in row]


def last5(run: dict) -> float:
    return statistics.mean(accuracies(run)[-LAST:])


def mean_std(values: list[float]) -> str:
    if not values:
        return "—"
    if len(values) == 1:
        return f"{values[0]:.2f} (1 seed)"
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"


def per_run_table(all_runs: dict) -> str:
    out = ["## Every run", "",
           "Final and best test accuracy (%), mean of the last 5 evaluations (rounds 22-30), epsilon spent (summary.json "
           "`privacy.epsilon`, delta 1e-3), the calibrated noise multiplier z (the noise on the sum has stddev z x clip), "
           "each client's noise stddev (DDGauss), the grid's scale 2^scale_bits, and the coordinates that wrapped "
           "(`secagg_wraps`, summed over the 30 rounds).", "",
           "| run | seed | final | best | last-5 mean | epsilon | z | client stddev | scale | wraps |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for (name, seed), run in all_runs.items():
        p, accs = run["summary"]["privacy"], accuracies(run)
        wraps = sum(row.get("secagg_wraps", 0) for row in run["metrics"])
        distributed = name != "central"
        out.append(f"| {label(name)} | {seed} | {accs[-1]:.2f} | {max(accs):.2f} | {last5(run):.2f} | {p['epsilon']:.4f} | "
                   f"{p['noise_multiplier']:.4f} | {p['local_sigma']:.4f} | 2^{round(p['scale']).bit_length() - 1} | "
                   f"{wraps} |" if distributed else
                   f"| {label(name)} | {seed} | {accs[-1]:.2f} | {max(accs):.2f} | {last5(run):.2f} | {p['epsilon']:.4f} | "
                   f"{p['noise_multiplier']:.4f} | — | — | — |")
    return "\n".join(out) + "\n"


def compare_table(all_runs: dict) -> str:
    out = ["## V1, V2: DDGauss at each bit width against central DP at the same epsilon", "",
           "Last-5 mean test accuracy over the seeds (mean ± std), its difference to central DP's on the same seed, "
           "and a client's upload in one round (bytes; share of central DP's).", "",
           "| run | seeds | last-5 mean acc | − central, per seed | − 20 bits, per seed | z / central's | final acc | "
           "bytes up a client a round | share of central's |",
           "|---|---|---|---|---|---|---|---|---|"]
    for name in NAMES:
        seeds = [seed for seed in SEEDS if (name, seed) in all_runs]
        size = f"{bytes_up(name):,} | {bytes_up(name) / bytes_up('central'):.4f}"
        if not seeds:
            out.append(f"| {label(name)} | not run | | | | | | {size} |")
            continue
        diffs = {base: [f"{last5(all_runs[name, seed]) - last5(all_runs[base, seed]):+.2f}"
                        for seed in seeds if (base, seed) in all_runs and name not in (base, "central")]
                 for base in ("central", "ddgauss20")}
        ratios = sorted({f"{all_runs[name, seed]['summary']['privacy']['noise_multiplier'] / all_runs['central', seed]['summary']['privacy']['noise_multiplier']:.4f}"
                         for seed in seeds if ("central", seed) in all_runs})
        out.append(f"| {label(name)} | {', '.join(map(str, seeds))} | "
                   f"{mean_std([last5(all_runs[name, seed]) for seed in seeds])} | "
                   f"{', '.join(diffs['central']) or '—'} | {', '.join(diffs['ddgauss20']) or '—'} | {', '.join(ratios)} | "
                   f"{mean_std([accuracies(all_runs[name, seed])[-1] for seed in seeds])} | {size} |")
    return "\n".join(out) + "\n"


def machine_load_run(RUNS, ) -> str:
    """The 1-minute load average sampled once a minute while the runs ran (load.txt)."""
    path = HERE / "load.txt"
    if not path.exists():
        return ""
    lines = [line.split() for line in path.read_text().splitlines() if line.strip()]
    loads = [float(line[1]) for line in lines]
    return (f"Machine: 2 shared vCPUs, no GPU; 1-minute load average {min(loads):.1f}-{max(loads):.1f} (median "
            f"{statistics.median(loads):.1f}; sampled each minute from {lines[0][0]} to {lines[-1][0]} UTC, `load.txt`) "
            "while other sessions' jobs shared the cores. Runs went two at a time, each on one thread at nice 10.\n\n")


def report() -> str:
    all_runs = runs()
    missing = [f"{name} seed {seed}" for seed in SEEDS for name in NAMES if (name, seed) not in all_runs]
    commands = "\n".join(f"    {run['cmd']}" for run in all_runs.values())
    head = ("# Distributed DP (DDGauss) against central DP on Fashion-MNIST: evidence runs\n\n"
            "Commands: `experiments/secagg/run.sh 0` and `experiments/secagg/run.sh 1` (config `fmnist.yaml`); "
            "each run's exact command line is `runs/NAME_sSEED.cmd`, its metrics `runs/NAME_sSEED/metrics.jsonl`. "
            "Tables: `python experiments/secagg/table.py`.\n\n"
            "Setting: real Fashion-MNIST, multinomial logistic regression (7,850 weights), 100 clients, Dirichlet(0.5), "
            "**every client in every round** (so neither accountant amplifies by sampling: central DP's cohorts are "
            "Poisson at rate 1, add/remove-one, as the distributed accountant's), 1 local epoch, batch 32, lr 0.1, "
            "server SGD lr 1, **30 rounds**, test accuracy every 2 rounds; user-level DP with clip 0.2, each run's "
            "noise calibrated (`privacy.target_epsilon=4`) to **epsilon 4 at delta 1e-3** by its own accounting. "
            "DDGauss: SecAgg's complete graph, beta = e^-0.5, the grid's scale_bits per bit width from "
            "`scale.py` (the largest whose calibrated sum fits the modular range with 4 standard deviations; at 10 "
            "bits none does and 0.9 of the most room is used). Noise keyed by the seed (a simulation). A DDGauss client's "
            f"upload holds {cost.upload_bytes(0, 0, NEIGHBOURS):,} bytes of SecAgg's messages with its {NEIGHBOURS} "
            "neighbours beside ceil(8,192 b / 8) bytes of masked integers.\n\n"
            + machine_load_run(RUNS, )
            + (f"Not run (no completed run by 10:20 UTC): {', '.join(missing)}; each would run with "
               "`experiments/secagg/run.sh SEED NAME`.\n\n" if missing else "")
            + "Commands run:\n\n" + commands + "\n\n")
    return head + compare_table(all_runs) + "\n" + per_run_table(all_runs)






def check(evidence: Path) -> int:
    return check_rows(evidence, report(), "V[12]", "V1-V2")


if __name__ == "__main__":
    if "--check" in sys.argv:
        sys.exit(check(Path(sys.argv[sys.argv.index("--check") + 1])))
    print(report(), end="")

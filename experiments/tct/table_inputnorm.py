"""The input-normalisation table from experiments/tct/results_inputnorm/*/ (markdown on stdout)."""
import json
from pathlib import Path

ROOT = Path(__file__).parent / "results_inputnorm"
STAGE2_ROUNDS = (10, 20, 50, 100)


def load(run_dir):
    summary = json.loads((run_dir / "summary.json").read_text())
    stage2 = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        m = json.loads(line)
        if "stage2_round" in m and "test_acc" in m:
            stage2[m["stage2_round"]] = m["test_acc"]
    tct = summary["phases"]["tct"]
    return [tct["stage1_test_acc"]] + [stage2.get(r) for r in STAGE2_ROUNDS] + [tct["test_acc"]]


def pct(v):
    return "—" if v is None else f"{100 * v:.2f}"


def main():
    runs = {d.name: load(d) for d in sorted(ROOT.iterdir()) if (d / "summary.json").exists()}
    columns = ["stage 1"] + [f"stage 2, round {r}" for r in STAGE2_ROUNDS] + ["TCT final"]
    print("| run | " + " | ".join(columns) + " |")
    print("|---|" + "---|" * len(columns))
    for name, values in runs.items():
        print(f"| {name} | " + " | ".join(pct(v) for v in values) + " |")
    for name, values in runs.items():  # mean_std minus none, per seed
        if "_mean_std_" in name and name.replace("_mean_std_", "_none_") in runs:
            base = runs[name.replace("_mean_std_", "_none_")]
            diff = ["—" if a is None or b is None else f"{100 * (a - b):+.2f}" for a, b in zip(values, base)]
            print(f"| {name.split('_')[-1]}: mean_std − none (points) | " + " | ".join(diff) + " |")


if __name__ == "__main__":
    main()

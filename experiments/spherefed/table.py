"""The SphereFed results table from experiments/spherefed/results/*/summary.json (markdown on stdout)."""
import json
import sys
from pathlib import Path

ROOT = Path(__file__).parent / "results"
SKEWS = [("iid", "iid"), ("0.5", "Dir(0.5)"), ("0.1", "Dir(0.1)")]


def load(method, skew, tag=""):
    path = ROOT / f"{method}_{skew}{tag}" / "summary.json"
    return json.loads(path.read_text()) if path.exists() else None


def cell(value):
    return "—" if value is None else f"{100 * value:.2f}"


def main(tag=""):
    rows = {"FedAvg": [], "FedAvg + FFC (on CE features)": [], "FedAvg + sphere head": [],
            "FedAvg + sphere head + FFC (SphereFed)": []}
    extra = {"cond": [], "solver": [], "ffc_s": [], "wall": []}
    for skew, _ in SKEWS:
        ce, sp = load("fedavg", skew, tag), load("sphere", skew, tag)
        for name, run, key in [("FedAvg", ce, "test_acc_before"), ("FedAvg + FFC (on CE features)", ce, "test_acc"),
                               ("FedAvg + sphere head", sp, "test_acc_before"),
                               ("FedAvg + sphere head + FFC (SphereFed)", sp, "test_acc")]:
            rows[name].append(run["phases"]["ffc"][key] if run else None)
    print("| method (final test accuracy %) | " + " | ".join(label for _, label in SKEWS) + " |")
    print("|---|" + "---|" * len(SKEWS))
    for name, values in rows.items():
        print(f"| {name} | " + " | ".join(cell(v) for v in values) + " |")
    gains = [None if a is None or b is None else b - a
             for a, b in zip(rows["FedAvg"], rows["FedAvg + sphere head + FFC (SphereFed)"])]
    print("| SphereFed - FedAvg (points) | " + " | ".join("—" if g is None else f"{100 * g:+.2f}" for g in gains) + " |")
    print()
    print("| run | skew | FFC solver | rank of sum Z^T Z | condition number | FFC s | run wall s |")
    print("|---|---|---|---|---|---|---|")
    for skew, label in SKEWS:
        for method in ("fedavg", "sphere"):
            run = load(method, skew, tag)
            if run:
                f = run["phases"]["ffc"]
                cond = "∞ (singular)" if f["condition_number"] is None else f"{f['condition_number']:.3g}"
                print(f"| {method} | {label} | {f['solver']} | {f['rank']} / 84 | {cond} | {f['total_s']:.1f} | {run['wall_s']:.0f} |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "")

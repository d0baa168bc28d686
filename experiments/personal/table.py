"""Table of the personalised-FL comparison (experiments/personal/run.sh): per split and method, over the
seeds that finished, mean ± sample std of the global model's test accuracy and of the per-client
statistics of the last evaluation (eval.clients: each client's own model; FedAvg: the global model).

    python experiments/personal/table.py [runs/personal]
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

METHODS = ["fedavg", "fedper", "fedrep", "fedbabu", "ditto", "apfl"]
SPLITS = {"dir01": "Dir(0.1)", "c2": "#C=2"}


def cell(values: list[float], one_seed: str = " (1 seed)") -> str:
    """Fractions as percent: mean ± sample std over seeds; one value with `one_seed` after it; "—" for none."""
    if not values:
        return "—"
    pct = [100 * v for v in values]
    if len(pct) == 1:
        return f"{pct[0]:.2f}{one_seed}"
    return f"{statistics.mean(pct):.2f} ± {statistics.stdev(pct):.2f}"


def main(root: Path) -> None:
    print("| split | method | seeds | per-client acc, mean | per-client acc, std over clients | per-client p10 | global test acc |")
    print("|---|---|---|---|---|---|---|")
    for split, label in SPLITS.items():
        for method in METHODS:
            runs = []
            for seed_dir in sorted(root.glob(f"{split}_{method}_s*")):
                summary = seed_dir / "summary.json"
                if seed_dir.is_dir() and summary.is_file():
                    s = json.loads(summary.read_text())
                    if s["status"] == "completed":
                        runs.append(s)
            if not runs:
                continue
            client = [r["final_client_acc"] for r in runs]
            print(f"| {label} | {method} | {len(runs)} | {cell([c['mean'] for c in client])} | "
                  f"{cell([c['std'] for c in client])} | {cell([c['p10'] for c in client])} | "
                  f"{cell([r['final_test_acc'] for r in runs])} |")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "runs/personal"))

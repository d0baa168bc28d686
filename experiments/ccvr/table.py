"""CCVR beside FFC on the same trained FedAvg models: python experiments/ccvr/table.py [alpha]

Reads experiments/ccvr/results/fedavg_<alpha>_s<seed>/summary.json (CCVR) and fedavg_<alpha>_s<seed>_ffc
(FFC on a copy of the same run, resumed from its last training round: experiments/ccvr/run.sh). The
table checks that both calibrated the same trained model: every training round's test accuracy and the
accuracy before calibration match.
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def main(alpha: str = "0.1") -> None:
    table, gains = [], {"ffc": [], "ccvr": []}
    for ccvr_dir in sorted((ROOT / "experiments/ccvr/results").glob(f"fedavg_{alpha}_s[0-9]")):
        ffc_dir = ccvr_dir.with_name(ccvr_dir.name + "_ffc")
        if not (ccvr_dir / "summary.json").exists() or not (ffc_dir / "summary.json").exists():
            continue
        seed = int(ccvr_dir.name.rsplit("_s", 1)[1])
        ccvr = json.loads((ccvr_dir / "summary.json").read_text())["phases"]["ccvr"]
        ffc = json.loads((ffc_dir / "summary.json").read_text())["phases"]["ffc"]
        trained = [(r["round"], r.get("test_acc")) for r in rows(ccvr_dir) if "phase" not in r]
        same = trained == [(r["round"], r.get("test_acc")) for r in rows(ffc_dir) if "phase" not in r]
        same = same and ccvr["test_acc_before"] == ffc["test_acc_before"]
        before = 100 * ccvr["test_acc_before"]
        gains["ffc"].append(100 * ffc["test_acc"] - before)
        gains["ccvr"].append(100 * ccvr["test_acc"] - before)
        table.append(f"| {seed} | {before:.2f} | {100 * ffc['test_acc']:.2f} ({gains['ffc'][-1]:+.2f}) | "
                     f"{100 * ccvr['test_acc']:.2f} ({gains['ccvr'][-1]:+.2f}) | "
                     f"{100 * (ccvr['test_acc'] - ffc['test_acc']):+.2f} | {'yes' if same else 'NO'} | "
                     f"{ccvr['total_s']:.1f} s |")
    print(f"Dir({alpha}), 10 clients, SimpleCNN, FedAvg 20 rounds x 1 local epoch (configs/paper/spherefed/fmnist_fedavg.yaml)\n")
    print("| seed | FedAvg | + FFC (gain) | + CCVR (gain) | CCVR − FFC | same trained model | CCVR phase |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(table))
    for name, values in gains.items():
        spread = f" ± {statistics.stdev(values):.2f}" if len(values) > 1 else ""
        print(f"\n{name} gain over FedAvg: {statistics.mean(values):+.2f}{spread} ({len(values)} seed(s))", end="")
    print()


if __name__ == "__main__":
    main(*sys.argv[1:])

"""Paired differences on the all-methods runs (the numbers the evidence rows P7-P8, L1-L2 and C2 of
docs/evidence.md quote): METHOD minus each OTHER, per split and seed, on the per-client mean at round 100
(personalised claims) or with --global on the global model's test accuracy (after calibration for ccvr
and ffc), from runs/<split>_<method>_s<seed>/summary.json. "fedavg" scored per client is FedAvg's global
model on each client's test split.

    python experiments/all_methods/pairs.py pfedme fedavg perfedavg fedavg_ft
    python experiments/all_methods/pairs.py --global ccvr fedavg ffc
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

RUNS = Path(__file__).resolve().parent / "runs"
SPLITS = {"dir01": "Dir(0.1)", "c2": "#C=2"}


def score(split: str, method: str, seed: int, glob: bool) -> float | None:
    path = RUNS / f"{split}_{method}_s{seed}" / "summary.json"
    if not path.exists():
        return None
    s = json.loads(path.read_text())
    if s["status"] != "completed":
        return None
    return 100 * (s["final_test_acc"] if glob else s["final_client_acc"]["mean"])


def main(argv: list[str]) -> None:
    glob = "--global" in argv
    method, *others = [a for a in argv if a != "--global"]
    print(f"{method} ({'global test acc' if glob else 'per-client mean'}), then {method} - other; seeds 0, 1")
    for split, label in SPLITS.items():
        own = [score(split, method, seed, glob) for seed in (0, 1)]
        print(f"{label}: {method} " + ", ".join("—" if v is None else f"{v:.2f}" for v in own))
        for other in others:
            diffs = []
            for seed, mine in zip((0, 1), own):
                theirs = score(split, other, seed, glob)
                diffs.append("—" if mine is None or theirs is None else f"{mine - theirs:+.2f}")
            print(f"  - {other}: {', '.join(diffs)}")


if __name__ == "__main__":
    main(sys.argv[1:])

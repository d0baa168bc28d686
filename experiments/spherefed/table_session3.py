"""Session 3 of the SphereFed evidence: d = 256 and the cosine schedule (markdown on stdout).

Reads experiments/spherefed/results_session3/<method>_<variant>_<skew>_s<seed>/summary.json (written by
run_session3.sh) and, as the d = 84 constant-lr reference, the earlier runs in results/ (seed 0:
<method>_<skew>, seed 1: <method>_<skew>_seed-1). Final test accuracy after round 20, before and
after FFC; mean ± sample std over seeds, per-seed values in brackets. Differences to FedAvg are
taken per seed (the same seed gives both methods the same partition), then averaged.
"""
import json
import statistics
from pathlib import Path

HERE = Path(__file__).parent
SEEDS = [0, 1]
SKEW_LABELS = {"0.1": "Dir(0.1)", "0.5": "Dir(0.5)", "iid": "iid"}
# (variant, label): "ref" is the session-1 runs in results/
VARIANTS = [("ref", "d = 84, constant lr (earlier runs)"), ("d256", "d = 256, constant lr"),
            ("cos", "d = 84, cosine lr")]


def load(method, variant, skew, seed):
    if variant == "ref":
        path = HERE / "results" / f"{method}_{skew}{'' if seed == 0 else f'_seed-{seed}'}" / "summary.json"
    else:
        path = HERE / "results_session3" / f"{method}_{variant}_{skew}_s{seed}" / "summary.json"
    return json.loads(path.read_text()) if path.exists() else None


def summary(values, signed=False):
    """'mean ± sample std (v0, v1)' in percent (or points, signed); `values` are fractions."""
    values = [100 * v for v in values]
    sign = "+" if signed else ""
    spread = f" ± {statistics.stdev(values):.2f}" if len(values) > 1 else ""
    per_seed = ", ".join(f"{v:{sign}.2f}" for v in values)
    return f"{statistics.mean(values):{sign}.2f}{spread} ({per_seed})"


def main():
    print("| setting | skew | seeds | FedAvg | FedAvg + FFC | sphere head alone | SphereFed (+ FFC) "
          "| head alone − FedAvg | SphereFed − FedAvg |")
    print("|---|---|---|---|---|---|---|---|---|")
    details = []
    for skew, skew_label in SKEW_LABELS.items():
        if not any(load(m, v, skew, s) for m in ("fedavg", "sphere") for v, _ in VARIANTS[1:] for s in SEEDS):
            continue  # no session-3 run at this skew: its reference row is in results.md already
        for variant, label in VARIANTS:
            pairs = [(seed, load("fedavg", variant, skew, seed), load("sphere", variant, skew, seed)) for seed in SEEDS]
            pairs = [(seed, ce, sp) for seed, ce, sp in pairs if ce and sp]
            if not pairs:
                continue
            ce = [p[1]["phases"]["ffc"] for p in pairs]
            sp = [p[2]["phases"]["ffc"] for p in pairs]
            cells = [summary([f["test_acc_before"] for f in ce]), summary([f["test_acc"] for f in ce]),
                     summary([f["test_acc_before"] for f in sp]), summary([f["test_acc"] for f in sp]),
                     summary([s["test_acc_before"] - c["test_acc_before"] for c, s in zip(ce, sp)], signed=True),
                     summary([s["test_acc"] - c["test_acc_before"] for c, s in zip(ce, sp)], signed=True)]
            seeds = ", ".join(str(p[0]) for p in pairs)
            print(f"| {label} | {skew_label} | {seeds} | " + " | ".join(cells) + " |")
            if variant != "ref":
                for seed, *runs in pairs:
                    for method, run in zip(("fedavg", "sphere"), runs):
                        details.append((f"{method}_{variant}_{skew}_s{seed}", run))
    print()
    print("| run | d | best round before FFC (acc) | FFC solver | rank of sum Z^T Z | condition number | FFC s | run wall s |")
    print("|---|---|---|---|---|---|---|---|")
    for name, run in details:
        f = run["phases"]["ffc"]
        d = 256 if "_d256_" in name else 84
        cond = "∞ (singular)" if f["condition_number"] is None else f"{f['condition_number']:.3g}"
        print(f"| {name} | {d} | {run['best_round']} ({100 * run['best_test_acc']:.2f}) | {f['solver']} | "
              f"{f['rank']} / {d} | {cond} | {f['total_s']:.1f} | {run['wall_s']:.0f} |")


if __name__ == "__main__":
    main()

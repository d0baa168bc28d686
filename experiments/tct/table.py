"""The TCT results table from experiments/tct/results/*/summary.json (markdown on stdout)."""
import json
from pathlib import Path

ROOT = Path(__file__).parent / "results"
SETTINGS = [("C1", "#C=1", 35.10, 86.32), ("C2", "#C=2", 85.18, 90.33),
            ("a0.1", "α=0.1", 86.18, 90.78), ("a0.5", "α=0.5", 90.09, 91.13)]


def main():
    runs = {name: json.loads((ROOT / name / "summary.json").read_text())
            for name, *_ in SETTINGS if (ROOT / name / "summary.json").exists()}
    print("| | " + " | ".join(label for _, label, *_ in SETTINGS) + " |")
    print("|---|" + "---|" * len(SETTINGS))

    def row(title, values):
        print(f"| {title} | " + " | ".join(values) + " |")

    def measured(key):
        return [f"{100 * runs[n]['phases']['tct'][key]:.2f}" if n in runs else "—" for n, *_ in SETTINGS]

    row("FedAvg, stage 1 only (10 rounds; measured)", measured("stage1_test_acc"))
    row("TCT (10 + 100 rounds; measured)", measured("test_acc"))
    row("paper FedAvg (200 rounds)", [f"{f:.2f}" for _, _, f, _ in SETTINGS])
    row("paper TCT (100 + 100 rounds)", [f"{t:.2f}" for *_, t in SETTINGS])
    row("TCT gap to the paper (points)",
        [f"{100 * runs[n]['phases']['tct']['test_acc'] - t:+.2f}" if n in runs else "—" for n, _, _, t in SETTINGS])
    print()
    print("| setting | p | features s | stage 2 s | lambda_max | wall s (whole run) |")
    print("|---|---|---|---|---|---|")
    for name, label, *_ in SETTINGS:
        if name in runs:
            t = runs[name]["phases"]["tct"]
            print(f"| {label} | {t['p']} | {t['features_s']:.0f} | {t['stage2_s']:.0f} | {t['lambda_max']:.3g} | "
                  f"{runs[name]['wall_s']:.0f} |")


if __name__ == "__main__":
    main()

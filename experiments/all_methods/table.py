"""The all-methods table (experiments/all_methods/run.sh): per split and method, over the
seeds that finished, mean ± sample std of the last evaluation (round 100; a run that diverged is
counted in "seeds", left out of the statistics, and listed per seed with its last evaluation): the global model's test
accuracy (pooled test set) and the per-client statistics of eval.clients (each client's local test split;
a personalised method scores each client's own model, every other method its global model, fedavg_ft the
global model fine-tuned by each client). The "score" column is what the method is ranked by: per-client
mean accuracy for the personalised methods (and fedavg_ft), global test accuracy for the others. A method
with no finished run on a split has a "not run" row naming the command that runs it.

    python experiments/all_methods/table.py [experiments/all_methods/runs]
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "personal"))
import table as personal_table  # noqa: E402  (experiments/personal/table.py: the same cells)

GROUPS = [
    ("FedAvg family", ["fedavg", "fedprox", "scaffold", "feddyn", "fednova"]),
    ("the five papers", ["fedadc", "slowmo", "fedfor", "gma", "spherefed", "tct"]),
    ("global-model baselines", ["moon", "fedexp"]),
    ("label skew", ["fedlc", "fedntd", "ccvr", "ffc"]),
    ("personalised", ["local", "fedavg_ft", "fedper", "lgfedavg", "fedrep", "fedbabu", "ditto", "apfl", "perfedavg",
                      "pfedme", "fedrod", "fedproto", "fedala", "fedpac"]),
]
PERSONALISED = {"local", "fedavg_ft", "fedper", "lgfedavg", "fedrep", "fedbabu", "ditto", "apfl", "perfedavg", "pfedme",
                "fedrod", "fedproto", "fedala", "fedpac"}
LABELS = {"slowmo": "slowmo (FedADC's baseline)", "gma": "fedavg + GMA", "spherefed": "SphereFed + FFC",
          "tct": "TCT (p = 4,096)", "fedavg_ft": "FedAvg + FT (5 epochs)",
          "local": "local only", "ccvr": "FedAvg + CCVR", "ffc": "FedAvg + FFC"}
SPLITS = {"dir01": "Dir(0.1)", "c2": "#C=2"}
# Local work of a sampled client in a round at the protocol's 1 local epoch (docs/algorithms/*.md, "Cost"), and
# what scoring adds: the compute a row's accuracy was bought with.
WORK = {"fedrep": "11 epochs (10 head, 1 body)", "fedbabu": "1 epoch; 5 fine-tuning epochs at scoring",
        "fedavg_ft": "1 epoch; 5 fine-tuning epochs at scoring", "ditto": "2 epochs", "apfl": "1 epoch, 2 passes a step",
        "moon": "1 epoch, 3 forward passes a step", "fedntd": "1 epoch, +1 forward pass a step",
        "perfedavg": "1 epoch, 2 half-batch passes a step (FO); 1 step at scoring",
        "pfedme": "1 epoch, 6 passes a step (K = 5)", "fedala": "1 epoch + 0.8 epoch of ALA (up to 50 x 0.8 the first time)",
        "fedpac": "2 epochs (1 head, 1 body) + 2 forward-only passes", "tct": "1 epoch; then stage 2",
        "spherefed": "1 epoch; then FFC", "ccvr": "1 epoch; then CCVR", "ffc": "1 epoch; then FFC"}
CALIBRATED = ("ccvr", "ffc")  # distfl calibrate on a copy of one FedAvg training (run.sh: <split>_calibrated_fedavg_s<seed>)


def cell(values: list[float]) -> str:
    return personal_table.cell(values, one_seed="")


def finished(root: Path, split: str, method: str) -> list[tuple[int, dict]]:
    runs = []
    for summary in sorted(root.glob(f"{split}_{method}_s*/summary.json")):
        s = json.loads(summary.read_text())
        if s["status"] in ("completed", "diverged"):
            runs.append((int(summary.parent.name.rsplit("_s", 1)[1]), s))
    return runs


def client(s: dict, key: str) -> float | None:
    c = s.get("final_client_acc")
    return None if c is None else c[key]


def training_rows(run: Path) -> list[dict]:
    """The evaluations of a run's training rounds (not those of a calibration phase after them)."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [{k: r[k] for k in ("round", "test_acc", "client_acc_mean") if k in r}
            for r in rows if "test_acc" in r and "phase" not in r]


def same_training(root: Path) -> list[str]:
    """For FedAvg + CCVR and FedAvg + FFC: is the model they calibrate FedAvg's (the training run's model hash
    against the fedavg row's) and are their training evaluations FedAvg's, every one?"""
    lines = []
    for split, label in SPLITS.items():
        for base in sorted(root.glob(f"{split}_calibrated_fedavg_s*/summary.json")):
            seed = base.parent.name.rsplit("_s", 1)[1]
            fedavg = root / f"{split}_fedavg_s{seed}"
            if not (fedavg / "summary.json").exists():
                continue
            trained = json.loads(base.read_text())["model_sha256"][:8]
            reference = json.loads((fedavg / "summary.json").read_text())["model_sha256"][:8]
            evaluations = {m: training_rows(root / f"{split}_{m}_s{seed}") == training_rows(fedavg)
                           for m in CALIBRATED if (root / f"{split}_{m}_s{seed}" / "summary.json").exists()}
            lines.append(f"- {label}, seed {seed}: the trained model {trained} "
                         f"({'=' if trained == reference else '!='} fedavg's {reference}); training evaluations "
                         + ", ".join(f"{LABELS[m]} {'equal to' if same else 'differ from'} FedAvg's"
                                     for m, same in evaluations.items()))
    return lines


def main(root: Path) -> None:
    print("| split | method | seeds | score | global test acc | best global acc | per-client mean | "
          "per-client std over clients | per-client p10 | local work a round |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    per_seed = []
    for split, label in SPLITS.items():
        for group, methods in GROUPS:
            for method in methods:
                runs = finished(root, split, method)
                if not runs:
                    print(f"| {label} | {LABELS.get(method, method)} ({group}) | 0 | not run: `METHODS={method} "
                          f"experiments/all_methods/run.sh {split} \"0 1\"` | — | — | — | — | — | {WORK.get(method, '1 epoch')} |")
                    continue
                diverged = sum(s["status"] == "diverged" for _, s in runs)
                seeds = f"{len(runs)}" + (f", {diverged} diverged" if diverged else "")
                ss = [s for _, s in runs if s["status"] == "completed"]
                if not ss:
                    print(f"| {label} | {LABELS.get(method, method)} ({group}) | {seeds} | **diverged** | — | — | — | — | — | "
                          f"{WORK.get(method, '1 epoch')} |")
                for seed, s in runs:
                    status = "" if s["status"] == "completed" else f" (diverged in {s['error'].split(':')[0]}; round {s['rounds']}'s evaluation)"
                    if s["final_test_acc"] is None:  # diverged before its first evaluation
                        status = f"— (diverged in {s['error'].split(':')[0]}, before any evaluation)"
                    glob_acc = "" if s["final_test_acc"] is None else f"{100 * s['final_test_acc']:.2f}"
                    per_seed.append(f"| {label} | {method} | {seed} | {glob_acc}{status} | "
                                    + (f"{100 * client(s, 'mean'):.2f}" if client(s, "mean") is not None else "—")
                                    + f" | {s['model_sha256'][:8]} | {s['wall_s']:.0f} |")
                if not ss:
                    continue
                glob = [s["final_test_acc"] for s in ss]
                clients = {k: [v for v in (client(s, k) for s in ss) if v is not None] for k in ("mean", "std", "p10")}
                score = clients["mean"] if method in PERSONALISED else glob
                kind = "per-client" if method in PERSONALISED else "global"
                print(f"| {label} | {LABELS.get(method, method)} ({group}) | {seeds} | **{cell(score)}** ({kind}) | "
                      f"{cell(glob)} | {cell([s['best_test_acc'] for s in ss])} | {cell(clients['mean'])} | "
                      f"{cell(clients['std'])} | {cell(clients['p10'])} | {WORK.get(method, '1 epoch')} |")
    print("\nPer seed:\n")
    print("| split | method | seed | global test acc | per-client mean | model hash | wall s |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(per_seed))
    checks = same_training(root)
    if checks:
        print("\nFedAvg + CCVR and FedAvg + FFC calibrate the same trained model as the fedavg row:\n")
        print("\n".join(checks))


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "experiments/all_methods/runs"))

"""Per-class test accuracy of the final global model of each run matching a glob (its newest checkpoint):

    python experiments/gma/per_class.py "runs/evidence/gma10c_m09_lr0.01_slr1.0_s*/aggregation.mask=*/seed=*"

Prints one row per run: the checkpoint's round, its test accuracy and the accuracy on each of the 10
classes, then the mean over FMNIST's four upper-body classes (0 T-shirt, 2 pullover, 4 coat, 6 shirt),
the ones a 2-class client confuses unless it holds two of them. Used to trace the GMA 10-client runs'
split-to-split spread (results.md, session 5).
"""
from __future__ import annotations

import glob
import sys
import warnings
from pathlib import Path

import torch

from distfl.checkpoint import load
from distfl.config import data_seed, load_config
from distfl.data.datasets import load_dataset
from distfl.federation.local import FlatModel
from distfl.models import build_model

UPPER_BODY = (0, 2, 4, 6)


def per_class(run: Path) -> tuple[int, float, list[float]]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # keys the saved config sets but its algorithm ignores
        cfg = load_config(str(run / "config.yaml"), [])
    data = load_dataset(cfg.data, data_seed(cfg))
    flat = FlatModel(build_model(cfg.model, data.input_shape, data.num_classes))
    state = load(sorted((run / "checkpoints").glob("round_*"))[-1], torch.device("cpu"))
    flat.load(state["params"], state["buffers"])
    model = flat.module.eval()
    with torch.no_grad():
        pred = torch.cat([model(data.test_x[i:i + 2000]).argmax(1) for i in range(0, len(data.test_x), 2000)])
    y = data.test_y
    classes = [100 * float((pred[y == c] == c).float().mean()) for c in range(data.num_classes)]
    return int(state["round"]), 100 * float((pred == y).float().mean()), classes


def main(pattern: str) -> None:
    torch.set_num_threads(1)
    print("| run | round | test acc | " + " | ".join(f"class {c}" for c in range(10)) + " | upper-body mean |")
    print("|---|---|---|" + "---|" * 10 + "---|")
    for run in sorted(Path(p) for p in glob.glob(pattern)):
        rnd, acc, classes = per_class(run)
        upper = sum(classes[c] for c in UPPER_BODY) / len(UPPER_BODY)
        name = f"{run.parent.parent.name}/{run.parent.name}/{run.name}"
        print(f"| {name} | {rnd} | {acc:.2f} | " + " | ".join(f"{a:.1f}" for a in classes) + f" | {upper:.1f} |")


if __name__ == "__main__":
    main(sys.argv[1])

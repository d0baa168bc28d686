"""Why pFedMe diverged at the paper's setting on the all-methods protocol: log ||theta - w|| at every one
of the K inner steps (and after them) of every local step, with ||w||, by wrapping the function pFedMe
evaluates theta with (distfl/algorithms/pfedme.py calls it K times with the theta of each inner step, then
once with the final theta). One JSON line per local step: {"step", "gap": [K + 1 values], "w"}.

    PYTHONPATH=. python experiments/all_methods/pfedme_inner_steps.py LOG.jsonl train \
        experiments/personal/fmnist.yaml train.rounds=8 eval.every=10 algorithm.name=pfedme train.lr=0.005 \
        partition.scheme=dirichlet partition.alpha=0.1 seed=0 output.dir=/tmp/pfedme_diag --overwrite
    gzip LOG.jsonl     # experiments/all_methods/pfedme_search/dir01_paper_inner_steps.jsonl.gz
"""
from __future__ import annotations

import json
import math
import sys

import torch

import distfl.algorithms.pfedme as pfedme
from distfl.cli import main

calls_per_step = None
evaluate = pfedme.call_at
log = open(sys.argv[1], "w")
step = {"n": 0, "gap": []}


def recorded(model, views, flat, x):
    with torch.no_grad():
        w = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        gap = float((flat.detach() - w).norm())
        step["gap"].append(gap if math.isfinite(gap) else None)
        if len(step["gap"]) == calls_per_step:
            step["n"] += 1
            norm = float(w.norm())
            log.write(json.dumps({"step": step["n"], "gap": step["gap"], "w": norm if math.isfinite(norm) else None}) + "\n")
            step["gap"] = []
    return evaluate(model, views, flat, x)


if __name__ == "__main__":
    steps = next((int(a.split("=", 1)[1]) for a in sys.argv if a.startswith("algorithm.options.steps=")), 5)
    calls_per_step = steps + 1
    pfedme.call_at = recorded
    sys.exit(main(sys.argv[2:]))

"""Why pFedMe diverged at the paper's setting on the all-methods protocol: log ||theta - w|| at every one
of the K inner steps (and after them) of every local step, with ||w||, by wrapping the function pFedMe
evaluates theta with (distfl/algorithms/pfedme.py calls it K times with the theta of each inner step, then
once with the final theta). One JSON line per local step: {"step", "gap": [K + 1 values], "w"}.

    PYTHONPATH=. python experiments/all_methods/pfedme_inner_steps.py LOG.jsonl train \
        experiments/personal/fmnist.yaml train.rounds=8 eval.every=10 algorithm.name=pfedme train.lr=0.005 \
        partition.scheme=dirichlet partition.alpha=0.1 seed=0 output.dir=/tmp/pfedme_diag --overwrite
    gzip LOG.jsonl     # experiments/all_methods/pfedme_search/dir01_paper_inner_steps.jsonl.gz
    python experiments/all_methods/pfedme_inner_steps.py --summary LOG.jsonl.gz

--summary: per block of 100 local steps, in how many the inner steps' oscillation grows (|gap_K - gap_{K-1}|
above |gap_2 - gap_1|), and the first local step where ||theta - w|| passes 1,000 or stops being finite.
"""
from __future__ import annotations

import gzip
import json
import math
import sys

import torch

import distfl.algorithms.pfedme as pfedme
from distfl.cli import main

calls_per_step = None
evaluate = pfedme.call_at
log = None  # the JSON-lines file, opened by the main branch
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


def summary(path: str) -> None:
    rows = [json.loads(line) for line in gzip.open(path, "rt") if line.strip()]
    for start in range(0, len(rows), 100):
        block = [r["gap"] for r in rows[start:start + 100] if None not in r["gap"]]
        grows = sum(abs(g[-1] - g[-2]) > abs(g[2] - g[1]) for g in block)
        print(f"local steps {start + 1}-{start + len(rows[start:start + 100])}: oscillation grows in {grows} of {len(block)}")
    first = next((r for r in rows if None in r["gap"] or max(r["gap"]) > 1e3), None)
    if first is not None:
        print(f"first blow-up: local step {first['step']}, gaps {first['gap']}, ||w|| {first['w']}")


if __name__ == "__main__" and sys.argv[1] == "--summary":
    summary(sys.argv[2])
elif __name__ == "__main__":
    log = open(sys.argv[1], "w")
    steps = next((int(a.split("=", 1)[1]) for a in sys.argv if a.startswith("algorithm.options.steps=")), 5)
    calls_per_step = steps + 1
    pfedme.call_at = recorded
    sys.exit(main(sys.argv[2:]))

"""Summarise experiments/fedfor/results/*/ in the paper's Table 2 style.

    python experiments/fedfor/table.py            # markdown tables on stdout
    python experiments/fedfor/table.py --upto 30  # every run cut at round 30: one table per E, mean over seeds
    python experiments/fedfor/table.py --readings # alpha 5 under each boundary x normalisation (results/readings)

Per run: best test accuracy up to halfway and up to the last round (running max over evaluated rounds,
the paper's "best validation accuracy up to round t"), ACCx = first evaluated round with accuracy >= x%,
status (diverged runs stop at the round that produced a non-finite model), wall time. Tags ending in
_s1 are the same run with seed=1 (other rows: seed 0).
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
TARGETS = (60, 65, 70, 75)


def load(tag: str):
    d = RESULTS / tag
    if not (d / "summary.json").exists():
        return None
    rows = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines() if line.strip()]
    summary = json.loads((d / "summary.json").read_text())
    cfg = (d / "config.yaml").read_text()
    total = int(re.search(r"rounds: (\d+)", cfg).group(1))
    return rows, summary, total


def best_upto(rows, t):
    accs = [r["test_acc"] for r in rows if "test_acc" in r and r["round"] <= t]
    return max(accs) if accs else None


def first_at(rows, x):
    for r in rows:
        if "test_acc" in r and r["test_acc"] >= x / 100:
            return r["round"]
    return None


def fmt_acc(a):
    return "—" if a is None else f"{100 * a:.2f}"


def row(tag, label):
    got = load(tag)
    if got is None:
        return None
    rows, summary, total = got
    half = total // 2
    last = rows[-1]["round"] if rows else 0
    status = summary["status"] if summary["status"] == "completed" else f"diverged at round {last + 1}"
    evals = [r["test_acc"] for r in rows if "test_acc" in r]
    accs = [fmt_acc(best_upto(rows, half)), fmt_acc(best_upto(rows, total)), fmt_acc(evals[-1] if evals else None)]
    hits = []
    for x in TARGETS:
        r = first_at(rows, x)
        hits.append(str(r) if r is not None else ("—" if summary["status"] != "completed" else f">{last}"))
    wall = summary.get("wall_s")
    return f"| {label} | {' | '.join(accs)} | {' | '.join(hits)} | {status} | {wall:.0f} |"


METHODS = [
    ("fedavg", "FedAvg"),
    ("fedprox", "FedProx (mu 0.01)"),
    ("fedavgm0.5", "FedAvgM (server momentum 0.5)"),
    ("fedfor_norm", "FedFOR alpha 5, ge, normalised by local steps (default)"),
    ("fedfor", "FedFOR alpha 5, ge, literal (normalize none)"),
    ("fedfor_gt", "FedFOR alpha 5, gt, literal (normalize none)"),
    ("fedfor_a0.25", "FedFOR alpha 0.25, ge"),
    ("fedfor_a0.5", "FedFOR alpha 0.5, ge"),
    ("fedfor_gt_a0.5", "FedFOR alpha 0.5, gt"),
    ("fedfor_a1", "FedFOR alpha 1, ge"),
    ("fedfor_a2", "FedFOR alpha 2, ge"),
]


def cut_row(e, method, label, upto):
    """One method at local epochs e over seeds 0 and 1, every run cut at round `upto`."""
    runs = [got for got in (load(f"{method}_E{e}{sfx}") for sfx in ("", "_s1")) if got is not None]
    if not runs:
        return None
    cut = [[r for r in rows if r["round"] <= upto] for rows, _, _ in runs]
    diverged = [summary["status"] != "completed" and rows[-1]["round"] < upto for (_, summary, _), rows
                in zip(runs, cut)]
    bests = [best_upto(rows, upto) for rows in cut]
    cells = [" / ".join("div." if d else fmt_acc(b) for b, d in zip(bests, diverged))]
    ok = [b for b, d in zip(bests, diverged) if not d and b is not None]
    cells.append(f"{100 * sum(ok) / len(ok):.2f}" if len(ok) == len(runs) else "—")
    for x in TARGETS:
        hits = [first_at(rows, x) for rows in cut]
        cells.append(" / ".join("—" if d else (str(h) if h is not None else f">{upto}")
                                for h, d in zip(hits, diverged)))
    return f"| {label} | {len(runs)} | {' | '.join(cells)} |"


def compare(upto: int) -> None:
    for e in (1, 2, 4, 8):
        lines = [line for line in (cut_row(e, m, label, upto) for m, label in METHODS) if line]
        if not lines:
            continue
        print(f"\n**E = {e}**, first {upto} rounds (a / b: seeds 0 / 1; div.: diverged)\n")
        heads = ["best acc per seed", "mean best"] + [f"ACC{x}" for x in TARGETS]
        print(f"| method | seeds | {' | '.join(heads)} |")
        print("|" + "---|" * (len(heads) + 2))
        print("\n".join(lines))


READINGS = [
    ("paper", "longtail clients, the paper's batch 128, lr 0.01"),
    ("user", "quickstart + #C=2 split (lr 0.1, batch 32)"),
]


def readings() -> None:
    print("| setting | reading | outcome | test acc, rounds 4 / 8 / 12 | update norm, rounds 2 / 4 / 6 / last |")
    print("|---|---|---|---|---|")
    for prefix, setting in READINGS:
        for reading, label in (("fedavg", "FedAvg"), ("ge_none", "ge, none (literal)"), ("gt_none", "gt, none"),
                               ("ge_steps", "**ge, steps (default)**"), ("gt_steps", "gt, steps")):
            tag = next((t for t in (f"readings/{prefix}_{reading}_v2", f"readings/{prefix}_{reading}")
                        if (RESULTS / t / "metrics.jsonl").exists()), None)
            if tag is None:
                continue
            d = RESULTS / tag
            rows = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines() if line.strip()]
            done = (d / "summary.json").exists() and json.loads((d / "summary.json").read_text())["status"] == "completed"
            last = rows[-1]["round"] if rows else 0
            outcome = "trains" if done else f"non-finite in round {last + 1}"
            accs = {r["round"]: fmt_acc(r["test_acc"]) for r in rows if "test_acc" in r}
            norms = {r["round"]: r.get("fedfor/prev_update_norm") for r in rows}
            shown = [norms.get(t) for t in (2, 4, 6)] + [norms.get(last)]
            norm_text = " / ".join("—" if n is None else f"{n:.3g}" for n in shown) if reading != "fedavg" else "—"
            acc_text = " / ".join(accs.get(t, "—") for t in (4, 8, 12))
            print(f"| {setting} | {label} | {outcome} | {acc_text} | {norm_text} |")


def main() -> int:
    if "--readings" in sys.argv:
        readings()
        return 0
    if "--upto" in sys.argv:
        compare(int(sys.argv[sys.argv.index("--upto") + 1]))
        return 0
    for e, total in ((1, 60), (2, 40), (4, 30)):
        lines = [row(f"{m}_E{e}{sfx}", label + (" [seed 1]" if sfx else ""))
                 for m, label in METHODS for sfx in ("", "_s1")]
        lines = [line for line in lines if line]
        if not lines:
            continue
        print(f"\n**E = {e}** ({total} rounds; halfway t = {total // 2}; evaluated every 2 rounds)\n")
        heads = [f"best acc t={total // 2}", f"best acc t={total}", "last acc"] + [f"ACC{x}" for x in TARGETS]
        print(f"| method | {' | '.join(heads)} | status | wall s |")
        print("|" + "---|" * (len(heads) + 3))
        print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

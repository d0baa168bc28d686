"""Tables of experiments/foundation/run.sh's runs (docs/foundation.md's recipe; docs/evidence.md rows R1, R2,
R4), from each run's committed summary.json and metrics.jsonl only (trains nothing):

    python experiments/foundation/table.py > experiments/foundation/results.md

Accuracy is test accuracy (%) on the task adapted to; "last-3 mean" averages the last three evaluations
(rounds 16, 18 and 20 for the image runs). Upload bytes are the sum of `bytes_up` over the rounds (every
sampled client's upload, float32).
"""
from __future__ import annotations

import json
import sys
import statistics
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/rows.py
from rows import load_run  # noqa: E402

HERE = Path(__file__).resolve().parent
RUNS = HERE / "runs"
SEEDS = (0, 1)
LAST = 3
IMAGE = {"fedit_r8": "LoRA r=8, FedIT", "ffa_r8": "LoRA r=8, FFA-LoRA", "stack_r8": "LoRA r=8, FLoRA stacking",
         "fedit_r8_dp": "LoRA r=8, FedIT, central DP", "ffa_r8_dp": "LoRA r=8, FFA-LoRA, central DP",
         "fedit_r4": "LoRA r=4, FedIT", "fedit_r16": "LoRA r=16, FedIT", "full": "full fine-tuning"}
TEXT = {"text_pretrain": "pretraining (8 packages)",
        "text_base": "the pretrained model on the 15 other packages, before adaptation", "text_lora": "LoRA r=8, FedIT (15 other packages)",
        "text_full": "full fine-tuning (15 other packages)"}




def transfer(run: dict, key: str) -> float | None:
    """Bytes summed over the rounds (`bytes_up` or `bytes_down`), in MB; None where withheld (differential
    privacy: the counts would reveal the cohorts)."""
    values = [row.get(key) for row in run["metrics"]]
    return None if any(v is None for v in values) else sum(values) / 1e6


def mb(value: float | None) -> str:
    return "withheld (DP)" if value is None else f"{value:.3f}"


def accs(run: dict) -> list[float]:
    return [100 * row["test_acc"] for row in run["metrics"] if "test_acc" in row]


def last(run: dict) -> float:
    return statistics.mean(accs(run)[-LAST:])


def mean_std(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.2f} (1 seed)"
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"


def run_table(runs: dict, labels: dict) -> list[str]:
    out = ["| run | seed | rounds | final | best | last-3 mean | upload MB | download MB | trained parameters | wall s |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for (name, seed), run in runs.items():
        if name not in labels:
            continue
        s, a = run["summary"], accs(run)
        wall = "withheld (DP)" if s.get("wall_s") is None else f"{s['wall_s']:.0f}"
        out.append(f"| {labels[name]} | {seed} | {s['rounds']} | {a[-1]:.2f} | {max(a):.2f} | {last(run):.2f} | "
                   f"{mb(transfer(run, 'bytes_up'))} | {mb(transfer(run, 'bytes_down'))} | {s['num_params']:,} | {wall} |")
    return out


def pairs(runs: dict, first: str, second: str) -> str:
    """Last-3 mean of `first` minus `second`, per seed."""
    diffs = [f"{last(runs[first, seed]) - last(runs[second, seed]):+.2f}" for seed in SEEDS
             if (first, seed) in runs and (second, seed) in runs]
    return ", ".join(diffs) or "not run"


def summary_table(runs: dict) -> list[str]:
    out = ["| run | seeds | last-3 mean | final | upload MB per seed | share of full fine-tuning's upload |",
           "|---|---|---|---|---|---|"]
    for name, label in IMAGE.items():
        seeds = [seed for seed in SEEDS if (name, seed) in runs]
        if not seeds:
            out.append(f"| {label} | not run | | | | |")
            continue
        up = [transfer(runs[name, seed], "bytes_up") for seed in seeds]
        shares = sorted({f"{transfer(runs[name, seed], 'bytes_up') / transfer(runs['full', seed], 'bytes_up'):.4f}"
                         for seed in seeds if ("full", seed) in runs and transfer(runs[name, seed], "bytes_up")})
        out.append(f"| {label} | {', '.join(map(str, seeds))} | {mean_std([last(runs[name, s]) for s in seeds])} | "
                   f"{mean_std([accs(runs[name, s])[-1] for s in seeds])} | {', '.join(mb(u) for u in up)} | "
                   f"{', '.join(shares) or '—'} |")
    return out


def epsilon(run: dict) -> str:
    privacy = run["summary"].get("privacy") or {}
    value = privacy.get("epsilon")
    return f"{value:.1f}" if isinstance(value, (int, float)) else json.dumps(privacy)


def main() -> None:
    runs = {(name, seed): run for name in list(IMAGE) + list(TEXT) for seed in SEEDS
            if (run := load_run(RUNS, name, seed)) is not None}
    pre = load_run(RUNS, "pretrain", 0)
    out = ["# LoRA on a pretrained model: results of experiments/foundation/run.sh", "",
           "Written by `python experiments/foundation/table.py > experiments/foundation/results.md` from the runs' "
           "committed summary.json and metrics.jsonl. Test accuracy in %; last-3 mean: the mean of the last three "
           "evaluations (rounds 16, 18, 20); upload: the sum of `bytes_up` (every sampled client's upload).", "",
           "## Image: SimpleCNN pretrained on Fashion-MNIST classes 0-4, adapted to classes 5-9", ""]
    if pre:
        out.append(f"Pretraining (`pretrain.yaml`, one client, {pre['summary']['rounds']} epochs): test accuracy on "
                   f"classes 0-4 **{accs(pre)[-1]:.2f}** ({pre['summary']['num_params']:,} parameters).")
        out.append("")
    out += ["### Over seeds", ""] + summary_table(runs) + [""]
    out += ["### Paired differences (last-3 mean, seed 0, seed 1)", "",
            f"- R1, FFA-LoRA − FedIT (label skew, Dirichlet(0.5)): {pairs(runs, 'ffa_r8', 'fedit_r8')}",
            f"- R2, FFA-LoRA − FedIT under central DP: {pairs(runs, 'ffa_r8_dp', 'fedit_r8_dp')}",
            f"- R4, LoRA − full fine-tuning: r=4 {pairs(runs, 'fedit_r4', 'full')}; r=8 {pairs(runs, 'fedit_r8', 'full')}; "
            f"r=16 {pairs(runs, 'fedit_r16', 'full')}"]
    dp = [f"{name} seed {seed}: {epsilon(runs[name, seed])}" for name in ("fedit_r8_dp", "ffa_r8_dp") for seed in SEEDS
          if (name, seed) in runs]
    if dp:
        out.append(f"- epsilon at delta 0.01 after 20 rounds (summary.json `privacy`): {'; '.join(dp)}")
    out += ["", "### Every run", ""] + run_table(runs, IMAGE) + [""]
    out += ["## Text: token_transformer on Python's standard library, a client a package", "",
            "Next-byte accuracy (%) on the packages' own held-out windows (every tenth 64-byte window). Pretraining "
            "is scored on its eight packages, the adaptation runs on the fifteen others; last-3 mean: rounds 10, 15 and 20 "
            "(pretraining: 10, 15, 20 too; text_base: its one evaluation).", ""]
    out += run_table(runs, TEXT) + [""]
    print("\n".join(out))


if __name__ == "__main__":
    main()

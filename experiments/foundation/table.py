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
# LoRA's scaling alpha (the update is (alpha / r) B A), rank 8: 16 is the runs above; the rest rows R1, R2 over alpha.
ALPHAS = {"FFA-LoRA": {16: "ffa_r8", 32: "ffa_r8_a32", 64: "ffa_r8_a64"},
          "FFA-LoRA, central DP": {16: "ffa_r8_dp", 32: "ffa_r8_a32_dp", 64: "ffa_r8_a64_dp"},
          "FedIT": {16: "fedit_r8", 32: "fedit_r8_a32", 64: "fedit_r8_a64"},
          "FedIT, central DP": {16: "fedit_r8_dp", 32: "fedit_r8_a32_dp"}}
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


def outcome(name: str, seed: int) -> tuple[str, float | None]:
    """A run's last-3 mean as text and number, or how it ended ("diverged in round N; best B") and None."""
    run = load_run(RUNS, name, seed, ended=True)
    if run is None:
        return "not run", None
    if run["summary"]["status"] == "completed":
        return f"{last(run):.2f}", last(run)
    a = accs(run)
    best = f"; best {max(a):.2f}" if a else ""
    return f"{run['summary']['status']} in round {(run['summary']['rounds'] or 0) + 1}{best}", None


def alpha_table() -> list[str]:
    """Last-3 mean per seed of each aggregation at each alpha, and each one's best alpha per seed."""
    alphas = sorted({a for by in ALPHAS.values() for a in by})
    out = ["| aggregation | " + " | ".join(f"alpha {a}: seed {seed}" for a in alphas for seed in SEEDS) + " | best alpha's last-3 mean, seed 0 / 1 |",
           "|---|" + "---|" * (len(alphas) * len(SEEDS) + 1)]
    for label, by in ALPHAS.items():
        cells, best = [], []
        for a in alphas:
            cells += [outcome(by[a], seed)[0] if a in by else "not run" for seed in SEEDS]
        for seed in SEEDS:
            scores = [v for a in by if (v := outcome(by[a], seed)[1]) is not None]
            best.append(f"{max(scores):.2f}" if scores else "—")
        out.append(f"| {label} | " + " | ".join(cells) + f" | {' / '.join(best)} |")
    return out


def tuned_pairs(first: str, second: str) -> str:
    """Per seed: the best last-3 mean over alpha of `first` minus that of `second` (ALPHAS' labels)."""
    diffs = []
    for seed in SEEDS:
        a = [v for name in ALPHAS[first].values() if (v := outcome(name, seed)[1]) is not None]
        b = [v for name in ALPHAS[second].values() if (v := outcome(name, seed)[1]) is not None]
        if a and b:
            diffs.append(f"{max(a) - max(b):+.2f}")
    return ", ".join(diffs) or "not run"


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
    out += ["", "### LoRA's scaling alpha (rank 8)", "",
            "The adapted layer adds (alpha / r) B A; FFA-LoRA trains B alone over a fixed A, so its step in the "
            "model is set by alpha and the learning rate together (train.lr 0.05 throughout). Last-3 mean per "
            "seed, or how the run ended:", ""] + alpha_table() + [""]
    out += [f"- R1 tuned over alpha, FFA-LoRA − FedIT (best of each, per seed): {tuned_pairs('FFA-LoRA', 'FedIT')}",
            f"- R2 tuned over alpha, under central DP: {tuned_pairs('FFA-LoRA, central DP', 'FedIT, central DP')}"]
    out += ["", "### Every run", ""] + run_table(runs, IMAGE) + [""]
    out += ["## Text: token_transformer on Python's standard library, a client a package", "",
            "Next-byte accuracy (%) on the packages' own held-out windows (every tenth 64-byte window). Pretraining "
            "is scored on its eight packages, the adaptation runs on the fifteen others; last-3 mean: rounds 10, 15 and 20 "
            "(pretraining: 10, 15, 20 too; text_base: its one evaluation).", ""]
    out += run_table(runs, TEXT) + [""]
    print("\n".join(out))


if __name__ == "__main__":
    main()

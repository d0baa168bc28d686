"""The all-methods table (experiments/all_methods/run.sh): per split and method, over the
seeds that finished, the gradient steps the method's training took (from each run's config: its split
and cohorts; STEP_EPOCHS says what a method's round holds) and mean ± sample std of the last evaluation (round 100; a run that diverged is
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
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # distfl of this checkout (the gradient-step counts)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "personal"))
import table as personal_table  # noqa: E402  (experiments/personal/table.py: the same cells)

GROUPS = [
    ("FedAvg family", ["fedavg", "fedprox", "scaffold", "feddyn", "fednova"]),
    ("compute-matched", ["fedavg_e11"]),
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
          "local": "local only", "ccvr": "FedAvg + CCVR", "ffc": "FedAvg + FFC",
          "fedavg_e11": "FedAvg, 11 local epochs"}
SPLITS = {"dir01": "Dir(0.1)", "c2": "#C=2"}
# Local work of a sampled client in a round at the protocol's 1 local epoch (docs/algorithms/*.md, "Cost"), and
# what scoring adds: the compute a row's accuracy was bought with.
WORK = {"fedrep": "11 epochs (10 head, 1 body)", "fedavg_e11": "11 epochs (FedRep's count)", "fedbabu": "1 epoch; 5 fine-tuning epochs at scoring",
        "fedavg_ft": "1 epoch; 5 fine-tuning epochs at scoring", "ditto": "2 epochs", "apfl": "1 epoch, 2 passes a step",
        "moon": "1 epoch, 3 forward passes a step", "fedntd": "1 epoch, +1 forward pass a step",
        "perfedavg": "1 epoch, 2 half-batch passes a step (FO); 1 step at scoring",
        "pfedme": "1 epoch, 6 passes a step (K = 5)", "fedala": "1 epoch + 0.8 epoch of ALA (11-50 x 0.8 the first time)",
        "fedpac": "2 epochs (1 head, 1 body) + 2 forward-only passes", "tct": "1 epoch; then stage 2",
        "spherefed": "1 epoch; then FFC", "ccvr": "1 epoch; then CCVR", "ffc": "1 epoch; then FFC"}
CALIBRATED = ("ccvr", "ffc")  # distfl calibrate on a copy of one FedAvg training (run.sh: <split>_calibrated_fedavg_s<seed>)
# Gradient steps: backward passes through the network on one mini-batch of train.batch_size samples (Per-FedAvg's
# two half-batch passes count as one). A sampled client with n samples takes ceil(n / 32) of them an epoch;
# the factor is how many such epochs of backward passes the method's local work a round holds (docs/algorithms/*.md,
# "Cost"): FedRep's 10 head + 1 body epochs, Ditto's two passes, APFL's two passes a step, pFedMe's K = 5 inner
# steps a step, FedPAC's head + body epochs. Every other method (MOON's and FedNTD's extra passes are forward-only) 1.
STEP_EPOCHS = {"fedrep": 11, "ditto": 2, "apfl": 2, "pfedme": 5, "fedpac": 2, "fedavg_e11": 11}
SCORING_EPOCHS = {"fedbabu": 5, "fedavg_ft": 5}  # fine-tuning of every client at every evaluation, not in training
SCORING_STEPS = {"perfedavg": 1}  # Per-FedAvg's one alpha step of every client at every evaluation
ALA = 0.8  # FedALA: a returning client's ALA pass covers ceil(0.8 n / 32) batches, a backward pass each
ALA_START = (11, 50)  # its start phase (the client's second round): 11 to 50 such passes (num_pre_loss + 1, start_passes)


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


_COHORTS: dict[tuple, tuple] = {}


def cohorts(run: Path) -> tuple[list[list[int]], list[int], int]:
    """The run's cohorts (client ids, round by round), each client's sample count and the batch size, from
    its config.yaml (the data, the split and the sampling it drew); cached per split, seed and protocol."""
    from distfl.config import data_seed, load_config
    from distfl.data.datasets import load_dataset
    from distfl.data.partition import partition
    from distfl.federation.population import Population

    with warnings.catch_warnings():  # the n_classes split's config keeps the protocol's unused partition.alpha
        warnings.simplefilter("ignore")
        cfg = load_config(str(run / "config.yaml"))
    key = (json.dumps([vars(cfg.data), vars(cfg.partition)], sort_keys=True, default=str), cfg.seed,
           cfg.train.rounds, cfg.train.clients_per_round, cfg.train.cohort, cfg.train.batch_size)
    if key not in _COHORTS:
        seed = data_seed(cfg)
        data = load_dataset(cfg.data, seed)
        labels = data.train_y.numpy()
        population = Population(partition(labels, cfg.partition, data.num_classes, seed), labels, data.num_classes)
        drawn = [population.cohort(cfg.seed, t, cfg.train.clients_per_round, cfg.train.cohort)
                 for t in range(1, cfg.train.rounds + 1)]
        _COHORTS[key] = (drawn, [int(n) for n in population.sizes], cfg.train.batch_size)
    return _COHORTS[key]


def gradient_steps(run: Path, method: str) -> tuple[int, int, int, int]:
    """Gradient steps of a run's training, lowest and highest (they differ for FedALA only, whose start phase's
    pass count is not logged): (in all, in all, sampled (client, round) pairs, at scoring). At scoring: the
    fine-tuning methods' epochs for every client at every evaluation that scored clients."""
    drawn, sizes, batch = cohorts(run)
    batches = [-(-n // batch) for n in sizes]
    low = STEP_EPOCHS.get(method, 1) * sum(batches[c] for cohort in drawn for c in cohort)
    high = low
    if method == "fedala":
        rounds_in: dict[int, int] = {}
        for cohort in drawn:
            for c in cohort:
                rounds_in[c] = rounds_in.get(c, 0) + 1
                ala = -(-int(sizes[c] * ALA) // batch) if sizes[c] else 0  # ceil(0.8 n / B), as fedala.py
                if rounds_in[c] == 2:
                    low, high = low + ALA_START[0] * ala, high + ALA_START[1] * ala
                elif rounds_in[c] > 2:
                    low, high = low + ala, high + ala
    evaluations = sum("client_acc_mean" in json.loads(line)
                      for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip())
    scoring = evaluations * (SCORING_EPOCHS.get(method, 0) * sum(batches) + SCORING_STEPS.get(method, 0) * len(sizes))
    return low, high, sum(len(cohort) for cohort in drawn), scoring


def steps_cells(root: Path, split: str, method: str, seeds: list[int]) -> tuple[str, str]:
    """The table's two gradient-step cells (a client a round; in training, + at scoring), means over the seeds."""
    counts = [gradient_steps(root / f"{split}_{method}_s{seed}", method) for seed in seeds]
    low, high = (sum(c[i] for c in counts) / len(counts) for i in (0, 1))
    pairs, scoring = (sum(c[i] for c in counts) / len(counts) for i in (2, 3))
    spread = (lambda a, b, f: f(a) if a == b else f"{f(a)}-{f(b)}")
    per_round = spread(low / pairs, high / pairs, lambda v: f"{v:.1f}")
    total = spread(low, high, lambda v: f"{v:,.0f}") + (f" + {scoring:,.0f} at scoring" if scoring else "")
    return per_round, total


def main(root: Path) -> None:
    print("| split | method | seeds | score | global test acc | best global acc | per-client mean | "
          "per-client std over clients | per-client p10 | local work a round | gradient steps a client a round | "
          "gradient steps in training |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    per_seed = []
    for split, label in SPLITS.items():
        for group, methods in GROUPS:
            for method in methods:
                runs = finished(root, split, method)
                if not runs:
                    print(f"| {label} | {LABELS.get(method, method)} ({group}) | 0 | not run: `METHODS={method} "
                          f"experiments/all_methods/run.sh {split} \"0 1\"` | — | — | — | — | — | {WORK.get(method, '1 epoch')} | — | — |")
                    continue
                diverged = sum(s["status"] == "diverged" for _, s in runs)
                seeds = f"{len(runs)}" + (f", {diverged} diverged" if diverged else "")
                ss = [s for _, s in runs if s["status"] == "completed"]
                if not ss:
                    print(f"| {label} | {LABELS.get(method, method)} ({group}) | {seeds} | **diverged** | — | — | — | — | — | "
                          f"{WORK.get(method, '1 epoch')} | — | — |")
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
                      f"{cell(clients['std'])} | {cell(clients['p10'])} | {WORK.get(method, '1 epoch')} | "
                      + " | ".join(steps_cells(root, split, method, [seed for seed, s in runs if s["status"] == "completed"]))
                      + " |")
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

"""A run's summary.json."""
from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from .. import __version__, dist
from ..checkpoint import atomic_write_text
from ..privacy.release import test_metrics_covered, timings_released
from .client_eval import STATISTICS as CLIENT_STATISTICS, client_finetune_epochs
from .stopping import resume_command


def privacy_guarantee(context) -> dict | None:
    """The guarantee the released models carry: (epsilon, delta) at user level after the rounds whose noised
    sums the global model holds (its last server step's round, however the run ended: not its last evaluation)."""
    if context.privacy is None:
        distributed = getattr(context.ledger, "guarantee", None)
        return distributed(min(context.state.model_round, context.cfg.train.rounds)) if distributed else None
    p = context.cfg.privacy
    trained = min(context.state.model_round, context.cfg.train.rounds)
    eps = context.ledger.epsilon_after(trained)
    return {"mechanism": p.mechanism, "epsilon": eps if math.isfinite(eps) else None, "delta": p.delta,
            "rounds": trained, "noise_multiplier": context.noise_multiplier,
            "calibrated": p.target_epsilon > 0, "target_epsilon": p.target_epsilon or None,
            "update_noise_multiplier": context.privacy.update_multiplier, "clip_norm": p.clip_norm,
            "final_clip_norm": context.privacy.clip_norm, "adaptive_clip": p.adaptive_clip,
            "accountant": p.accountant, "cohort": context.cfg.train.cohort,
            "sampling_rate": context.cfg.train.clients_per_round / len(context.population),
            "level": "user", "model": "central",
            # secret: noise and cohorts from a key only the checkpoints hold; keyed: from the config's seed
            "noise": context.privacy.key.mode,
            # dp_ftrl: the rounds of each tree (a restart after each), None for gaussian
            "rounds_per_tree": context.privacy.tree.rounds_per_tree if context.privacy.tree else None,
            # banded_mf: the bands of the factor C, None otherwise
            "bands": context.privacy.banded.bands if context.privacy.banded else None,
            # false: the test split is the clients' own samples (a natural federation), so the test metrics
            # (final_test_acc, best_test_acc, ...) are computed from client data outside the guarantee
            "test_metrics_covered": test_metrics_covered(context.cfg, context.data)}

# summary.json's `status`: completed is the only finished one (every round of train.rounds and every
# phase after them); stopped (a stop signal, checkpointed, or a second Ctrl-C), failed and running (a
# resumed session that has not ended, or was killed without a word) are continued with `resume_command`;
# diverged needs another setting first.
STATUSES = ("completed", "stopped", "diverged", "failed", "running")


def build(context, status: str, error: str | None, stopped_because: str | None = None, model: bool = True) -> dict:
    """summary.json: how the run ended, its accuracies, the final model's hash, the collectives, the
    privacy guarantee and what it ran on. `stopped_because`: why a stopped run stopped; `model`: False
    when the run stopped at once, mid-round (no hash of a half-updated model)."""
    context.worker.load(context.global_params, context.global_buffers)
    last = context.state.progress["last_eval"] or {}
    cfg = context.cfg
    # The last round of a completed run: train.rounds, or the round that spent train.virtual_time_s.
    last_round = context.state.progress.get("time_budget_round") or cfg.train.rounds
    result = {
        "status": status,
        # true only for a completed run: every round of train.rounds trained and every phase after them run
        "finished": status == "completed",
        # stopped: what stopped it (a signal, its launcher's death, a second Ctrl-C); None otherwise
        "stopped_because": stopped_because,
        # the last training round trained (and logged); train.rounds: the configured last round
        "round_reached": min(context.state.step, last_round),
        "train_rounds": context.cfg.train.rounds,
        # not finished (stopped, failed): the command that continues it from its last checkpoint; else None
        "resume_command": (resume_command(context.run_dir, context.ctx.world_size)
                           if status in ("stopped", "failed") else None),
        "error": error,
        "final_test_acc": last.get("test_acc"),
        "final_test_loss": last.get("test_loss"),
        # eval.clients: the last evaluation's per-client accuracy (mean, std, min, p10), else None
        "final_client_acc": ({key.removeprefix("client_acc_"): last[key] for key in CLIENT_STATISTICS}
                             if CLIENT_STATISTICS[0] in last else None),
        # eval.clients: epochs each client fine-tuned before it was scored (eval.finetune_epochs; fedbabu:
        # algorithm.finetune_epochs), 0 for none; None without eval.clients or for a personalised plugin method
        "client_finetune_epochs": client_finetune_epochs(context.cfg, context.algorithm),
        # eval.clients: clients no round had sampled by the last evaluation (scored with the global model,
        # or FedPer's / FedRep's initial head); None without eval.clients
        "clients_never_sampled": last.get("clients_never_sampled"),
        # eval.finetune_from=best: the round of the global model the clients fine-tuned at the last evaluation
        # (the best round by test_acc); None: the evaluated round's own model (eval.finetune_from=last)
        "client_model_round": last.get("client_model_round"),
        # eval.test_samples, eval.train_samples: {"test": {"scored", "of"}, "train": ... or None without
        # eval.train_metrics}, the samples each evaluation scored of the split's (a fixed sample when fewer)
        "eval_samples": context.eval_sample.to_json(),
        # training rounds in which no client reported (all late, dropped out or offline): the model did not
        # learn in them; None under DP (it would tell an empty Poisson cohort)
        "rounds_without_reports": (context.state.progress.get("rounds_without_reports", 0)
                                   if context.privacy is None else None),
        "best_test_acc": context.state.progress["best_test_acc"],
        "best_round": context.state.progress["best_round"],
        "rounds": last.get("round") if status != "completed" else last_round,
        # None in a private run without privacy.release_timings (the time grows with the cohorts' sizes)
        "wall_s": round(context.state.progress["wall_s"], 3) if timings_released(context.cfg) else None,
        "model_sha256": context.worker.state_sha256() if model else None,
        "world_size": context.ctx.world_size,
        "phases": context.state.phase_results,
        "collectives": {"calls": dict(dist.COLLECTIVE_CALLS), "bytes": dict(dist.COLLECTIVE_BYTES)},
        "device": str(context.device),
        "pack_size": context.pack_size,  # runtime.pack_size as run (auto resolved)
        # runtime.cuda_graphs as run: "on" (N graphs captured), "off", or "failed: why" (steps taken eagerly)
        "cuda_graphs": graphs_status(context.pack_step),
        "num_params": context.worker.num_params,
        "algorithm": context.cfg.algorithm.name,
        "privacy": privacy_guarantee(context),
        "dataset": context.cfg.data.dataset,
        # SHA-256 of every data and partition file read (role -> path, sha256); a resume checks them
        # (withheld under DP, None: a hash of the clients' data is an un-noised statistic of it; the checkpoints keep it)
        "data_files": dict(context.data_sources.items()) if context.privacy is None else None,
        # data.normalize: the per-channel [mean, std] applied to the inputs, or None
        "input_normalization": context.data.normalization and [list(v) for v in context.data.normalization],
        "distfl_version": __version__,
        "torch_version": torch.__version__,
        # Resumes on another device, thread count, determinism or torch build ([{after_round, was, now}]);
        # empty: one runtime throughout, so the run is reproducible from its config on that runtime
        "runtime_changes": context.state.runtime_changes,
        # What the clients downloaded and uploaded over the rounds, in bytes (the sum of the rounds' bytes_down and
        # bytes_up); None under DP (withheld: they count the clients) or when resumed from a checkpoint before them
        **{key: context.state.progress.get(key) if context.privacy is None else None for key in ("bytes_down", "bytes_up")},
        # system.*: the virtual clock's time at the end of the last round, in seconds
        **({"virtual_time_s": context.system.now_s} if context.system is not None else {}),
        # train.virtual_time_s: the simulated-time budget and the round that spent it (None: train.rounds came first)
        **({"time_budget": {"virtual_time_s": cfg.train.virtual_time_s,
                            "round": context.state.progress.get("time_budget_round")}}
           if cfg.train.virtual_time_s else {}),
        # eval.target_acc: the first evaluation whose accuracy reached it (round, virtual_time_s with a system
        # model, wall_s); each None if none did
        **({"time_to_acc": {"target": cfg.eval.target_acc,
                            "metric": "client_acc_mean" if cfg.eval.clients else "test_acc",
                            **(context.state.progress.get("time_to_acc")
                               or {"round": None, "virtual_time_s": None, "wall_s": None})}}
           if cfg.eval.target_acc else {}),
    }
    return unfinished(result) if status == "stopped" else result


# A run that has not finished has no final or best result: these are None in its summary.json (a table
# that reads them fails instead of taking a part-way number), and its last evaluation is under `last_eval`.
RESULTS = ("final_test_acc", "final_test_loss", "final_client_acc", "best_test_acc", "best_round")


def unfinished(summary: dict) -> dict:
    """`summary` of a run that is not finished: RESULTS None, their values so far under `last_eval`."""
    if any(summary.get(key) is not None for key in RESULTS):
        summary["last_eval"] = {"round": summary.get("rounds"),  # the round last evaluated
                                **{key: summary.get(key) for key in RESULTS}}
    summary.update(dict.fromkeys(RESULTS))
    return summary


def graphs_status(pack_step) -> str:
    graphed = getattr(pack_step, "graphed", None)
    if graphed is None:
        return "off"
    if graphed.failed is not None:
        return f"failed: {graphed.failed}"
    return f"on ({len(graphed.graphs)} graphs)"


def mark_running(run_dir, train_rounds: int, command: str) -> None:
    """Rank 0, as a resumed session starts training: the summary.json of an earlier session (completed
    with fewer rounds, stopped, failed) no longer says how the run stands, so it says `"status":
    "running"` (with no final or best result: the earlier session's are under `last_eval`) until this
    session writes its own. A session killed without a word (kill -9, SIGHUP, power loss) leaves it so:
    never "completed"."""
    path = Path(run_dir) / "summary.json"
    try:
        earlier = json.loads(path.read_text())
    except FileNotFoundError:
        return
    except (OSError, ValueError):
        earlier = {}
    if not isinstance(earlier, dict):
        earlier = {}
    earlier.update(status="running", finished=False, stopped_because=None, train_rounds=train_rounds,
                   resume_command=command, error=None)
    unfinished(earlier)
    try:
        atomic_write_text(json.dumps(earlier, indent=2) + "\n", path)
    except OSError:  # a full disk: no summary rather than one that says the run is done
        path.unlink(missing_ok=True)


def record_time_to_acc(progress: dict, cfg, metrics: dict) -> None:
    """eval.target_acc: the first evaluation whose accuracy (client_acc_mean with eval.clients, else
    test_acc) reaches the target, kept in `progress` for summary.json's time_to_acc: its round, simulated
    and wall time (None where withheld)."""
    target = cfg.eval.target_acc
    if not target or progress.get("time_to_acc") is not None:
        return
    metric = "client_acc_mean" if cfg.eval.clients else "test_acc"
    if metrics.get(metric) is not None and metrics[metric] >= target:
        progress["time_to_acc"] = {"round": metrics["round"], "virtual_time_s": metrics.get("virtual_time_s"),
                                   "wall_s": metrics.get("wall_s")}

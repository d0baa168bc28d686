"""Phases: the parts of a run that come after its training rounds.

A run is its training rounds, then its phases in order: SphereFed's FFC calibration
(`calibration.method: ffc`), TCT's stages. Each phase runs on every rank, uses the same exact
collectives as a round, and ends with a checkpoint labelled with its name, so a crash inside a phase
resumes at that phase without retraining (`distfl train --resume RUN_DIR`). A long phase may
checkpoint its own progress (`context.save_phase_checkpoint`) and find it again in
`context.state.phase_state` on resume.

The phases are the methods' own (algorithms/tct.py, algorithms/ffc.py); `distfl.algorithms.build_phases`
picks a run's. This module only defines what a phase is, so the federation layer never imports a method.
"""
from __future__ import annotations


class Phase:
    name = "phase"

    def run(self, context, logger) -> dict:
        """Do the phase's work on this rank; return a JSON-able result (goes into summary.json)."""
        raise NotImplementedError

    def restore(self, context) -> None:
        """Called on resume for a phase that already ran, after the checkpointed model is loaded:
        re-apply anything the phase changed that is not in the flat model (e.g. the model's head mode)."""


def calibration_clients(context) -> list[int]:
    """The clients a calibration after training sums over (calibration.clients): every client of the
    population, or only the last round's cohort."""
    cfg = context.cfg
    if cfg.calibration.clients == "all":
        return list(range(len(context.population)))
    return context.population.cohort(cfg.seed, cfg.train.rounds, cfg.train.clients_per_round, cfg.train.cohort)


def hosted_client_models(context, clients: list[int]):
    """Yield (client, its training indices) for each of `clients` this rank hosts, with the client's model
    loaded into the worker: the global model, under FedBN with the client's own BatchNorm (kept in its
    state, on the rank that hosts it under sticky placement; a client never sampled has none and uses the
    global BatchNorm, the rule of per-client evaluation). Clients are placed as in training."""
    from .population import place

    alg, ctx = context.algorithm, context.ctx
    sticky = alg.stateful and context.sticky
    for k in place(clients, context.population.sizes, ctx.world_size, sticky=sticky)[ctx.rank]:
        context.worker.load(context.global_params, context.global_buffers)
        if alg.stateful:
            alg.load_own_model(context.store.peek(k) or {}, context.worker)
        yield k, context.client_indices[k]


def evaluate_calibrated(context, name: str) -> dict:
    """Score the global model a calibration phase `name` left (the test set; each client with eval.clients);
    it becomes the run's final evaluation. Returns test_acc, test_loss and the client_acc_* statistics."""
    after = context.evaluate_round(context.cfg.eval.clients)
    scores = {"test_acc": after["test_acc"], "test_loss": after["test_loss"],
              **{k: v for k, v in after.items() if k.startswith("client_acc_")}}
    context.state.record_eval(after["test_acc"], after["test_loss"], name,
                              {k: v for k, v in scores.items() if k.startswith("client_acc_")})
    return scores


def log_result(logger, context, name: str, result: dict) -> None:
    """A phase's numeric results as one metrics.jsonl row at the step it is checkpointed under."""
    logger.log_phase({"round": context.state.step + 1, "phase": name,
                      **{k: v for k, v in result.items() if isinstance(v, (int, float))}})

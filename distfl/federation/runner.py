"""The run: its set-up, then the loop of rounds (each one `run_round`: federation/round.py's steps) ->
eval -> checkpoint, then the phases and summary.json. The same code runs as one plain process or as every
rank of a torchrun job.

What is guaranteed (and tested): for a fixed config, the final model (`model_sha256`) is bit-identical
on 1 or N processes, for any placement of clients on ranks, and when a run is stopped and resumed
from a checkpoint, provided every process uses the same device type, the same torch build, the same
CPU kernel dispatch (ISA level) and the same `runtime.threads`, with `runtime.deterministic` on (see the
README, Reproducibility). Why it holds:
  - cohorts come from (seed, round), every client's randomness from (seed, round, client);
  - a client's local training is the same sequence of kernels wherever it runs (same thread count);
  - the sums over clients are exact integer sums (federation/aggregate.py), so order cannot matter;
  - evaluation batches are fixed slices of the test set, dealt to ranks whole.
"""
from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

import numpy as np
import torch

from .. import checkpoint, dist, faults
from ..algorithms import algorithm_class, build_algorithm, build_phases
from ..checkpoint import file_sha256
from ..config import config_to_dict, data_seed, dump_config
from ..data.client_test import holdout_split
from ..data.datasets import load_dataset
from ..data.digest import DataSources
from ..data.partition import partition
from ..data.tokens import client_token_counts
from ..errors import ConfigError, DistflError, DivergenceError, Interrupted, NothingReports
from ..logging import RunLogger
from ..models import build_model, uses_channels_last
from ..privacy import release
from ..system import build as build_system
from .client_eval import best_round_scores, client_test_split
from .eval_sample import EvalSample
from .graphs import resolve_cuda_graphs
from .local import FlatModel
from .pack import PackStep, check_packable, resolve_pack_size
from .population import DeviceIndices, Population, sticky_placement
from .probe import probe_model
from .resume import restore, resume_lines
from .round import RoundEngine
from .run_state import (BestModel, Checkpoints, GlobalModel, MethodState, PrivacyState, RunContext, RunProgress, RunRecord,
                        StopFlags, SystemState)
from .split_eval import evaluate
from .state import ClientStateStore
from . import init_from, run_dir, run_privacy, stopping, summary




class Trainer(RoundEngine):
    """A run: its set-up, the loop of rounds (each `RoundEngine.run_round`, round.py), evaluation,
    checkpoints and the phases after training."""

    def __init__(self, cfg, ctx: dist.DistContext, resume: bool = False, overwrite: bool = False):
        self.directory = None
        try:
            self._set_up(cfg, ctx, resume, overwrite)
        except BaseException:
            self.close()  # a set-up that failed must not keep the run directory locked (in-process sweeps)
            raise

    def _set_up(self, cfg, ctx: dist.DistContext, resume: bool, overwrite: bool) -> None:
        self.cfg, self.ctx = cfg, ctx
        self.run_dir = Path(cfg.output.dir)
        self.device = ctx.device
        self.where, self.failure, self.started = "setting up the run", None, time.time()
        dist.reset_counters()
        faults.check_output_dir(self.run_dir)
        if not resume and run_dir.run_has_output(self.run_dir) and not overwrite:
            raise ConfigError(f"output.dir {self.run_dir} already holds a run; {run_dir.next_step(self.run_dir)}")
        # Rank 0 holds RUN_DIR/.lock until this Trainer is closed or its process dies: a second run in
        # the directory is refused, before any work if the directory exists (else once it is created).
        self.directory = run_dir.RunDirectory(self.run_dir, ctx, overwrite)

        # privacy.target_epsilon: the noise multiplier the accountant calibrates, before any work.
        self.noise_multiplier = run_privacy.noise_multiplier(cfg)
        seed = data_seed(cfg)  # the split's, which may stay fixed while cfg.seed varies
        self.data = load_dataset(cfg.data, seed).to(self.device)
        # A next-token dataset has no class a sample (data/tokens.py): no labels, no class counts.
        labels = self.data.train_y.cpu().numpy() if self.data.tokens is None else None
        parts = partition(labels, cfg.partition, self.data.num_classes, seed, natural=self.data.train_offsets)
        # The bytes every data and partition file was read from: a resume refuses others (resume.py).
        # A prepared folder's hash may still be computing (data/digest.py): read when a checkpoint, the summary
        # or a resume's check first needs it, never waited for here.
        self.data_sources = DataSources(self.data.sources)
        if cfg.partition.scheme == "file":
            self.data_sources.add("partition.path", cfg.partition.path, file_sha256(cfg.partition.path))
        # eval.client_split=holdout: each client's held-out samples leave its training data here, before
        # the Population (sizes, weights, class counts) is built; every rank computes the same split.
        holdout = cfg.eval.clients and cfg.eval.client_split == "holdout"
        if holdout:
            parts, held = holdout_split(parts, labels if labels is not None else np.zeros(len(self.data.train_y), np.int64),
                                        cfg.eval.client_holdout, seed)  # one "class": a plain random holdout
        self.population = Population(parts, labels, self.data.num_classes)
        if cfg.algorithm.weighting == "tokens":
            self.population.token_counts = client_token_counts(self.population.indices, self.data.train_y, self.data.tokens)
        self.client_indices = DeviceIndices(self.population.indices, self.device)  # made when a client first trains
        # eval.test_samples, eval.train_samples: the fixed rows every evaluation scores (from the data seed)
        self.eval_sample = EvalSample.of(cfg.eval, self.data, seed)
        if cfg.eval.clients:  # client_test[k] indexes client_test_x / client_test_y (client_eval.py)
            self.client_test, self.client_test_x, self.client_test_y = client_test_split(
                cfg, self.data, self.population, held if holdout else None, seed, self.device)

        def model_factory():
            return build_model(cfg.model, self.data.input_shape, self.data.num_classes,
                               self.data.embeddings).to(self.device)

        torch.manual_seed(cfg.seed)
        model = model_factory()
        if cfg.model.init_from:  # saved weights instead of the seeded ones, checked by name and shape
            read, sha256 = init_from.load_into(model, cfg.model)
            self.data_sources.add("model.init_from", str(read), sha256)
        sizes = self.population.sizes
        single = int(np.argmax(sizes == 1)) if (sizes == 1).any() else None  # the first client with one sample
        has_batchnorm = any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules())
        probe_model(model, cfg.model.name, self.data.train_x, self.data.num_classes,
                    single if has_batchnorm else None, next_token=self.data.tokens is not None)
        channels_last = uses_channels_last(cfg.runtime.channels_last, cfg.model.name, self.device)
        self.worker = FlatModel(model, channels_last=channels_last)
        self.model = GlobalModel(self.worker)
        # Ranks with different torch builds (or kernels) can draw different initial weights from the same
        # seed, and would then drift apart silently: stop before training instead.
        dist.check_same_on_all_ranks(
            dist.fingerprint(self.global_params) ^ dist.fingerprint(self.global_buffers), ctx,
            f"the initial model (this rank: torch {torch.__version__} on {self.device.type})")
        # A fixed head (model.head=sphere|fixed_random) is built from model.head_seed, frozen parameters from
        # the seed; prove every rank built the same ones before any training relies on them.
        for tensor in self.worker.frozen:
            dist.check_same_on_all_ranks(dist.fingerprint(tensor), ctx, "the fixed head and frozen parameters")
        run_privacy.check_model(cfg, self.worker)
        # The method, wrapped in the run's features (GMA, FedBN, DP: algorithms/__init__.py).
        self.algorithm = build_algorithm(cfg, self.population, self.worker, self.device, model_factory,
                                         self.noise_multiplier, ctx)
        self.privacy, self.ledger = run_privacy.mechanism_and_ledger(cfg, self.algorithm, self.noise_multiplier,
                                                                     len(self.population), lambda: self.state.progress)
        self.sticky = sticky_placement(cfg, self.algorithm)
        self.pack_size = resolve_pack_size(cfg.runtime.pack_size, self.device, self.algorithm, self.sticky)
        check_packable(cfg, self.algorithm, self.pack_size, self.sticky)
        graphs = resolve_cuda_graphs(cfg.runtime.cuda_graphs, self.device, self.pack_size)
        self.pack_step = PackStep(self.worker, graphs) if self.pack_size > 1 else None
        self.system = build_system(self)  # system.*: the virtual clock (distfl/system); None: all keys default
        # A method may need the store beside its rounds' own state (client_store: TCT's stage 2).
        self.store = (ClientStateStore(cfg.runtime.client_state, self.run_dir, self.device, cfg.algorithm.name)
                      if self.algorithm.stateful or algorithm_class(cfg.algorithm.name).client_store else None)
        if self.store is not None and self.algorithm.stateful:  # memory: on the GPU, the host, or refused
            self.store.place(self.algorithm.init_client_state(), -(-len(self.population) // ctx.world_size))
        if ctx.world_size > 1:  # hashing every client's indices is worth its bytes only where ranks compare it
            dist.check_same_on_all_ranks(
                dist.fingerprint(dump_config(cfg)) ^ self.population.fingerprint(), ctx, "config and partition")

        self.stop = StopFlags()
        # Phases after training (calibration, TCT's stages), in order.
        self.phases = build_phases(cfg)
        self.state = RunProgress(cfg.train.rounds)
        # What a checkpoint holds: these parts' state_dicts (federation/run_state.py).
        self.plan = None  # the virtual clock's plan of the round (system.*)
        self.privacy_state = PrivacyState(self.privacy)
        # eval.finetune_from=best: the best round's evaluated model, which the clients fine-tune.
        self.best = BestModel(self.model.params, self.model.buffers) if cfg.eval.finetune_from == "best" else None
        self.checkpointed = [self.state, self.model, MethodState(self.algorithm), self.privacy_state,
                             SystemState(self.system),
                             RunRecord(config_to_dict(cfg), self.data_sources, ctx.world_size, self.runtime_identity()),
                             *([self.best] if self.best is not None else [])]
        # With phases after training, the last training round's checkpoint is never pruned: a phase can be
        # rerun from it (another calibration.ridge, other tct.* stage-2 settings).
        self.checkpoints = Checkpoints(self.run_dir, ctx, self.checkpointed, self.privacy_state, self.model, self.store,
                                       cfg.checkpoint.keep, cfg.train.rounds if self.phases else None,
                                       cfg.algorithm.name)
        self.context = RunContext(
            cfg=cfg, ctx=ctx, device=self.device, run_dir=self.run_dir, data=self.data, data_sources=self.data_sources,
            eval_sample=self.eval_sample,
            population=self.population, client_indices=self.client_indices, client_test=getattr(self, "client_test", None),
            client_test_x=getattr(self, "client_test_x", None), client_test_y=getattr(self, "client_test_y", None),
            worker=self.worker, algorithm=self.algorithm, store=self.store, global_params=self.model.params,
            global_buffers=self.model.buffers, sticky=self.sticky,
            pack_size=self.pack_size, pack_step=self.pack_step, system=self.system, privacy=self.privacy, ledger=self.ledger, noise_multiplier=self.noise_multiplier,
            state=self.state, stop=self.stop, hosts=self.hosts, client_run=self.client_run, evaluate_round=self.evaluate_round,
            save_phase_checkpoint=self.save_phase_checkpoint)
        self.resume_warnings: list[str] = []
        self.round_note = None  # why the last round was skipped (an aggregator's failure), said after it
        self.resumed_from, self.skipped = None, []
        if resume:
            restore(self)
        # Only now, with data, partition, model (and checkpoint) good, does the run directory get written.
        self.directory.prepare(cfg, self.store, self.resumed_from, self.skipped)

    def hosts(self, client_id: int) -> bool:
        """Under sticky placement, whether this rank hosts `client_id` in every round."""
        return client_id % self.ctx.world_size == self.ctx.rank

    # ---- checkpoints ---------------------------------------------------------------------------
    def save_checkpoint(self, label: str, step: int) -> None:
        """Checkpoint the run at `step` (after a round, or a phase: `label`), pruning old ones (checkpoint.keep)."""
        self.where = f"writing checkpoint {checkpoint.checkpoint_name(label, step)}"
        self.checkpoints.save(label, step)

    def runtime_identity(self) -> dict:
        """What, beside the config, must match for a resumed run to stay bit-identical to one run
        through (recorded in every checkpoint)."""
        return {"device": self.device.type, "threads": self.cfg.runtime.threads,
                "deterministic": self.cfg.runtime.deterministic, "torch": str(torch.__version__),
                "pack_size": self.pack_size}

    # ---- evaluation ----------------------------------------------------------------------------
    def evaluate(self) -> tuple[float, float]:
        """Accuracy and mean loss of the global model on the whole test set."""
        metrics = self.evaluate_round(clients=False)
        return metrics["test_acc"], metrics["test_loss"]

    def evaluate_round(self, clients: bool) -> dict:
        """test_acc and test_loss of the global model, and (`clients`) per-client accuracy (split_eval.evaluate)."""
        return evaluate(self.context, clients)

    # ---- the run -------------------------------------------------------------------------------
    def run(self) -> dict:
        cfg = self.cfg
        logger = RunLogger(self.run_dir, cfg.output, self.ctx.is_main, self.state.start_round, cfg.train.rounds,
                           resume_step=self.state.step, params=self.global_params,
                           timings=release.timings_released(cfg))
        for line in resume_lines(self):
            logger.info(line)
        logger.info(f"distfl {cfg.algorithm.name} on {cfg.data.dataset}: {len(self.population)} clients, "
                    f"{cfg.train.clients_per_round}/round, {cfg.train.rounds} rounds, "
                    f"{self.ctx.world_size} process(es) on {self.device}"
                    f"{f', clients in packs of {self.pack_size}' if self.pack_size > 1 else ''}; writing {self.run_dir}"
                    f"{self.eval_sample.describe()}")
        for line in run_privacy.start_lines(cfg, self.data, self.noise_multiplier, self.privacy, self.ledger):
            logger.info(line)
        session_start = time.time()
        wall_before = self.state.progress["wall_s"]
        status, error, stopped = "completed", None, None
        previous_handlers = stopping.catch_stop_signals(self.stop, self.request_stop, self.run_dir)
        # train.virtual_time_s: the simulated-time budget (a system model keeps the clock), 0 for none.
        budget = cfg.train.virtual_time_s if self.system is not None else 0.0
        if budget and self.system.now_s < budget:  # resumed with a larger budget: not spent yet
            self.state.progress.pop("time_budget_round", None)
        try:
            for t in range(self.state.start_round, cfg.train.rounds + 1):
                if budget and self.system.now_s >= budget:  # resumed after its budget was spent
                    break
                t0 = time.perf_counter()
                stopping.check_launcher(self.stop, self.request_stop, logger)
                self.where = f"round {t}"
                row = self.system.run_async(t) if self.system is not None and self.system.asynchronous \
                    else self.run_round(t)
                if self.round_note:
                    logger.info(self.round_note)
                round_s = time.perf_counter() - t0
                if row["samples"] == 0:  # no client reported (all late, dropped or offline): summary.json counts them
                    self.state.progress["rounds_without_reports"] = self.state.progress.get("rounds_without_reports", 0) + 1
                metrics = {"round": t, **row, "round_s": round_s, "samples_per_s": row.pop("samples") / round_s}
                run_privacy.withhold(cfg, metrics)  # DP: no un-noised client statistic, no timing
                for key in ("bytes_up", "bytes_down"):  # the run's totals (summary.json)
                    if key in metrics and self.state.progress.get(key) is not None:
                        self.state.progress[key] += metrics[key]
                out_of_time = bool(budget) and self.system.now_s >= budget
                if t % cfg.eval.every == 0 or t == cfg.train.rounds or out_of_time:
                    t1 = time.perf_counter()
                    self.where = f"round {t}, evaluation"
                    evaluated = self.evaluate_round(clients=cfg.eval.clients and self.best is None)
                    improved = self.state.record_best(evaluated["test_acc"], t)
                    if self.best is not None:  # the clients start from the best round's model (eval.finetune_from)
                        evaluated.update(best_round_scores(self.context, self.best, improved))
                    metrics.update(evaluated, eval_s=time.perf_counter() - t1)
                    self.state.progress["last_eval"] = {"round": t, **evaluated}
                self.state.progress["wall_s"] = wall_before + time.time() - session_start
                if release.timings_released(cfg):
                    metrics["wall_s"] = self.state.progress["wall_s"]
                summary.record_time_to_acc(self.state.progress, cfg, metrics)
                logger.log_round(metrics, trainer=self.context)  # with the round's cohort size and update norm
                self.state.step = t
                if out_of_time:
                    self.state.progress["time_budget_round"] = t
                    logger.info(f"simulated-time budget reached: round {t} ends at {self.system.now_s:.6g} s of "
                                f"train.virtual_time_s={budget:g}; training ends here")
                if (cfg.checkpoint.every and t % cfg.checkpoint.every == 0) or t == cfg.train.rounds \
                        or self.stop.agreed or out_of_time:
                    self.save_checkpoint("round", t)
                if out_of_time:
                    break
                if self.stop.agreed and t < cfg.train.rounds:
                    # Rank 0 commits the checkpoint after the others are done with it; no rank exits
                    # before, since a launcher (torchrun) may end the other ranks when one exits.
                    dist.barrier(self.ctx)
                    raise Interrupted(stopping.stopped_line(self.stop, f"round {t} of {cfg.train.rounds}",
                                                            self.run_dir, self.ctx.world_size))
            self._run_phases(logger)
            self.state.progress["wall_s"] = wall_before + time.time() - session_start
            last = self.state.progress["last_eval"] or {}
            final = {"final_test_acc": last.get("test_acc"), "final_test_loss": last.get("test_loss"),
                     "best_test_acc": self.state.progress["best_test_acc"]}
            if self.ledger is not None:
                final["privacy_epsilon"] = self.ledger.epsilon_after(min(self.state.model_round, cfg.train.rounds))
            logger.log_hparams(config_to_dict(cfg), final, self.state.step)
        except Interrupted as exc:  # checkpointed after the round (or TCT stage-2 round) the ranks agreed on
            status, stopped, stopped_because = "stopped", exc, " and ".join(self.stop.reasons) or "a stop signal"
        except KeyboardInterrupt as exc:  # a second Ctrl-C: at once, mid-round
            status, stopped = "stopped", exc
            latest = faults.latest_checkpoint(self.run_dir)
            stopped_because = (f"a second Ctrl-C, at once, in round {self.state.step + 1}, without its checkpoint; "
                               f"a resume continues from {f'checkpoint {latest}' if latest else 'round 1'}")
        except DivergenceError as exc:
            status, error = "diverged", str(exc)
            kept = (checkpoint.checkpoints_dir(self.run_dir) / "latest")
            kept = f"the last good checkpoint, {kept.read_text().strip()}, is kept" if kept.exists() else \
                "no checkpoint had been written yet"
            logger.info(f"stopped: {exc}; {kept}")
        except NothingReports as exc:  # the inputs, not the code: its one line, no traceback
            status, error, stopped = "failed", str(exc), exc
        except Exception as exc:
            # A ConfigError already, or made one by dist.deterministic_ops (an op with no deterministic kernel).
            if isinstance(exc, DistflError) or dist._NONDETERMINISTIC in str(exc):
                raise
            self.failure = faults.Failure(exc, self.where, self.run_dir, self.ctx.rank, self.ctx.world_size,
                                          self.started)
            status, error = "failed", self.failure.line
        finally:
            closed = faults.attempt(logger.close)
            for sig, handler in previous_handlers.items():
                signal.signal(sig, handler)
        if closed is not None and status == "completed":  # e.g. TensorBoard's last flush on a full disk
            self.failure = faults.Failure(closed, "closing metrics and TensorBoard", self.run_dir, self.ctx.rank,
                                          self.ctx.world_size, self.started)
            status, error = "failed", self.failure.line
        if status == "failed":
            # Where the disk allows: the run's summary must not keep an earlier run's "completed".
            if self.ctx.is_main:
                faults.attempt(lambda: checkpoint.atomic_write_text(
                    json.dumps(summary.build(self.context, status, error), indent=2) + "\n", self.run_dir / "summary.json"))
            if isinstance(stopped, NothingReports):
                raise stopped
            raise self.failure.error() from self.failure.exc
        if status == "stopped":
            # Not finished: summary.json must say so, never keep an earlier session's "completed".
            if self.ctx.is_main:
                at_once = isinstance(stopped, KeyboardInterrupt)
                faults.attempt(lambda: checkpoint.atomic_write_text(json.dumps(
                    summary.build(self.context, status, None, stopped_because, model=not at_once), indent=2) + "\n",
                    self.run_dir / "summary.json"))
            raise stopped
        result = summary.build(self.context, status, error)
        self.where = "writing summary.json"
        if self.ctx.is_main:
            checkpoint.atomic_write_text(json.dumps(result, indent=2) + "\n", self.run_dir / "summary.json")
        if status != "completed":
            raise DivergenceError(error)
        return result

    def _run_phases(self, logger) -> None:
        """Each pending phase runs to its end and is checkpointed; a crash inside one resumes it (from
        its own intermediate checkpoints, if it writes any, else from its start)."""
        for phase in self.phases:
            if phase.name in self.state.phases_done:
                continue
            self.where = f"phase {phase.name} (after training)"
            result = phase.run(self.context, logger)
            self.state.phase_results[phase.name] = result
            self.state.phases_done.append(phase.name)
            self.state.phase_state = {}
            self.state.step += 1
            self.save_checkpoint(phase.name, self.state.step)

    def save_phase_checkpoint(self, phase_name: str, state: dict) -> None:
        """For a long phase: checkpoint its progress (`state`, restored as `context.state.phase_state`) at
        the current `step`, which the phase advances (e.g. one step per stage-2 round)."""
        self.state.phase_state = {"phase": phase_name, **state}
        self.save_checkpoint(phase_name, self.state.step)

    def request_stop(self, reason: int = 0) -> None:
        """Checkpoint and stop after the current round (every rank stops after the same round,
        agreed through the round's all_reduce). `reason`: an index of stopping.REASONS (the first request's
        is kept). Safe to call from a signal handler."""
        if not self.stop.requested:
            self.stop.reason = reason
        self.stop.requested = True

    def close(self) -> None:
        """Release the run directory's lock."""
        if self.directory is not None:
            self.directory.close()


def train(cfg, resume: bool = False, overwrite: bool = False) -> dict:
    """Run (or resume) training for `cfg` in this process; under torchrun, call it on every rank.
    An unexpected error ends as faults.RunFailed: one line, the traceback saved in the run directory."""
    ctx = dist.init(cfg.runtime.device, cfg.runtime.threads, cfg.runtime.deterministic, cfg.runtime.tf32)
    trainer, started = None, time.time()
    if resume and run_dir.not_yet_checkpointed(Path(cfg.output.dir)):
        if ctx.is_main:
            print(f"{cfg.output.dir} stopped before its first checkpoint, so there is nothing to resume: "
                  "starting it over from its saved config", file=sys.stderr, flush=True)
        resume, overwrite = False, True
    try:
        with dist.deterministic_ops():
            trainer = Trainer(cfg, ctx, resume=resume, overwrite=overwrite)
            return trainer.run()
    except Exception as exc:
        if isinstance(exc, DistflError):
            raise
        where = trainer.where if trainer is not None else "setting up the run (data, partition, model)"
        raise faults.Failure(exc, where, Path(cfg.output.dir), ctx.rank, ctx.world_size, started).error() from exc
    finally:
        if trainer is not None:
            trainer.close()
        dist.shutdown(ctx)


"""The round loop: cohort -> placement -> local training -> one all_reduce -> server step -> eval ->
checkpoint. The same code runs as one plain process or as every rank of a torchrun job.

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
import math
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

import torch

from .. import __version__, checkpoint, dist, faults
from ..algorithms import build_algorithm
from ..config import (HOLDOUT_KEYS, PHASE_KEYS, RESUMABLE_KEYS, config_to_dict, data_seed, dump_config, flatten_dict,
                      resume_blockers, saved_values)
from ..data.client_test import client_test_sets, holdout_split
from ..data.datasets import load_dataset
from ..data.partition import partition
from ..errors import CheckpointError, ConfigError, DistflError, DivergenceError, Interrupted
from ..logging import RunLogger
from ..models import build_model
from .aggregate import Segment, StatBuffer, Unrepresentable, round_segments
from .client_eval import STATISTICS as CLIENT_STATISTICS, accuracy_statistics, add_client_counts, client_segments
from .local import ClientRun, FlatModel, local_steps, train_client
from .phases import build_phases
from .pack import PackStep, check_packable, resolve_pack_size, train_pack
from .population import Population, place, place_packs
from .schedule import round_lr
from .state import ClientStateStore



NONFINITE_PARAMS = "non-finite local model parameters"


def run_has_output(run_dir: Path) -> bool:
    return any((run_dir / name).exists() for name in ("summary.json", "metrics.jsonl", "checkpoints"))


class Trainer:
    def __init__(self, cfg, ctx: dist.DistContext, resume: bool = False, overwrite: bool = False):
        self.lock = None
        try:
            self._set_up(cfg, ctx, resume, overwrite)
        except BaseException:
            self.close()  # a set-up that failed must not keep the run directory locked (in-process sweeps)
            raise

    def _set_up(self, cfg, ctx: dist.DistContext, resume: bool, overwrite: bool) -> None:
        self.cfg, self.ctx = cfg, ctx
        self.run_dir = Path(cfg.output.dir)
        self.overwrite = overwrite
        self.device = ctx.device
        self.where, self.failure, self.started = "setting up the run", None, time.time()
        self.launcher, self.interrupts = None, 0  # see _catch_stop_signals
        dist.reset_counters()
        faults.check_output_dir(self.run_dir)
        if not resume and run_has_output(self.run_dir) and not overwrite:
            raise ConfigError(
                f"output.dir {self.run_dir} already holds a run; continue it with "
                f"`distfl train --resume {self.run_dir}`, pick another output.dir, or pass --overwrite")
        # Rank 0 holds RUN_DIR/.lock until this Trainer is closed or its process dies: a second run in
        # the directory is refused, before any work if the directory exists (else once it is created).
        self.lock = checkpoint.lock_run_dir(self.run_dir) if ctx.is_main and self.run_dir.is_dir() else None

        seed = data_seed(cfg)  # the split's, which may stay fixed while cfg.seed varies
        self.data = load_dataset(cfg.data, seed).to(self.device)
        labels = self.data.train_y.cpu().numpy()
        parts = partition(labels, cfg.partition, self.data.num_classes, seed)
        # eval.client_split=holdout: each client's held-out samples leave its training data here, before
        # the Population (sizes, weights, class counts) is built; every rank computes the same split.
        holdout = cfg.eval.clients and cfg.eval.client_split == "holdout"
        if holdout:
            parts, held = holdout_split(parts, labels, cfg.eval.client_holdout, seed)
        self.population = Population(parts, labels, self.data.num_classes)
        self.client_indices = [torch.from_numpy(p).to(self.device) for p in self.population.indices]
        if cfg.eval.clients:
            # client_test[k] indexes client_test_x / client_test_y: the train split (holdout) or the test split.
            if holdout:
                sets = held
                self.client_test_x, self.client_test_y = self.data.train_x, self.data.train_y
            else:
                sets = client_test_sets(self.population.class_counts, self.data.test_y.cpu().numpy(),
                                        cfg.eval.client_test_size, seed)
                self.client_test_x, self.client_test_y = self.data.test_x, self.data.test_y
            self.client_test = [torch.from_numpy(s).to(self.device) for s in sets]

        def model_factory():
            return build_model(cfg.model, self.data.input_shape, self.data.num_classes).to(self.device)

        torch.manual_seed(cfg.seed)
        self.worker = FlatModel(model_factory())
        self.global_params = self.worker.params.detach().clone()
        self.global_buffers = self.worker.buffers.detach().clone()
        # Ranks with different torch builds (or kernels) can draw different initial weights from the same
        # seed, and would then drift apart silently: stop before training instead.
        dist.check_same_on_all_ranks(
            dist.fingerprint(self.global_params) ^ dist.fingerprint(self.global_buffers), ctx,
            f"the initial model (this rank: torch {torch.__version__} on {self.device.type})")
        # A fixed head (model.head=sphere|fixed_random) is built from model.head_seed; prove every
        # rank built the same one before any training relies on it.
        for tensor in self.worker.frozen:
            dist.check_same_on_all_ranks(dist.fingerprint(tensor), ctx, "the fixed classifier head")
        self.algorithm = build_algorithm(cfg, self.population, self.worker, self.device, model_factory)
        self.sticky = self._sticky_placement()
        self.pack_size = resolve_pack_size(cfg.runtime.pack_size, self.device)
        check_packable(cfg, self.algorithm, self.pack_size, self.sticky)
        self.pack_step = PackStep(self.worker) if self.pack_size > 1 else None
        # TCT's stage 2 keeps each client's SCAFFOLD control in the store too.
        self.store = (ClientStateStore(cfg.runtime.client_state, self.run_dir, self.device)
                      if self.algorithm.stateful or cfg.algorithm.name == "tct" else None)
        dist.check_same_on_all_ranks(
            dist.fingerprint(dump_config(cfg)) ^ self.population.fingerprint(), ctx, "config and partition")

        self.stop_requested = self.stop_agreed = False
        self.start_round = 1
        self.last_round = 0
        # Phases after training (calibration, TCT's stages), in order; `step` numbers checkpoints
        # through the training rounds and then the phases.
        self.phases = build_phases(cfg)
        self.phases_done: list[str] = []
        self.phase_results: dict = {}
        self.phase_state: dict = {}  # the running phase's resumable state (written with checkpoints)
        self.step = 0
        self.resume_warnings: list[str] = []
        self.progress = {"best_test_acc": None, "best_round": None, "wall_s": 0.0, "last_eval": None}
        self.resumed_from, self.skipped = None, []
        if resume:
            self._restore()
        # Only now, with data, partition, model (and checkpoint) good, does the run directory get written.
        self._prepare_run_dir(resume)

    def _claim_run_dir(self, resume: bool) -> bool:
        """Rank 0 takes the lock, then looks for a run in the directory: the look before the data
        loaded is not enough, since another run may have started and finished there meanwhile. Every
        rank learns its answer (one small all_reduce, also the barrier before --overwrite deletes).
        Returns whether the old output is to be deleted (--overwrite)."""
        found = False
        if self.ctx.is_main:
            with faults.run_dir_errors(self.run_dir):
                self.run_dir.mkdir(parents=True, exist_ok=True)
                self.lock = self.lock or checkpoint.lock_run_dir(self.run_dir)
            found = not resume and run_has_output(self.run_dir)
        flags = torch.tensor([int(found), int(found and not self.overwrite)], dtype=torch.int64, device=self.device)
        found, refused = (int(v) for v in dist.all_reduce_sum(flags, self.ctx, "check"))
        if refused:
            raise ConfigError(
                f"output.dir {self.run_dir} already holds a run (another distfl run wrote it while this one "
                f"was starting); continue it with `distfl train --resume {self.run_dir}`, pick another "
                "output.dir, or pass --overwrite")
        return bool(found)

    # ---- set-up --------------------------------------------------------------------------------
    def _prepare_run_dir(self, resume: bool) -> None:
        clear = self._claim_run_dir(resume)
        if self.ctx.is_main:
            if clear:  # --overwrite was given
                for name in ("summary.json", "metrics.jsonl", "checkpoints", "tb", "client_state"):
                    path = self.run_dir / name
                    shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
            faults.remove_leftovers(self.run_dir)
            if self.store is not None:
                self.store.create()
            config_text, saved = dump_config(self.cfg), self.run_dir / "config.yaml"
            if not (resume and saved.is_file() and saved.read_text() == config_text):  # nothing to write on a full disk
                checkpoint.atomic_write_text(config_text, saved)
        dist.barrier(self.ctx)
        if self.ctx.is_main and self.skipped:
            checkpoint.set_aside(self.run_dir, [name for name, _ in self.skipped], self.resumed_from)

    def _sticky_placement(self) -> bool:
        placement, store = self.cfg.runtime.placement, self.cfg.runtime.client_state
        if self.algorithm.stateful and store == "memory" and placement == "balanced":
            raise ConfigError(
                f"algorithm.name={self.cfg.algorithm.name} keeps per-client state in memory on the hosting "
                "rank, so runtime.placement must be auto or sticky (or set runtime.client_state=disk)")
        if placement == "auto":
            return self.algorithm.stateful and store == "memory"
        return placement == "sticky"

    def _hosts(self, client_id: int) -> bool:
        """Under sticky placement, whether this rank hosts `client_id` in every round."""
        return client_id % self.ctx.world_size == self.ctx.rank

    # ---- checkpoints ---------------------------------------------------------------------------
    def _restore(self) -> None:
        path, state, skipped = checkpoint.newest_good(self.run_dir, self.device)
        # Every rank must resume from the same checkpoint (they differ if output.dir is not shared).
        dist.check_same_on_all_ranks(int(state.get("step", state["round"])), self.ctx, "the checkpoint resumed from")
        self.resumed_from, self.skipped = path.name, skipped
        changed = resume_blockers(state["config"], config_to_dict(self.cfg))
        if changed:
            raise CheckpointError(
                f"cannot resume {self.run_dir}: {', '.join(changed)} differ from the checkpointed run; "
                f"only {', '.join(RESUMABLE_KEYS)} may change on resume (not {', '.join(HOLDOUT_KEYS)}: "
                "they decide the clients' training data)")
        self._check_phases_on_resume(state)
        self.resume_warnings = lost_guarantees(state.get("runtime"), self.runtime_identity())
        self.global_params.copy_(state["params"])
        self.global_buffers.copy_(state["buffers"])
        for tensor, saved in zip(self.worker.frozen, state.get("frozen", [])):
            tensor.copy_(saved)
        self.worker._int_snapshot = [t.to(self.device) for t in state["int_buffers"]]
        self.algorithm.load_server_state(state["server"])
        self.progress = dict(state["progress"])
        self.start_round = state["round"] + 1
        self.last_round = state["round"]
        self.step = int(state.get("step", state["round"]))
        self.phases_done = list(state.get("phases_done", []))
        self.phase_results = dict(state.get("phase_results", {}))
        self.phase_state = dict(state.get("phase_state", {}))
        for phase in self.phases:
            if phase.name in self.phases_done:
                phase.restore(self)
        if self.store is not None:
            self.store.restore(path / "clients", self._hosts, self.ctx.is_main)

    def _check_phases_on_resume(self, state: dict) -> None:
        trained, rounds = state["round"], self.cfg.train.rounds
        done = list(state.get("phases_done", []))
        names = [p.name for p in self.phases]
        started = done + ([state["phase_state"]["phase"]] if state.get("phase_state") else [])
        if started:
            saved = saved_values(state["config"])
            now = {k: v for k, v in flatten_dict(config_to_dict(self.cfg)).items() if k.startswith(PHASE_KEYS)}
            changed = [k for k, v in now.items() if saved.get(k) != v]
            if changed or any(n not in names for n in done):
                raise CheckpointError(
                    f"{self.run_dir} already began {', '.join(started)} after training, with the settings it was "
                    f"started with, so {', '.join(changed) or 'its phases'} cannot change now. Start a new run (or copy "
                    "the run directory and resume the copy from the checkpoint of the last training round)")
            if rounds > trained:
                raise CheckpointError(
                    f"{self.run_dir} already ran {', '.join(done)} after round {trained}; it cannot train further")
        pending = [n for n in names if n not in done]
        if trained >= rounds and not pending:
            if names:
                raise CheckpointError(f"{self.run_dir} is complete: {trained} rounds and {', '.join(done)}; "
                                      "nothing to resume")
            raise CheckpointError(f"{self.run_dir} is already at round {trained}; "
                                  f"raise train.rounds (e.g. train.rounds={trained + 10}) to continue")

    def _save_checkpoint(self, label: str, step: int) -> None:
        name = checkpoint.checkpoint_name(label, step)
        self.where = f"writing checkpoint {name}"
        if self.ctx.is_main:
            checkpoint.begin(self.run_dir, name)
        dist.barrier(self.ctx)
        written = 0
        if self.store is not None:
            written = self.store.write_checkpoint(checkpoint.staging_dir(self.run_dir, name) / "clients",
                                                  self.ctx.is_main)
        # How many client files all ranks wrote: rank 0 refuses a checkpoint that holds fewer.
        clients = int(dist.all_reduce_sum(torch.tensor([written], dtype=torch.int64, device=self.device),
                                          self.ctx, "checkpoint")[0])
        if self.ctx.is_main:
            state = {
                "round": min(step, self.cfg.train.rounds),
                "step": step,
                "phases_done": list(self.phases_done),
                "phase_results": dict(self.phase_results),
                "phase_state": _to_cpu(self.phase_state),
                "frozen": [t.cpu() for t in self.worker.frozen],
                "params": self.global_params.cpu(),
                "buffers": self.global_buffers.cpu(),
                "int_buffers": [t.cpu() for t in self.worker._int_snapshot],
                "server": _to_cpu(self.algorithm.server_state()),
                "progress": dict(self.progress),
                "config": config_to_dict(self.cfg),
                "world_size": self.ctx.world_size,
                "runtime": self.runtime_identity(),
                # Every random draw is keyed by (seed, round, client), so no RNG stream state is needed.
                "rng": "keyed",
            }
            # With phases after training, the last training round's checkpoint is never pruned: a phase
            # can be rerun from it (another calibration.ridge, other tct.* stage-2 settings).
            protect = (checkpoint.checkpoint_name("round", self.cfg.train.rounds),) if self.phases else ()
            checkpoint.commit(self.run_dir, name, state, self.cfg.checkpoint.keep, protect, clients)

    def runtime_identity(self) -> dict:
        """What, beside the config, must match for a resumed run to stay bit-identical to one run
        through (recorded in every checkpoint)."""
        return {"device": self.device.type, "threads": self.cfg.runtime.threads,
                "deterministic": self.cfg.runtime.deterministic, "torch": str(torch.__version__)}

    # ---- one round -----------------------------------------------------------------------------
    def run_round(self, round_idx: int) -> dict:
        cfg, ctx = self.cfg, self.ctx
        self.last_round = round_idx  # the round an evaluation after it belongs to (client fine-tuning's lr)
        cohort = self.population.cohort(cfg.seed, round_idx, cfg.train.clients_per_round, cfg.train.cohort)
        if self.pack_size == 1:
            packs = [[c] for c in place(cohort, self.population.sizes, ctx.world_size, self.sticky)[ctx.rank]]
        else:
            packs = place_packs(cohort, self.population.sizes, ctx.world_size, self.pack_size)[ctx.rank]
        largest = max((self._samples_trained(k) for k in cohort), default=1)
        stats = StatBuffer(round_segments(self.algorithm.all_segments(), largest),
                           self.device, len(cohort))
        refused: dict[str, int] = {}  # statistic -> clients of this rank whose value was out of its range
        for pack in packs:
            self.where = f"round {round_idx}, local training of client {', '.join(map(str, pack))}"
            runs = [self._client_run(c, round_idx, cohort) for c in pack]
            if len(runs) > 1:
                indices = [self.client_indices[c] for c in pack]
                for run in train_pack(self.worker, self.pack_step, self.data, indices, runs, cfg.train,
                                      self.algorithm, self.global_buffers):
                    self._contribute(run, stats, refused)
                continue
            run = runs[0]
            self.worker.load(self.global_params, self.global_buffers)
            self.algorithm.begin_client(run, self.worker)
            train_client(self.worker, self.data, self.client_indices[run.client_id], run, cfg.train, self.algorithm)
            self._contribute(run, stats, refused)
        stats.add("stop", int(self.stop_requested))
        self.where = f"round {round_idx}, aggregation and server step"
        reduced = stats.reduce(ctx)
        # Every rank sees the same sum, so all stop after the same round even if the signal reached
        # them at different moments.
        self.stop_agreed = int(reduced["stop"][0]) > 0
        bad = int(reduced["nonfinite"][0])
        if bad:
            raise DivergenceError(f"round {round_idx}: {bad} client(s) diverged: "
                                  f"{self._out_of_range(stats, refused)}; lower train.lr or server.lr")
        server_lr = self.algorithm.server_opt.lr = round_lr(cfg.server, round_idx, cfg.train.rounds)
        self.algorithm.server_step(self.global_params, self.global_buffers, reduced)
        if not bool(torch.isfinite(self.global_params).all()):
            raise DivergenceError(f"round {round_idx}: the server update made the global model non-finite; "
                                  "lower server.lr")
        samples = int(reduced["samples"][0])
        return {"train_loss": reduced.scalar("loss_sum") / max(samples, 1), "samples": samples,
                "bytes_reduced": stats.nbytes, "lr": round_lr(cfg.train, round_idx, cfg.train.rounds),
                "server_lr": server_lr, **self.algorithm.round_metrics}

    def _samples_trained(self, client_id: int) -> int:
        return self.algorithm.local_samples(int(self.population.sizes[client_id]), self.cfg.train)

    def _client_run(self, client_id: int, round_idx: int, cohort: list[int]) -> ClientRun:
        n = int(self.population.sizes[client_id])
        run = ClientRun(
            client_id=client_id, round_idx=round_idx, num_samples=n,
            weight=self.algorithm.client_weight(client_id, cohort),
            steps=local_steps(n, self.cfg.train.batch_size, self.cfg.train.local_epochs, self.cfg.train.local_steps),
            global_params=self.global_params)
        if self.store is not None and self.algorithm.stateful:
            run.state = self.store.get(client_id, self.algorithm.init_client_state)
        return run

    def _contribute(self, run: ClientRun, stats: StatBuffer, refused: dict[str, int]) -> None:
        """Add a client's statistics, or count it as non-finite under the statistic that was out of
        range (every rank still joins the reduce)."""
        try:
            stats.add("loss_sum", run.loss_sum)
            if not bool(torch.isfinite(self.worker.params).all()):
                raise Unrepresentable(NONFINITE_PARAMS, "non-finite local model")
            self.algorithm.collect(run, self.worker, stats)
        except Unrepresentable as exc:
            refused[exc.segment] = refused.get(exc.segment, 0) + 1
            stats.add("nonfinite", 1)
            return
        stats.add("samples", self._samples_trained(run.client_id))
        stats.add("clients", 1)
        # Only a stateful method's rounds keep client state (TCT keeps a store for its stage 2, but its
        # stage-1 rounds place clients on any rank: storing their empty state there would duplicate it).
        if self.store is not None and self.algorithm.stateful:
            self.store.put(run.client_id, run.state)

    def _out_of_range(self, stats: StatBuffer, refused: dict[str, int]) -> str:
        """Which statistics were out of range, summed over ranks. Only on the way to stopping the run,
        so the healthy round keeps its single all_reduce."""
        names = [NONFINITE_PARAMS] + [n for n in stats.segments if n in stats.limits]
        counts = torch.tensor([refused.get(n, 0) for n in names], dtype=torch.int64, device=self.device)
        dist.all_reduce_sum(counts, self.ctx, name="divergence")
        parts = []
        for name, count in zip(names, counts.tolist()):
            if count and name == NONFINITE_PARAMS:
                parts.append(f"{NONFINITE_PARAMS} in {count} client(s)")
            elif count:
                parts.append(f"statistic {name} out of range (NaN/inf or |value| above "
                             f"{stats.limits[name]:.3g}) in {count} client(s)")
        return "; ".join(parts)

    # ---- evaluation ----------------------------------------------------------------------------
    def evaluate(self) -> tuple[float, float]:
        """Accuracy and mean loss of the global model on the whole test set."""
        metrics = self.evaluate_round(clients=False)
        return metrics["test_acc"], metrics["test_loss"]

    @torch.no_grad()
    def evaluate_round(self, clients: bool) -> dict:
        """test_acc and test_loss of the global model on the whole test set, sharded by batch, and
        (`clients`) the statistics of per-client accuracy (client_eval.py), in one all_reduce."""
        self.worker.load(self.global_params, self.global_buffers)
        model = self.worker.module
        model.eval()
        x, y = self.data.test_x, self.data.test_y
        starts = list(range(0, len(y), self.cfg.eval.batch_size))
        segments = [Segment("loss_sum", 1), Segment("correct", 1, kind="int"), Segment("nonfinite", 1, kind="int")]
        stats = StatBuffer(segments + (client_segments(len(self.population)) if clients else []),
                           self.device, len(starts))
        for start in starts[self.ctx.rank :: self.ctx.world_size]:
            end = start + self.cfg.eval.batch_size
            logits = model(x[start:end])
            stats.add("correct", (logits.argmax(1) == y[start:end]).sum())
            try:
                stats.add("loss_sum", model.loss(logits, y[start:end], reduction="sum"))
            except Unrepresentable:
                stats.add("nonfinite", 1)
        if clients:
            add_client_counts(self, stats)
        reduced = stats.reduce(self.ctx, name="eval")
        loss = math.nan if int(reduced["nonfinite"][0]) else reduced.scalar("loss_sum") / len(y)
        metrics = {"test_acc": int(reduced["correct"][0]) / len(y), "test_loss": loss}
        if clients:
            metrics.update(accuracy_statistics(reduced["client_correct"].cpu().numpy(),
                                               reduced["client_total"].cpu().numpy()))
        return metrics

    # ---- the run -------------------------------------------------------------------------------
    def run(self) -> dict:
        cfg = self.cfg
        logger = RunLogger(self.run_dir, cfg.output, self.ctx.is_main, self.start_round, cfg.train.rounds,
                           resume_step=self.step)
        for name, why in self.skipped:
            logger.info(f"skipped checkpoint {name}: {why}")
        if self.skipped:
            logger.info(f"resuming from {self.resumed_from}, the newest good checkpoint")
        if self.start_round > cfg.train.rounds:
            logger.info(f"resuming {self.run_dir} after training ({cfg.train.rounds} rounds), at its phases")
        elif self.start_round > 1:
            logger.info(f"resuming {self.run_dir} at round {self.start_round}")
        for warning in self.resume_warnings:
            logger.info(f"warning: {warning}")
        logger.info(f"distfl {cfg.algorithm.name} on {cfg.data.dataset}: {len(self.population)} clients, "
                    f"{cfg.train.clients_per_round}/round, {cfg.train.rounds} rounds, "
                    f"{self.ctx.world_size} process(es) on {self.device}; writing {self.run_dir}")
        session_start = time.time()
        wall_before = self.progress["wall_s"]
        status, error = "completed", None
        previous_handlers = self._catch_stop_signals()
        try:
            for t in range(self.start_round, cfg.train.rounds + 1):
                t0 = time.perf_counter()
                self._check_launcher(logger)
                self.where = f"round {t}"
                row = self.run_round(t)
                round_s = time.perf_counter() - t0
                metrics = {"round": t, **row, "round_s": round_s, "samples_per_s": row.pop("samples") / round_s}
                metrics.pop("samples", None)
                if t % cfg.eval.every == 0 or t == cfg.train.rounds:
                    t1 = time.perf_counter()
                    self.where = f"round {t}, evaluation"
                    evaluated = self.evaluate_round(clients=cfg.eval.clients)
                    acc = evaluated["test_acc"]
                    metrics.update(evaluated, eval_s=time.perf_counter() - t1)
                    self.progress["last_eval"] = {"round": t, **evaluated}
                    if self.progress["best_test_acc"] is None or acc > self.progress["best_test_acc"]:
                        self.progress["best_test_acc"], self.progress["best_round"] = acc, t
                self.progress["wall_s"] = wall_before + time.time() - session_start
                metrics["wall_s"] = self.progress["wall_s"]
                logger.log_round(metrics)
                self.step = t
                if (cfg.checkpoint.every and t % cfg.checkpoint.every == 0) or t == cfg.train.rounds \
                        or self.stop_agreed:
                    self._save_checkpoint("round", t)
                if self.stop_agreed and t < cfg.train.rounds:
                    # Rank 0 commits the checkpoint after the others are done with it; no rank exits
                    # before, since a launcher (torchrun) may end the other ranks when one exits.
                    dist.barrier(self.ctx)
                    logger.info(f"stop signal: checkpoint written after round {t}; continue with "
                                f"`distfl train --resume {self.run_dir}`")
                    raise Interrupted(f"interrupted after round {t} (checkpointed)")
            self._run_phases(logger)
            self.progress["wall_s"] = wall_before + time.time() - session_start
            last = self.progress["last_eval"] or {}
            final = {"final_test_acc": last.get("test_acc"), "final_test_loss": last.get("test_loss"),
                     "best_test_acc": self.progress["best_test_acc"]}
            logger.log_hparams(config_to_dict(cfg), final, self.step)
        except DivergenceError as exc:
            status, error = "diverged", str(exc)
            kept = (checkpoint.checkpoints_dir(self.run_dir) / "latest")
            kept = f"the last good checkpoint, {kept.read_text().strip()}, is kept" if kept.exists() else \
                "no checkpoint had been written yet"
            logger.info(f"stopped: {exc}; {kept}")
        except Exception as exc:
            # A ConfigError already, or made one by dist.deterministic_ops (an op with no deterministic kernel).
            if isinstance(exc, DistflError) or dist._NONDETERMINISTIC in str(exc):
                raise
            self.failure = faults.Failure(exc, self.where, self.run_dir, self.ctx.rank, self.ctx.world_size,
                                          self.started)
            status, error = "failed", self.failure.line
        finally:
            closed = _attempt(logger.close)
            for sig, handler in previous_handlers.items():
                signal.signal(sig, handler)
        if closed is not None and status == "completed":  # e.g. TensorBoard's last flush on a full disk
            self.failure = faults.Failure(closed, "closing metrics and TensorBoard", self.run_dir, self.ctx.rank,
                                          self.ctx.world_size, self.started)
            status, error = "failed", self.failure.line
        if status == "failed":
            # Where the disk allows: the run's summary must not keep an earlier run's "completed".
            if self.ctx.is_main:
                _attempt(lambda: checkpoint.atomic_write_text(
                    json.dumps(self._summary(status, error), indent=2) + "\n", self.run_dir / "summary.json"))
            raise self.failure.error() from self.failure.exc
        summary = self._summary(status, error)
        self.where = "writing summary.json"
        if self.ctx.is_main:
            checkpoint.atomic_write_text(json.dumps(summary, indent=2) + "\n", self.run_dir / "summary.json")
        if status != "completed":
            raise DivergenceError(error)
        return summary

    def _run_phases(self, logger) -> None:
        """Each pending phase runs to its end and is checkpointed; a crash inside one resumes it (from
        its own intermediate checkpoints, if it writes any, else from its start)."""
        for phase in self.phases:
            if phase.name in self.phases_done:
                continue
            self.where = f"phase {phase.name} (after training)"
            result = phase.run(self, logger)
            self.phase_results[phase.name] = result
            self.phases_done.append(phase.name)
            self.phase_state = {}
            self.step += 1
            self._save_checkpoint(phase.name, self.step)

    def save_phase_checkpoint(self, phase_name: str, state: dict) -> None:
        """For a long phase: checkpoint its progress (`state`, restored as `trainer.phase_state`) at
        the current `step`, which the phase advances (e.g. one step per stage-2 round)."""
        self.phase_state = {"phase": phase_name, **state}
        self._save_checkpoint(phase_name, self.step)

    def record_eval(self, acc: float, loss: float, label: str, client_stats: dict | None = None) -> None:
        """A phase's evaluation of the final model: it becomes the run's final accuracy (`best_test_acc`
        stays the best over the training rounds); `client_stats` (eval.clients) its final_client_acc."""
        self.progress["last_eval"] = {"round": self.cfg.train.rounds, "test_acc": acc, "test_loss": loss,
                                      "phase": label, **(client_stats or {})}

    def _catch_stop_signals(self) -> dict:
        """SIGTERM / SIGUSR1 (Slurm preemption, time limits) and SIGINT (Ctrl-C) ask for a checkpoint at
        the end of the round; a second Ctrl-C stops at once, without one."""
        if threading.current_thread() is not threading.main_thread():
            return {}

        def on_signal(signum, frame):
            # Not under torchrun: a Ctrl-C there reaches each rank twice (from the terminal, and passed
            # on by the launcher), and only the launcher is to answer a second one.
            if signum == signal.SIGINT and self.stop_requested and self.interrupts and self.launcher is None:
                raise KeyboardInterrupt
            self.interrupts += signum == signal.SIGINT
            self.request_stop()

        # torchrun's workers: the launcher that started them. SIGKILL, or a signal torchrun does not
        # handle (SIGUSR1: its default action kills it), ends it without stopping them; they notice
        # their new parent at the next round boundary and stop as on SIGTERM.
        self.launcher = os.getppid() if "TORCHELASTIC_RUN_ID" in os.environ else None
        return {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)}

    def _check_launcher(self, logger) -> None:
        """At a round boundary: a worker whose launcher died checkpoints and stops after this round."""
        if self.launcher is not None and os.getppid() != self.launcher and not self.stop_requested:
            logger.info(f"the launcher (torchrun, pid {self.launcher}) is gone: checkpointing after this round, "
                        "then stopping")
            self.request_stop()

    def request_stop(self) -> None:
        """Checkpoint and stop after the current round (every rank stops after the same round,
        agreed through the round's all_reduce). Safe to call from a signal handler."""
        self.stop_requested = True

    def close(self) -> None:
        """Release the run directory's lock."""
        if self.lock is not None:
            self.lock.close()
            self.lock = None

    def _summary(self, status: str, error: str | None) -> dict:
        self.worker.load(self.global_params, self.global_buffers)
        last = self.progress["last_eval"] or {}
        return {
            "status": status,
            "error": error,
            "final_test_acc": last.get("test_acc"),
            "final_test_loss": last.get("test_loss"),
            # eval.clients: the last evaluation's per-client accuracy (mean, std, min, p10), else None
            "final_client_acc": ({key.removeprefix("client_acc_"): last[key] for key in CLIENT_STATISTICS}
                                 if CLIENT_STATISTICS[0] in last else None),
            "best_test_acc": self.progress["best_test_acc"],
            "best_round": self.progress["best_round"],
            "rounds": last.get("round") if status != "completed" else self.cfg.train.rounds,
            "wall_s": round(self.progress["wall_s"], 3),
            "model_sha256": self.worker.state_sha256(),
            "world_size": self.ctx.world_size,
            "phases": self.phase_results,
            "collectives": {"calls": dict(dist.COLLECTIVE_CALLS), "bytes": dict(dist.COLLECTIVE_BYTES)},
            "device": str(self.device),
            "num_params": self.worker.num_params,
            "algorithm": self.cfg.algorithm.name,
            "dataset": self.cfg.data.dataset,
            # data.normalize: the per-channel [mean, std] applied to the inputs, or None
            "input_normalization": self.data.normalization and [list(v) for v in self.data.normalization],
            "distfl_version": __version__,
            "torch_version": torch.__version__,
        }


def train(cfg, resume: bool = False, overwrite: bool = False) -> dict:
    """Run (or resume) training for `cfg` in this process; under torchrun, call it on every rank.
    An unexpected error ends as faults.RunFailed: one line, the traceback saved in the run directory."""
    ctx = dist.init(cfg.runtime.device, cfg.runtime.threads, cfg.runtime.deterministic)
    trainer, started = None, time.time()
    if resume and not_yet_checkpointed(Path(cfg.output.dir)):
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


def not_yet_checkpointed(run_dir: Path) -> bool:
    """A run that stopped (a kill, a full disk) before its first checkpoint: nothing finished is lost
    by starting it over. Not one that ended (completed, diverged) and lost its checkpoints since."""
    if checkpoint.complete_checkpoints(run_dir):
        return False
    try:
        status = json.loads((run_dir / "summary.json").read_text()).get("status")
    except FileNotFoundError:
        return True
    except (OSError, ValueError, AttributeError):
        return False
    return status == "failed"


def lost_guarantees(saved: dict | None, now: dict) -> list[str]:
    """Warnings for a resume whose runtime differs from the checkpoint's: the run goes on, but is no
    longer bit-identical to one that ran through."""
    if saved is None:  # a checkpoint from before distfl recorded its runtime
        return []
    why = {"device": "kernels differ between device types",
           "threads": "intra-op threads change a kernel's reduction order",
           "deterministic": "nondeterministic kernels may now run",
           "torch": "kernels differ between torch builds"}
    return [f"runtime {key} was {saved[key]} when checkpointed and is {now[key]} now; {why[key]}, so this run is "
            "no longer bit-identical to one run through without the stop (nor reproducible from its config)"
            for key in why if key in saved and saved[key] != now[key]]


def _attempt(action) -> Exception | None:
    """Run `action`; return the exception it raised instead of raising it (cleanup on a failing run)."""
    try:
        action()
    except Exception as exc:
        return exc
    return None


def _to_cpu(obj):
    if isinstance(obj, torch.Tensor):
        return obj.cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    return obj

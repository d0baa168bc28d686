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
import signal
import sys
import time
from pathlib import Path

import numpy as np
import torch

from .. import checkpoint, dist, faults
from ..algorithms import algorithm_class, build_algorithm, build_phases
from ..config import config_to_dict, data_seed, dump_config
from ..data.client_test import client_test_sets, holdout_split
from ..checkpoint import file_sha256
from ..data.digest import DataSources
from ..data.datasets import load_dataset
from ..data.natural import natural_test_sets
from ..data.partition import partition
from ..data.tokens import client_token_counts
from ..errors import ConfigError, DistflError, DivergenceError, Interrupted, NothingReports, PluginError
from ..logging import RunLogger
from ..models import build_model, uses_channels_last
from ..privacy import release, rules as dp_rules
from ..system import build as build_system
from .aggregate import Aggregator
from .aggregators import payload_bytes, round_aggregator
from .client_eval import best_round_scores
from .split_eval import evaluate
from .eval_sample import EvalSample
from .local import ClientRun, FlatModel, LocalSGD, local_steps, train_client
from .graphs import resolve_cuda_graphs
from .pack import PackStep, check_packable, pack_statistics, resolve_pack_size
from .population import DeviceIndices, Population, place, place_packs
from .run_state import (BestModel, Checkpoints, GlobalModel, MethodState, PrivacyState, RunContext, RunProgress, RunRecord,
                        StopFlags, SystemState)
from .probe import probe_model
from .schedule import round_lr
from .state import ClientStateStore
from . import init_from, run_dir, stopping, summary
from .resume import restore


NONFINITE_PARAMS = "non-finite local model parameters"
# What a client's model gives: out of range there means training diverged. A method's own statistic out
# of range while these are fine means the method adds values its segment cannot hold.
MODEL_STATISTICS = (NONFINITE_PARAMS, "loss_sum", "delta", "buffers", "bn_params")


class Trainer:
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
        self.noise_multiplier = None if cfg.privacy.mechanism in ("none", *dp_rules.DISTRIBUTED) else _accountant().resolve_noise_multiplier(cfg)
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
        if cfg.eval.clients:
            # client_test[k] indexes client_test_x / client_test_y: the train split (holdout) or the test split.
            if holdout:
                sets = held
                self.client_test_x, self.client_test_y = self.data.train_x, self.data.train_y
            elif cfg.partition.scheme == "natural":  # each client's own test samples, as the source splits them
                sets = natural_test_sets(self.data.test_offsets)
                self.client_test_x, self.client_test_y = self.data.test_x, self.data.test_y
            else:
                sets = client_test_sets(self.population.class_counts, self.data.test_y.cpu().numpy(),
                                        cfg.eval.client_test_size, seed)
                self.client_test_x, self.client_test_y = self.data.test_x, self.data.test_y
            self.client_test = DeviceIndices(sets, self.device)  # each made when that client is first scored

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
        if cfg.privacy.mechanism != "none":
            dp_rules.check_model_buffers(self.worker.buffers.numel(), cfg.model.name)
        # The method, wrapped in the run's features (GMA, FedBN, DP: algorithms/__init__.py).
        self.algorithm = build_algorithm(cfg, self.population, self.worker, self.device, model_factory,
                                         self.noise_multiplier, ctx)
        self.privacy, self.ledger = None, None
        if cfg.privacy.mechanism in dp_rules.DISTRIBUTED:  # the clients noise (secagg/aggregator.py)
            from ..secagg.aggregator import DistributedLedger

            self.ledger = DistributedLedger(cfg, self.algorithm.segments(), lambda: self.state.progress)
        elif cfg.privacy.mechanism != "none":
            self.privacy = self.algorithm.mechanism
            self.ledger = _accountant().Ledger.of(cfg, self.noise_multiplier, len(self.population))
        self.sticky = self._sticky_placement()
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
            state=self.state, stop=self.stop, hosts=self.hosts, evaluate_round=self.evaluate_round,
            save_phase_checkpoint=self.save_phase_checkpoint)
        self.resume_warnings: list[str] = []
        self.round_note = None  # why the last round was skipped (an aggregator's failure), said after it
        self.resumed_from, self.skipped = None, []
        if resume:
            restore(self)
        # Only now, with data, partition, model (and checkpoint) good, does the run directory get written.
        self.directory.prepare(cfg, self.store, self.resumed_from, self.skipped)

    @property
    def global_params(self) -> torch.Tensor:
        return self.model.params

    @property
    def global_buffers(self) -> torch.Tensor:
        return self.model.buffers

    # ---- set-up --------------------------------------------------------------------------------
    def _sticky_placement(self) -> bool:
        placement, store = self.cfg.runtime.placement, self.cfg.runtime.client_state
        if self.algorithm.stateful and store == "memory" and placement == "balanced":
            raise ConfigError(
                f"algorithm.name={self.cfg.algorithm.name} keeps per-client state in memory on the hosting "
                "rank, so runtime.placement must be auto or sticky (or set runtime.client_state=disk)")
        if placement == "auto":
            return self.algorithm.stateful and store == "memory"
        return placement == "sticky"

    def hosts(self, client_id: int) -> bool:
        """Under sticky placement, whether this rank hosts `client_id` in every round."""
        return client_id % self.ctx.world_size == self.ctx.rank

    # ---- checkpoints ---------------------------------------------------------------------------
    def _save_checkpoint(self, label: str, step: int) -> None:
        self.where = f"writing checkpoint {checkpoint.checkpoint_name(label, step)}"
        self.checkpoints.save(label, step)

    def runtime_identity(self) -> dict:
        """What, beside the config, must match for a resumed run to stay bit-identical to one run
        through (recorded in every checkpoint)."""
        return {"device": self.device.type, "threads": self.cfg.runtime.threads,
                "deterministic": self.cfg.runtime.deterministic, "torch": str(torch.__version__),
                "pack_size": self.pack_size}

    # ---- one round -----------------------------------------------------------------------------
    def run_round(self, round_idx: int) -> dict:
        """One round's seams, in order: cohort -> local training (each client's statistics into one buffer)
        -> one all_reduce -> server step. (Evaluation and the checkpoint follow in `run`.)"""
        cohort, packs = self._cohort(round_idx)
        stats = self._train_cohort(round_idx, cohort, packs)
        return self.finish_round(round_idx, cohort, stats, self.plan.metrics() if self.plan else {})

    def new_aggregator(self, cohort: list[int], extra_terms: int = 0) -> Aggregator:
        """The round's aggregator (aggregation.aggregator) over the method's segments and the bookkeeping,
        for the cohort's terms and `extra_terms` more (the server's own: FedAsync's)."""
        largest = max((self.samples_trained(k) for k in cohort), default=1)
        return round_aggregator(self.cfg, self.algorithm.segments(), largest, self.device, len(cohort) + extra_terms,
                                round_idx=self.state.last_round, sampled=self.plan.sampled if self.plan else cohort,
                                senders=cohort)

    def payload_bytes(self) -> tuple[int, int]:
        """What each client of a round downloads and uploads, in bytes (federation/aggregators.py)."""
        return payload_bytes(self.cfg, self.algorithm)

    def finish_round(self, round_idx: int, cohort: list[int], stats: Aggregator, extra: dict) -> dict:
        """The one all_reduce of the clients' `stats`, its checks and the server step; the round's row
        (with `extra`: the virtual clock's). The asynchronous server step (distfl/system) ends here too."""
        stats.add("stop", stopping.stop_code(self.stop))
        self.where = f"round {round_idx}, aggregation and server step"
        reduced = self._reduce(round_idx, stats)
        failure = reduced.failure  # the aggregator could not sum the round (too few survivors): it is skipped
        self.round_note = failure
        if failure is None and self.ledger is not None:  # distributed DP counts the survivors' noise
            self.ledger.record_round(reduced)
        if failure is None and (cohort or self.privacy is not None):  # an empty Poisson cohort leaves a non-private model as it is
            self.algorithm.server_update(self.global_params, self.global_buffers, reduced)
        self.state.model_round = round_idx  # under DP: its noise is in the model from here on
        if not bool(torch.isfinite(self.global_params).all()):
            raise DivergenceError(f"round {round_idx}: the server update made the global model non-finite; "
                                  "lower server.lr")
        cfg, samples, clients = self.cfg, int(reduced["samples"][0]), int(reduced["clients"][0])
        down, up = self.payload_bytes()
        return {"train_loss": reduced.scalar("loss_sum") / max(samples, 1), "samples": samples,
                "bytes_up": clients * up, "bytes_down": clients * down, "bytes_reduced": stats.nbytes, "lr": round_lr(cfg.train, round_idx, cfg.train.rounds),
                "server_lr": self.algorithm.server_opt.lr, **self.algorithm.round_metrics,
                **({"privacy_epsilon": self.ledger.epsilon_after(round_idx)}
                   if self.ledger is not None and self.ctx.is_main else {}),
                **reduced.metrics, **extra}

    def _cohort(self, round_idx: int) -> tuple[list[int], list[list[int]]]:
        """The round's cohort, and this rank's share of it as packs (of one client each at pack_size 1)."""
        cfg, ctx = self.cfg, self.ctx
        self.state.last_round = round_idx  # the round an evaluation after it belongs to (client fine-tuning's lr)
        self.plan = self.system.plan_round(round_idx) if self.system is not None else None  # who reports, on the clock
        if self.plan:
            cohort = self.plan.kept
        elif self.privacy is not None:  # DP: from the secret key
            cohort = self.privacy.cohort(self.population, round_idx, cfg.train.clients_per_round, cfg.train.cohort)
        else:
            cohort = self.population.cohort(cfg.seed, round_idx, cfg.train.clients_per_round, cfg.train.cohort)
        self.algorithm.begin_round(round_idx)
        if self.pack_size == 1:
            return cohort, [[c] for c in place(cohort, self.population.sizes, ctx.world_size, self.sticky)[ctx.rank]]
        return cohort, place_packs(cohort, self.population.sizes, ctx.world_size, self.pack_size)[ctx.rank]

    def _train_cohort(self, round_idx: int, cohort: list[int], packs: list[list[int]]) -> Aggregator:
        """Local training of this rank's packs; each client's statistics go into the round's aggregator."""
        stats = self.new_aggregator(cohort)
        self.train_clients(stats, round_idx, cohort, packs)
        return stats

    def train_clients(self, stats: Aggregator, round_idx: int, cohort: list[int], packs: list[list[int]],
                      start=None, label: str | None = None) -> None:
        """Local training of `packs` (this rank's clients of `cohort`, in packs), each client's statistics into
        `stats`: the one client path of synchronous rounds and asynchronous server steps. `start(run)`: a
        client that starts elsewhere than the global model (the asynchronous engine: the model version it
        started from, its round and staleness-weighted weight) sets `run`'s and returns its buffers."""
        whole_packs = pack_statistics(self.algorithm) and not (self.store is not None and self.algorithm.stateful)
        for pack in packs:
            who = "a sampled client" if self.privacy else f"client {', '.join(map(str, pack))}"  # DP: cohorts hidden
            self.where = f"{label or f'round {round_idx}'}, local training of {who}"
            runs = [self.client_run(c, round_idx, cohort) for c in pack]
            buffers = self.global_buffers if start is None else start(*runs)  # start: packs of one client
            if len(runs) > 1 and whole_packs:
                rows = self.pack_step.train_rows(self.worker, self.data, [self.client_indices[c] for c in pack], runs,
                                                 self.cfg.train, self.algorithm, buffers)
                self._contribute_pack(runs, *rows, stats)
                continue
            for run in train_client(self.worker, self.data, [self.client_indices[c] for c in pack], runs,
                                    self.cfg.train, self.algorithm, buffers, self.pack_step):
                self.contribute(run, stats)

    def _reduce(self, round_idx: int, stats: Aggregator):
        """The one all_reduce of the round; the stop flag agreed; non-finite or out-of-range sums stop the run."""
        reduced = stats.reduce(self.ctx)
        # Every rank sees the same sum, so all stop after the same round even if the signal reached
        # them at different moments.
        stopping.agree(self.stop, int(reduced["stop"][0]))
        bad, problems = int(reduced["nonfinite"][0]), reduced.problems()
        if bad or problems:
            if self.privacy is None:
                found = [f"{NONFINITE_PARAMS} in {bad} client(s)"] if bad else []
                found += [f"statistic {name} out of range ({what})" for name, what in problems.items()]
            else:  # no count of clients: it would tell the size of a hidden cohort
                found = [f"{NONFINITE_PARAMS} in the cohort"] if bad else []
                found += [f"statistic {name} out of range" for name in problems]
            text = "; ".join(found)
            if not bad and not any(name in MODEL_STATISTICS for name in problems):
                raise PluginError(
                    f"round {round_idx}: {text}, while the clients' models and losses were finite: algorithm.name="
                    f"{self.cfg.algorithm.name} adds values its segment cannot hold (not a divergence); add counts "
                    "with kind=\"int\", declare the segment's bound (distfl.Segment(name, numel, bound=...)) or scale "
                    "the value (docs/extending.md)")
            raise DivergenceError(f"round {round_idx}: the clients' updates are not summable ({text}); "
                                  "lower train.lr or server.lr")
        return reduced

    def _train_cfg(self, client_id: int):  # train.* as the client trains this round (system.partial_work)
        return self.cfg.train if self.system is None else self.system.train_cfg(client_id, self.cfg.train)

    def samples_trained(self, client_id: int) -> int:
        """The samples `client_id`'s local training covers this round (train_loss's denominator)."""
        return self.algorithm.local_samples(int(self.population.sizes[client_id]), self._train_cfg(client_id))

    def client_run(self, client_id: int, round_idx: int, cohort: list[int]) -> ClientRun:
        """Client `client_id`'s run in round `round_idx` of `cohort`: its weight, steps, optimizer and state."""
        n = int(self.population.sizes[client_id])
        run = ClientRun(
            client_id=client_id, round_idx=round_idx, num_samples=n,
            weight=self.algorithm.client_weight(client_id, cohort),
            steps=local_steps(n, self.cfg.train.batch_size, self._train_cfg(client_id).local_epochs,
                              self._train_cfg(client_id).local_steps, self.worker.fold_single),
            global_params=self.global_params,
            sgd=LocalSGD(self.worker, self.data, self.client_indices[client_id], self._train_cfg(client_id),
                         self.algorithm))
        if self.store is not None and self.algorithm.stateful:
            run.state = self.store.get(client_id, self.algorithm.init_client_state)
        return run

    def contribute(self, run: ClientRun, stats: Aggregator) -> None:
        """Add a client's statistics. A NaN/inf (counted here on the device, without waiting for it) or
        out-of-range value stops the round after the all_reduce, so every rank still joins it."""
        stats.begin([run.client_id])
        stats.add("loss_sum", run.loss_sum)
        low, high = torch.aminmax(self.worker.params)
        stats.add("nonfinite", ~(torch.isfinite(low) & torch.isfinite(high)))
        self.algorithm.client_statistics(run, self.worker, stats)
        stats.add("samples", self.samples_trained(run.client_id))
        stats.add("clients", 1)
        # Only a stateful method's rounds keep client state (TCT keeps a store for its stage 2, but its
        # stage-1 rounds place clients on any rank: storing their empty state there would duplicate it).
        if self.store is not None and self.algorithm.stateful:
            self.store.put(run.client_id, run.state)

    def _contribute_pack(self, runs: list[ClientRun], params: torch.Tensor, buffers: torch.Tensor,
                         loss_sums: torch.Tensor, stats: Aggregator) -> None:
        """`contribute` of every client of a pack at once (`pack.pack_statistics`): the same sums, bit for bit."""
        stats.begin([run.client_id for run in runs])
        stats.add_rows("loss_sum", loss_sums, [1.0] * len(runs))
        low, high = torch.aminmax(params, dim=1)
        stats.add("nonfinite", (~(torch.isfinite(low) & torch.isfinite(high))).sum())
        weights = [run.weight for run in runs]
        stats.add_rows("delta", params - self.global_params, weights)
        stats.add_rows("buffers", buffers, weights)
        for run in runs:
            stats.add("samples", self.samples_trained(run.client_id))
            stats.add("clients", 1)

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
        for name, why in self.skipped:
            logger.info(f"skipped checkpoint {name}: {why}")
        if self.skipped:
            logger.info(f"resuming from {self.resumed_from}, the newest good checkpoint")
        if self.state.start_round > cfg.train.rounds:
            logger.info(f"resuming {self.run_dir} after training ({cfg.train.rounds} rounds), at its phases")
        elif self.state.start_round > 1:
            logger.info(f"resuming {self.run_dir} at round {self.state.start_round}")
        for warning in self.resume_warnings:
            logger.info(f"warning: {warning}")
        logger.info(f"distfl {cfg.algorithm.name} on {cfg.data.dataset}: {len(self.population)} clients, "
                    f"{cfg.train.clients_per_round}/round, {cfg.train.rounds} rounds, "
                    f"{self.ctx.world_size} process(es) on {self.device}"
                    f"{f', clients in packs of {self.pack_size}' if self.pack_size > 1 else ''}; writing {self.run_dir}"
                    f"{self.eval_sample.describe()}")
        if self.privacy is not None:
            logger.info(_accountant().describe(cfg, self.noise_multiplier, self.privacy.update_multiplier))
            if not release.test_metrics_covered(cfg, self.data):
                logger.info(release.TEST_SPLIT_WARNING)
        elif self.ledger is not None:  # distributed DP (secagg/aggregator.py)
            logger.info(self.ledger.describe())
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
                for key in ("samples", *release.withheld(cfg)):  # DP: no un-noised client statistic, no timing
                    metrics.pop(key, None)
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
                    self._save_checkpoint("round", t)
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
            self._save_checkpoint(phase.name, self.state.step)

    def save_phase_checkpoint(self, phase_name: str, state: dict) -> None:
        """For a long phase: checkpoint its progress (`state`, restored as `context.state.phase_state`) at
        the current `step`, which the phase advances (e.g. one step per stage-2 round)."""
        self.state.phase_state = {"phase": phase_name, **state}
        self._save_checkpoint(phase_name, self.state.step)

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


def _accountant():
    """dp-accounting (and the scipy it pulls in) loads only for a private run: about 0.8 s of every
    other run's start."""
    from ..privacy import accountant

    return accountant

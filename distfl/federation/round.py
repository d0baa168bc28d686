"""One round, as its steps in order (docs/architecture.md, "One round"):

  1. select       the cohort: from (seed, round), DP's secret key or the virtual clock; placed on ranks
  2. download     each client's run starts from the global model (`client_run`: weight, steps, state)
  3. train        local training of this rank's clients, alone or in packs (local.py, pack.py)
  4. client-side  the method's `client_statistics`, through the features that wrap it, each a Feature
     features    in its own file applied in its declared order (algorithms/feature.py): GMA, FedBN,
                 compression, DP's clipping, yours
  5. add          each client's contribution and the round's bookkeeping into the aggregator
  6. reduce       the round's one collective, and the checks its sums can make
  7. server-side  the method's `server_update`, through the same features (DP's noise)
     features
  8. server step  the method's own step and the server optimizer (algorithms/fedopt.py)
  9. metrics      the round's row of metrics.jsonl

The synchronous loop (`run_round`) and the asynchronous engine (distfl/system/asynchronous.py, one
server step a buffer) call the same public steps: `new_aggregator`, `train_clients` (2-5) and
`finish_round` (6-9). Per-client evaluation and fine-tuning build their client through `client_run` too
(federation/client_eval.py). `RoundEngine` is the Trainer's round half: runner.py's set-up gives it the
run's parts (cfg, ctx, population, worker, data, algorithm, store, system, privacy, ledger, packs, state).
"""
from __future__ import annotations

import torch

from ..errors import DivergenceError, PluginError
from .aggregate import Aggregator
from .aggregators import payload_bytes, round_aggregator
from .local import ClientRun, LocalSGD, local_steps, train_client
from .pack import pack_statistics
from .population import place, place_packs
from .schedule import round_lr
from . import stopping

NONFINITE_PARAMS = "non-finite local model parameters"
# What a client's model gives: out of range there means training diverged. A method's own statistic out
# of range while these are fine means the method adds values its segment cannot hold.
MODEL_STATISTICS = (NONFINITE_PARAMS, "loss_sum", "delta", "buffers", "bn_params")


class RoundEngine:
    @property
    def global_params(self) -> torch.Tensor:
        """The global model's flat parameters (run_state.GlobalModel), changed in place by each server step."""
        return self.model.params

    @property
    def global_buffers(self) -> torch.Tensor:
        return self.model.buffers

    def run_round(self, round_idx: int) -> dict:
        """One synchronous round, steps 1-9. (Evaluation and the checkpoint follow in `Trainer.run`.)"""
        cohort, packs = self.select(round_idx)
        stats = self.new_aggregator(cohort)
        self.train_clients(stats, round_idx, cohort, packs)
        return self.finish_round(round_idx, cohort, stats, self.plan.metrics() if self.plan else {})

    # ---- 1. select ------------------------------------------------------------------------------
    def select(self, round_idx: int) -> tuple[list[int], list[list[int]]]:
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

    def new_aggregator(self, cohort: list[int], extra_terms: int = 0) -> Aggregator:
        """The round's aggregator (aggregation.aggregator) over the method's segments and the bookkeeping,
        for the cohort's terms and `extra_terms` more (the server's own: FedAsync's)."""
        largest = max((self.samples_trained(k) for k in cohort), default=1)
        # Under DP a Poisson cohort's size is secret: the sums' units are sized for a round of the whole
        # population, never for the cohort drawn (loss_sum's unit, from `largest`, is withheld with train_loss).
        terms = len(self.population) if self.privacy is not None else len(cohort)
        return round_aggregator(self.cfg, self.algorithm.segments(), largest, self.device, terms + extra_terms,
                                round_idx=self.state.last_round, sampled=self.plan.sampled if self.plan else cohort,
                                senders=cohort)

    # ---- 2-5. download, train, client-side features, add ----------------------------------------
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
                self.contribute_pack(runs, *rows, stats)
                continue
            for run in train_client(self.worker, self.data, [self.client_indices[c] for c in pack], runs,
                                    self.cfg.train, self.algorithm, buffers, self.pack_step):
                self.contribute(run, stats)

    def client_run(self, client_id: int, round_idx: int, cohort: list[int] | None, train_cfg=None, hooks=None,
                   start: torch.Tensor | None = None, state: dict | None = None) -> ClientRun:
        """Client `client_id`'s run in round `round_idx` of `cohort`: its weight, steps, optimizer and state,
        starting from the global model. Per-client evaluation passes what it trains with instead: `cohort`
        None (weight 0), `train_cfg` (else the round's train.*, `client_train_cfg`), `hooks` (else the
        method), `start` (the flat parameters it starts from) and `state` (else the store's)."""
        n = int(self.population.sizes[client_id])
        train_cfg = self.client_train_cfg(client_id) if train_cfg is None else train_cfg
        run = ClientRun(
            client_id=client_id, round_idx=round_idx, num_samples=n,
            weight=0.0 if cohort is None else self.algorithm.client_weight(client_id, cohort),
            steps=local_steps(n, self.cfg.train.batch_size, train_cfg.local_epochs, train_cfg.local_steps,
                              self.worker.fold_single),
            global_params=self.global_params if start is None else start,
            sgd=LocalSGD(self.worker, self.data, self.client_indices[client_id], train_cfg,
                         self.algorithm if hooks is None else hooks))
        if state is not None:
            run.state = state
        elif self.store is not None and self.algorithm.stateful:
            run.state = self.store.get(client_id, self.algorithm.init_client_state)
        return run

    def client_train_cfg(self, client_id: int):
        """train.* as client `client_id` trains this round (system.partial_work may give it less work)."""
        return self.cfg.train if self.system is None else self.system.train_cfg(client_id, self.cfg.train)

    def samples_trained(self, client_id: int) -> int:
        """The samples `client_id`'s local training covers this round (train_loss's denominator)."""
        return self.algorithm.local_samples(int(self.population.sizes[client_id]), self.client_train_cfg(client_id))

    def contribute(self, run: ClientRun, stats: Aggregator) -> None:
        """Add a client's statistics. A NaN/inf (counted here on the device, without waiting for it) or
        out-of-range value stops the round after the all_reduce, so every rank still joins it."""
        stats.begin([run.client_id])
        stats.add("loss_sum", run.loss_sum)
        low, high = torch.aminmax(self.worker.params)
        stats.add("nonfinite", ~(torch.isfinite(low) & torch.isfinite(high)))
        self.algorithm.client_statistics(run, self.worker, stats)  # the method, through its features
        stats.add("samples", self.samples_trained(run.client_id))
        stats.add("clients", 1)
        # Only a stateful method's rounds keep client state (TCT keeps a store for its stage 2, but its
        # stage-1 rounds place clients on any rank: storing their empty state there would duplicate it).
        if self.store is not None and self.algorithm.stateful:
            self.store.put(run.client_id, run.state)

    def contribute_pack(self, runs: list[ClientRun], params: torch.Tensor, buffers: torch.Tensor,
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

    # ---- 6-9. reduce, server-side features, server step, metrics ---------------------------------
    def finish_round(self, round_idx: int, cohort: list[int], stats: Aggregator, extra: dict) -> dict:
        """The one all_reduce of the clients' `stats`, its checks and the server step; the round's row
        (with `extra`: the virtual clock's). The asynchronous server step (distfl/system) ends here too."""
        stats.add("stop", stopping.stop_code(self.stop))
        self.where = f"round {round_idx}, aggregation and server step"
        reduced = self.reduce(round_idx, stats)
        self.server_step(round_idx, cohort, reduced)
        return self.round_metrics(round_idx, reduced, stats, extra)

    def reduce(self, round_idx: int, stats: Aggregator):
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

    def server_step(self, round_idx: int, cohort: list[int], reduced) -> None:
        """The method's `server_update` (through its features: DP's noise) on the global model, in place, unless
        the aggregator could not sum the round (too few survivors: it is skipped, `round_note` says why)."""
        failure = reduced.failure
        self.round_note = failure
        if failure is None and self.ledger is not None:  # distributed DP counts the survivors' noise
            self.ledger.record_round(reduced)
        if failure is None and (cohort or self.privacy is not None):  # an empty Poisson cohort leaves a non-private model as it is
            self.algorithm.server_update(self.global_params, self.global_buffers, reduced)
        self.state.model_round = round_idx  # under DP: its noise is in the model from here on
        if not bool(torch.isfinite(self.global_params).all()):
            raise DivergenceError(f"round {round_idx}: the server update made the global model non-finite; "
                                  "lower server.lr")

    def round_metrics(self, round_idx: int, reduced, stats: Aggregator, extra: dict) -> dict:
        """The round's row: train_loss, bytes, learning rates, the method's and the aggregator's metrics, `extra`."""
        cfg, samples, clients = self.cfg, int(reduced["samples"][0]), int(reduced["clients"][0])
        down, up = self.payload_bytes()
        return {"train_loss": reduced.scalar("loss_sum") / max(samples, 1), "samples": samples,
                "bytes_up": clients * up, "bytes_down": clients * down, "bytes_reduced": stats.nbytes, "lr": round_lr(cfg.train, round_idx, cfg.train.rounds),
                "server_lr": self.algorithm.server_opt.lr, **self.algorithm.round_metrics,
                **({"privacy_epsilon": self.ledger.epsilon_after(round_idx)}
                   if self.ledger is not None and self.ctx.is_main else {}),
                **reduced.metrics, **extra}

    def payload_bytes(self) -> tuple[int, int]:
        """What each client of a round downloads and uploads, in bytes (federation/aggregators.py)."""
        return payload_bytes(self.cfg, self.algorithm)

"""TCT: Train-Convexify-Train (Yu, Wei, Karimireddy, Ma, Jordan, NeurIPS 2022; ../shared/papers/tct.md).

Stage 1 is `train.rounds` rounds of any algorithm (`tct.stage1`, default FedAvg), run by the normal
round loop. This phase is everything after it (Algorithm 2):

1. Convexify: re-initialise the last layer from `tct.head_seed`, pick p coordinates of the parameter
   vector from `tct.coordinate_seed` (Algorithm 3's `randperm(P)[:p]`, kept in parameter order unless
   `tct.coordinate_order: drawn`), and give every training and test sample its eNTK feature
   z = (d f_1(x) / d theta)[coordinates], the per-sample gradient of the first logit, model in eval
   mode (distfl/tct/features.py: layer-wise from one batched backward pass, `torch.func` for other
   models). Features stay on the rank that hosts the client (client c on rank c % world size), in
   memory or in memory-mapped files; they are never gathered.
2. Normalise (one collective): per-coordinate mean and variance over all clients from float64 sums
   of z and z^2; every client's sums travel in their own slot of one all_reduce and every rank adds the
   slots in client order, so the statistics are the same bits for any number of ranks. Test features
   are normalised with the training statistics. Targets are one-hot - 1/C.
3. Train: W (p x C) and b (C) from 0, by SCAFFOLD as Algorithm 1 (`tct.solver: scaffold`; h_k kept
   per client, one model per client and round on the wire), M = `tct.local_steps` full-batch
   gradient steps at eta = `tct.lr`, weighted by n_k / n (footnote 7). Ablations: `fedavg` (TCT-FedAvg)
   and `gd` (one global gradient step a round, TCT-GD). The M local steps are computed exactly in
   closed form (distfl/tct/solver.py) unless `tct.local_solver: iterative`.
With eval.clients, each stage-2 evaluation also scores psi on every client's local test set (`_evaluate`):
rows of the test features (client_split=test) or features of the client's held-out samples (holdout).
Stage 2 is checkpointed every `checkpoint.every` rounds with the client controls; a resumed run
recomputes (memory) or reopens (disk) the features, re-applies the saved statistics and continues.
Disk files are normalised in place, so each one's marker records whether, and with which statistics,
it was normalised; a resumed run never normalises a file twice (`_extract`). The disk store also keeps
the statistics (RUN_DIR/tct/stats.pt, named by the features they come from) and each client's
decomposition (beside its features, named by all its bits depend on), so a stage 2 that fails before
its first checkpoint (e.g. tct.lr too large) resumes from stage 1 with new tct.lr, tct.local_steps,
tct.solver or tct.rounds without extracting or eigendecomposing again.

Choices where the paper is silent (docs/algorithms/tct.md): the head keeps C outputs and logit 0 is
differentiated (the released code uses a 1-output head; same distribution), the gradient is over every
parameter (`tct.gradient_of: all`, as Algorithm 3), zero-variance coordinates (e.g. the head rows of
the other logits) are set to 0 after normalisation, the population variance (1/n) is used.
"""
from __future__ import annotations

import hashlib
import math
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from .. import checkpoint, dist
from ..errors import ConfigError, DivergenceError, Interrupted
from ..federation.aggregate import Segment, StatBuffer
from ..federation.client_eval import client_segments, reduced_client_statistics
from ..federation import stopping
from ..federation.phases import Phase
from ..tct.features import coordinate_index, entk_features, feature_parameters, reinit_head
from ..tct.resources import (DTYPES, available_memory_bytes, decomposition_seconds, disk_shortfall, divergence_advice,
                             memory_plan, phase_threads, probe_rates)
from ..tct.solver import LocalLeastSquares, fedavg_client_round, scaffold_client_round
from .base import Algorithm

# Stage 2 runs where the features live, the host (memory or memory-mapped): the solvers, psi and the
# clients' SCAFFOLD state stay together there on any run device; only the round's sums go to the device.
STAGE2_DEVICE = torch.device("cpu")
MODEL_FILE = "tct_model.pt"  # W and b (psi), the normalisation statistics and the coordinates
STATS_FILE = "stats.pt"  # disk store: the normalisation statistics, under RUN_DIR/tct, beside the features


def _stats_key(mean: torch.Tensor, std: torch.Tensor) -> str:
    """Names the normalisation statistics a disk feature file was normalised with."""
    raw = mean.to(torch.float64).cpu().numpy().tobytes() + std.to(torch.float64).cpu().numpy().tobytes()
    return hashlib.sha256(raw).hexdigest()[:16]


def _hash(*parts) -> str:
    """16 hex digits of SHA-256 over `parts`: tensors by dtype, shape and bytes (without a copy when
    they are contiguous on the CPU), anything else as its str; each part prefixed with its length."""
    digest = hashlib.sha256()
    for part in parts:
        if isinstance(part, torch.Tensor):
            digest.update(f"{part.dtype} {tuple(part.shape)}".encode())
            raw = part.detach().cpu().contiguous().numpy()
        else:
            raw = str(part).encode()
        digest.update(memoryview(raw).nbytes.to_bytes(8, "little"))
        digest.update(raw)
    return digest.hexdigest()[:16]


def _per_rank(value, dtype: torch.dtype, ctx, name: str) -> torch.Tensor:
    """Every rank's `value`, indexed by rank (each rank fills its own slot of one small all_reduce)."""
    slots = torch.zeros(ctx.world_size, dtype=dtype, device=ctx.device)
    slots[ctx.rank] = value
    return dist.all_reduce_sum(slots, ctx, name=name)


def _largest_on_any_rank(value: float, ctx) -> float:
    """The largest of the ranks' `value`s."""
    return float(_per_rank(value, torch.float64, ctx, "tct_lambda_max").max())


def _same_on_all_ranks(value: int, ctx) -> bool:
    """Whether every rank holds `value` (a 56-bit integer); one small all_reduce."""
    if ctx.world_size == 1:
        return True
    return bool((_per_rank(value, torch.int64, ctx, "tct_reuse_check") == value).all())


class TCT(Algorithm):
    """algorithm.name=tct: train.rounds rounds of the method tct.stage1 names (its options are
    algorithm.options), then TCT's stages as a phase (`TCTPhase`)."""
    name = "tct"
    client_store = True  # stage 2 keeps each client's SCAFFOLD control in the store
    why_not_private = "TCT releases per-client eNTK statistics and SCAFFOLD control variates in its later stages, unclipped"

    @classmethod
    def trained_method(cls, cfg) -> type:
        from . import algorithm_class

        return algorithm_class(cfg.tct.stage1)

    @classmethod
    def phases(cls, cfg) -> list:
        return [TCTPhase()]

    @classmethod
    def check_config(cls, cfg):
        if cfg.calibration.method != "none":
            raise ConfigError("algorithm.name=tct replaces the network by a linear model on eNTK features; "
                              f"calibration.method={cfg.calibration.method} does not apply to it: set "
                              "calibration.method=none")
        if cfg.model.head != "linear":
            raise ConfigError(f"algorithm.name=tct re-initialises a learnable linear head; model.head="
                              f"{cfg.model.head} is fixed: use model.head=linear")
        if cfg.eval.finetune_epochs:
            raise ConfigError(f"eval.finetune_epochs={cfg.eval.finetune_epochs} fine-tunes a network before per-client "
                              "evaluation, but algorithm.name=tct scores each client with stage 2's linear model: set "
                              "eval.finetune_epochs=0")
        if cfg.eval.test_samples:
            raise ConfigError(f"eval.test_samples={cfg.eval.test_samples} scores a sample of the test split, but "
                              "algorithm.name=tct's stage 2 scores the whole test split: set eval.test_samples=0")
        cls.trained_method(cfg).check_config(cfg)


class TCTPhase(Phase):
    name = "tct"

    # ---- 1. convexify: eNTK features ----------------------------------------------------------------
    def _features(self, context, logger, stats_key: str | None) -> None:
        cfg, ctx = context.cfg.tct, context.ctx
        model = context.worker.module
        context.worker.load(context.global_params, context.global_buffers)
        reinit_head(model, cfg.head_seed)
        chosen = feature_parameters(model, cfg.gradient_of)
        num = sum(p.numel() for _, p in chosen)
        self.index = coordinate_index(num, cfg.p, cfg.coordinate_seed, cfg.coordinate_order)
        self.p = len(self.index)
        if cfg.p > num:
            logger.info(f"TCT: tct.p={cfg.p} is larger than the {num} parameters the gradient is taken over; "
                        f"all {num} coordinates are kept" + (
                            f" (in the permuted order randperm({num})[:{cfg.p}] gives, as the paper's code would)"
                            if cfg.coordinate_order == "drawn" else ", in parameter order"))
        # Names the features of this model (parameters and BatchNorm buffers, the new head included), these
        # coordinates and this gradient; a feature file's key adds its samples.
        self.model_key = int(_hash(context.worker.state_sha256(), self.index.to(torch.int64), cfg.gradient_of)[:14],
                             16)
        dist.check_same_on_all_ranks(self.model_key, ctx, "TCT's coordinates and head")
        data = context.data
        c = data.num_classes
        sizes = context.population.sizes
        self.clients = [k for k in range(len(context.population)) if context.hosts(k)]
        starts = list(range(0, len(data.test_y), context.cfg.eval.batch_size))
        self.test_batches = starts[ctx.rank :: ctx.world_size]
        # eval.client_split=holdout: each client is scored on features of its held-out samples too
        self.holdout = context.cfg.eval.clients and context.cfg.eval.client_split == "holdout"
        held = sum(len(s) for s in context.client_test) if self.holdout else 0

        plan = memory_plan([int(n) for n in sizes], len(data.test_y) + held, self.p, c, cfg)
        limit = cfg.memory_limit_gb * 2**30 if cfg.memory_limit_gb > 0 else 0.8 * available_memory_bytes()
        gb = lambda b: b / 2**30  # noqa: E731
        logger.info(f"TCT: eNTK features of {int(sum(sizes))} training + {len(data.test_y)} test samples"
                    + (f" + {held} held-out (eval.client_split=holdout)" if held else "") + ", "
                    f"p = {self.p}, {cfg.feature_dtype}: {gb(plan['features']):.2f} GB ({cfg.feature_store}); "
                    f"decompositions {gb(plan['decompositions']):.2f} GB; client state {gb(plan['client_state']):.2f} GB; "
                    f"{gb(plan['total']):.2f} GB in memory in all, limit {gb(limit):.2f} GB")
        if plan["total"] > limit:
            raise ConfigError(
                f"TCT's stage 2 would hold {gb(plan['total']):.2f} GB in memory on this node, more than the limit of "
                f"{gb(limit):.2f} GB (tct.memory_limit_gb, default 80% of available memory). Use "
                "tct.feature_dtype=float16 (half the features), tct.feature_store=disk (features memory-mapped), "
                f"or a smaller tct.p (now {self.p})")
        if cfg.feature_store == "disk":
            # every rank decides on the same sum, so a refusal stops all of them before any extraction
            missing, free = disk_shortfall(context.run_dir, plan["disk"])
            short = dist.all_reduce_sum(torch.tensor([int(missing > 0)], dtype=torch.int64, device=ctx.device),
                                        ctx, name="tct_disk_check")
            if int(short.item()):
                raise ConfigError(
                    f"TCT's disk store needs {gb(plan['disk']):.2f} GB under {Path(context.run_dir) / 'tct'} "
                    f"(features {gb(plan['features']):.2f} GB, decompositions "
                    f"{gb(plan['disk'] - plan['features']):.2f} GB, less what is there already), more than a "
                    f"rank's file system has free ({gb(free):.2f} GB free on this rank's). Free space, point "
                    f"output.dir at a larger disk, or use tct.feature_dtype=float16 or a smaller tct.p (now {self.p})")
        self.plan = plan

        self.logger = logger
        self.saved_statistics = None  # (mean, std) found in RUN_DIR/tct/stats.pt, of these very features
        if cfg.feature_store == "disk" and cfg.normalize and stats_key is None:
            self.statistics_source = self._statistics_source(context)
            self.saved_statistics = self._load_statistics(context, logger)
            if self.saved_statistics is not None:
                stats_key = _stats_key(*self.saved_statistics)

        t0 = time.perf_counter()
        dtype = DTYPES[cfg.feature_dtype]
        self.train_z, self.train_y = {}, {}
        test_here = sum(len(data.test_y[s : s + context.cfg.eval.batch_size]) for s in self.test_batches)
        held_here = sum(len(context.client_test[k]) for k in self.clients) if self.holdout else 0
        remaining = sum(len(context.client_indices[k]) for k in self.clients) + test_here + held_here
        done = 0
        self.normalised: set[str] = set()  # disk files found already normalised with the resumed statistics
        self.disk: dict[str, tuple] = {}  # name -> (marker file, source key, memmap) of the disk store
        for k in self.clients:
            idx = context.client_indices[k]
            self.train_z[k] = self._extract(context, data.train_x[idx], f"client_{k}", dtype, stats_key)
            self.train_y[k] = data.train_y[idx]
            elapsed = time.perf_counter() - t0
            done += len(idx)
            logger.info(f"TCT: features of client {k} ({len(idx)} samples) done, {elapsed:.0f}s, "
                        f"~{elapsed / done * (remaining - done):.0f}s left ({torch.get_num_threads()} thread(s))")
        x = torch.cat([data.test_x[s : s + context.cfg.eval.batch_size] for s in self.test_batches]) \
            if self.test_batches else data.test_x[:0]
        self.test_y = torch.cat([data.test_y[s : s + context.cfg.eval.batch_size] for s in self.test_batches]) \
            if self.test_batches else data.test_y[:0]
        self.test_z = self._extract(context, x, "test", dtype, stats_key)
        self.holdout_z, self.holdout_y = {}, {}
        if self.holdout:
            for k in self.clients:
                idx = context.client_test[k]
                self.holdout_z[k] = self._extract(context, data.train_x[idx], f"holdout_{k}", dtype, stats_key)
                self.holdout_y[k] = data.train_y[idx].to(STAGE2_DEVICE)  # scored where psi is
        elif context.cfg.eval.clients:
            self._locate_client_tests(context)
        self.features_s = time.perf_counter() - t0

    def _locate_client_tests(self, context) -> None:
        """eval.client_split=test: each client's local test set is a set of test-split indices
        (client_test.py); find those held among this rank's test features (`client_rows`, the positions
        in test_z, of client `client_of`) and count them per client (`client_here`)."""
        n_test, batch = len(context.data.test_y), context.cfg.eval.batch_size
        here = torch.cat([torch.arange(s, min(s + batch, n_test)) for s in self.test_batches]) \
            if self.test_batches else torch.zeros(0, dtype=torch.int64)
        position = torch.full((n_test,), -1, dtype=torch.int64)
        position[here] = torch.arange(len(here))
        rows = [position[indices.cpu()] for indices in context.client_test]
        rows = [r[r >= 0] for r in rows]
        self.client_here = torch.tensor([len(r) for r in rows], dtype=torch.int64)
        self.client_of = torch.repeat_interleave(torch.arange(len(rows)), self.client_here)
        self.client_rows = torch.cat(rows)

    def _statistics_source(self, context) -> str:
        """Names what the normalisation statistics are computed from: the features (model, coordinates,
        gradient, storage dtype) of every client's training samples, in client order."""
        indices = [torch.as_tensor(context.client_indices[k], dtype=torch.int64)
                   for k in range(len(context.population))]
        return _hash(f"{self.model_key:014x}", context.cfg.tct.feature_dtype, context.data.train_x, *indices)

    def _load_statistics(self, context, logger) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The statistics of RUN_DIR/tct/stats.pt when they were computed from the features this run
        extracts (`_statistics_source`) and every rank finds the same; else None, and the log says why."""
        path = Path(context.run_dir) / "tct" / STATS_FILE
        found, why = None, None
        if path.exists():
            try:
                saved = torch.load(path, map_location="cpu", weights_only=True)
                mean, std = saved["mean"], saved["std"]
                if saved["source"] != self.statistics_source or tuple(mean.shape) != (self.p,) \
                        or tuple(std.shape) != (self.p,):
                    why = "they are of other features"
                elif saved["stats_key"] != _stats_key(mean, std):
                    why = "they do not match their key"
                else:
                    found = (mean.to(torch.float64), std.to(torch.float64))
            except Exception as exc:  # torch raises several types for truncated or foreign files
                why = f"unreadable ({type(exc).__name__})"
        if not _same_on_all_ranks(int(_stats_key(*found)[:14], 16) if found else 0, context.ctx):
            found, why = None, why or "the ranks found different files"
        if why:
            logger.info(f"TCT: normalisation statistics in {path} not reused ({why}); they are computed again")
        elif found:
            logger.info(f"TCT: normalisation statistics reused from {path}")
        return found

    def _save_statistics(self, context, mean: torch.Tensor, std: torch.Tensor) -> None:
        """RUN_DIR/tct/stats.pt, by the main rank before it marks any file normalised with them (if a crash
        leaves files marked with statistics that are not there, a resume extracts those files again)."""
        if context.ctx.is_main:
            path = Path(context.run_dir) / "tct" / STATS_FILE
            checkpoint.atomic_torch_save({"source": self.statistics_source, "stats_key": _stats_key(mean, std),
                                          "mean": mean.cpu(), "std": std.cpu()}, path)
            checkpoint.fsync(path)
            checkpoint.fsync(path.parent)

    def _extract(self, context, x, name: str, dtype, stats_key: str | None) -> torch.Tensor:
        """The features of `x`: computed (memory store), or a memory-mapped file under RUN_DIR/tct/rankR
        (disk store). A disk file is normalised in place later, so its marker `NAME.complete` says what
        it holds: `raw KEY` or `normalised KEY STATS` (KEY: model, coordinates and samples; STATS: the
        statistics applied). It is reused only when it holds raw features of the same samples, or
        features normalised with the statistics of the checkpoint being resumed (`stats_key`);
        otherwise it is extracted again."""
        cfg = context.cfg.tct
        model = context.worker.module
        if cfg.feature_store == "memory":
            return entk_features(model, x, self.index, cfg.gradient_of, cfg.chunk_size, dtype)
        folder = Path(context.run_dir) / "tct" / f"rank{context.ctx.rank}"
        folder.mkdir(parents=True, exist_ok=True)
        path, marker = folder / f"{name}.{cfg.feature_dtype}", folder / f"{name}.complete"
        shape = (len(x), self.p)
        key = f"{self.model_key ^ dist.fingerprint(x):014x}"
        found = marker.read_text().split() if marker.exists() else []
        sized = path.exists() and path.stat().st_size == math.prod(shape) * dtype.itemsize
        reuse = sized and (found == ["raw", key] or (stats_key is not None and found == ["normalised", key, stats_key]))
        if reuse and found[0] == "normalised":
            self.normalised.add(name)
        if not reuse:
            if found:
                self.logger.info(f"TCT: features {name} extracted again (its marker says '{' '.join(found)}': "
                                 f"not raw features of key {key} nor normalised with the statistics in use)")
            marker.unlink(missing_ok=True)
        mode = "r+" if reuse else "w+"
        np_dtype = np.float16 if dtype == torch.float16 else np.float32
        array = np.memmap(path, dtype=np_dtype, mode=mode, shape=shape) if shape[0] else np.zeros(shape, np_dtype)
        out = torch.from_numpy(array)
        if mode == "w+":
            entk_features(model, x, self.index, cfg.gradient_of, cfg.chunk_size, dtype, out=out)
            if shape[0]:
                array.flush()
            checkpoint.atomic_write_text(f"raw {key}\n", marker)
        self.disk[name] = (marker, key, array)
        return out

    # ---- 2. normalise --------------------------------------------------------------------------------
    def _statistics(self, context) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-coordinate mean and standard deviation over all training samples, one all_reduce."""
        k_total = len(context.population)
        slots = torch.zeros(k_total, 2 * self.p + 1, dtype=torch.float64, device=context.device)
        for k in self.clients:
            z = self.train_z[k]
            for start in range(0, len(z), 4096):
                block = z[start : start + 4096].to(context.device, torch.float64)
                slots[k, : self.p] += block.sum(0)
                slots[k, self.p : 2 * self.p] += (block * block).sum(0)
            slots[k, -1] = len(z)
        dist.all_reduce_sum(slots, context.ctx, name="tct_normalise")
        total = slots.sum(0)
        n = total[-1]
        mean = total[: self.p] / n
        var = (total[self.p : 2 * self.p] / n - mean * mean).clamp_min(0)
        std = var.sqrt()
        # A coordinate that never varies (e.g. a head row of another logit) carries no information: it
        # is mapped to 0 instead of being divided by ~0.
        top = float(std.max()) if std.numel() else 0.0
        constant = std <= 1e-7 * top
        return mean, torch.where(constant, torch.full_like(std, math.inf), std)

    def _normalise(self, z: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> None:
        for start in range(0, len(z), 4096):
            block = z[start : start + 4096]
            m, s = mean.to(block.device), std.to(block.device)
            block.copy_(((block.to(torch.float64) - m) / s).to(block.dtype))

    def _normalise_all(self, mean: torch.Tensor, std: torch.Tensor, stats_key: str) -> None:
        """Normalise every feature matrix in place, except disk files that already are. A disk file loses
        its marker while it is being rewritten, so a crash half-way makes it extracted again."""
        named = [*((f"client_{k}", z) for k, z in self.train_z.items()), ("test", self.test_z),
                 *((f"holdout_{k}", z) for k, z in self.holdout_z.items())]
        for name, z in named:
            if name in self.normalised:
                continue
            if name in self.disk:
                self.disk[name][0].unlink(missing_ok=True)
            self._normalise(z, mean, std)
            if name in self.disk:
                marker, key, array = self.disk[name]
                if len(z):
                    array.flush()
                checkpoint.atomic_write_text(f"normalised {key} {stats_key}\n", marker)

    # ---- 3. train: federated least squares ------------------------------------------------------------
    def run(self, context, logger) -> dict:
        cfg, tc = context.cfg, context.cfg.tct
        ctx = context.ctx
        t_start = time.perf_counter()
        stage1_acc = (context.state.progress["last_eval"] or {}).get("test_acc")
        resumed = context.state.phase_state if context.state.phase_state.get("phase") == self.name else {}
        saved_stats = _stats_key(resumed["mean"], resumed["std"]) if resumed and tc.normalize else None
        threads = tc.threads or cfg.runtime.threads
        if context.store is not None:
            context.store.home = STAGE2_DEVICE
        with phase_threads(threads):
            self._features(context, logger, saved_stats)
        t0 = time.perf_counter()
        if tc.normalize:
            if resumed:
                mean, std = resumed["mean"].to(context.device), resumed["std"].to(context.device)
            elif self.saved_statistics is not None:
                mean, std = (t.to(context.device) for t in self.saved_statistics)
            else:
                mean, std = self._statistics(context)
                if tc.feature_store == "disk":
                    self._save_statistics(context, mean, std)
            self._normalise_all(mean, std, _stats_key(mean, std))
        else:
            mean = std = torch.zeros(0)
        normalise_s = time.perf_counter() - t0

        c = context.data.num_classes
        sizes = context.population.sizes
        n_total = int(sum(int(n) for n in sizes))
        compute = DTYPES[tc.compute_dtype]
        solvers = {k: LocalLeastSquares(self.train_z[k], F.one_hot(self.train_y[k], c).to(torch.float64) - 1.0 / c,
                                        bias=True, dtype_compute=compute) for k in self.clients}
        q = self.p + 1
        psi = (resumed["psi"].to(STAGE2_DEVICE) if resumed
               else torch.zeros(q, c, dtype=torch.float64, device=STAGE2_DEVICE))
        first = int(resumed.get("round", 0)) + 1 if resumed else 1
        base_step = cfg.train.rounds
        if first > 1:
            logger.info(f"TCT: resuming stage 2 at round {first}")
        if tc.local_solver == "closed_form" and tc.solver != "gd":
            cache = {}
            if tc.feature_store == "disk":
                applied = _stats_key(mean, std) if tc.normalize else "raw"
                cache = {k: self._decomposition_file(context, k, solver, applied, threads)
                         for k, solver in solvers.items()}
            with phase_threads(threads):
                self._decompose(solvers, logger, cache)
            self.lambda_max = _largest_on_any_rank(max((s.lambda_max for s in solvers.values()), default=0.0), ctx)
        else:
            self.lambda_max = 0.0  # not known without the decompositions
        t_train = time.perf_counter()
        evaluated = None
        for t in range(first, tc.rounds + 1):
            t_round = time.perf_counter()
            psi = self._round(context, solvers, psi, t, n_total, q, c)
            row = {"round": base_step + t, "phase": self.name, "stage2_round": t,
                   "round_s": time.perf_counter() - t_round}
            if tc.check_invariant:
                row["h_weighted_sum_max"] = self.invariant
            if t % cfg.eval.every == 0 or t == tc.rounds:
                evaluated = self._evaluate(context, psi)
                row.update(evaluated)
                clients = (f", per client {100 * evaluated['client_acc_mean']:.2f}% mean"
                           if cfg.eval.clients else "")
                logger.info(f"TCT stage 2 round {t}/{tc.rounds}: test accuracy "
                            f"{100 * evaluated['test_acc']:.2f}%{clients}")
            logger.log_phase(row)
            context.state.step = base_step + t
            if context.stop.agreed or (cfg.checkpoint.every and t % cfg.checkpoint.every == 0 and t < tc.rounds):
                context.save_phase_checkpoint(self.name, {"round": t, "psi": psi, "mean": mean, "std": std})
                if context.stop.agreed:
                    raise Interrupted(stopping.stopped_line(context.stop, f"TCT stage 2 round {t} of {tc.rounds}",
                                                            context.run_dir, context.ctx.world_size))
        if evaluated is None:  # resumed from a checkpoint of the last round (a stop there): no round ran
            evaluated = self._evaluate(context, psi)
        acc = evaluated["test_acc"]
        client_stats = {k: v for k, v in evaluated.items() if k.startswith("client_acc_")}
        context.state.record_eval(acc, None, self.name, client_stats)
        if ctx.is_main:  # the stage-2 model: predict argmax(((z - mean) / std) @ W + b)
            checkpoint.atomic_torch_save({"psi": psi.cpu(), "mean": mean.cpu(), "std": std.cpu(),
                                          "coordinates": self.index, "head_seed": tc.head_seed},
                                         Path(context.run_dir) / MODEL_FILE)
        return {
            "psi_sha256": hashlib.sha256(psi.cpu().numpy().tobytes()).hexdigest(),
            "stage1_test_acc": stage1_acc, "test_acc": acc, **client_stats, "p": self.p, "rounds": tc.rounds,
            "local_steps": tc.local_steps, "lr": tc.lr, "solver": tc.solver, "local_solver": tc.local_solver,
            "lambda_max": self.lambda_max, "feature_bytes": self.plan["features"], "memory_bytes": self.plan["total"],
            "features_s": self.features_s, "normalise_s": normalise_s,
            "stage2_s": time.perf_counter() - t_train, "total_s": time.perf_counter() - t_start,
        }

    def _decomposition_file(self, context, k: int, solver: LocalLeastSquares, applied: str,
                            threads: int) -> tuple[Path, str]:
        """Where client k's decomposition is kept with the disk store (beside its features), and the key
        naming everything its bits depend on: the feature file (model, coordinates, samples), the
        statistics applied to it, the labels, the solver's basis, bias, compute dtype and block size,
        the threads it runs on, and the torch build and device type."""
        marker, features_key, _ = self.disk[f"client_{k}"]
        key = _hash(features_key, applied, context.cfg.tct.feature_dtype,
                    self.train_y[k].to(torch.int64), solver.basis, solver.bias,
                    solver.dtype, solver.rows, threads, torch.__version__, solver.device.type)
        return marker.parent / f"client_{k}.decomposition.pt", key

    def _load_decomposition(self, k: int, solver: LocalLeastSquares, path: Path, key: str, logger) -> bool:
        """Give `solver` client k's saved decomposition if `path` holds one of `key`; say why not if it
        holds another. Loaded one client at a time onto the solver's device, as it would be computed."""
        if not path.exists():
            return False
        try:
            saved = torch.load(path, map_location=solver.device, weights_only=True)
            if saved.get("key") != key:
                why = "its file is of another key"
            else:
                solver.use_decomposition(saved)
                logger.info(f"TCT stage 2: decomposition of client {k} reused")
                return True
        except Exception as exc:  # unreadable (torch raises several types) or of the wrong shape
            why = f"its file is unusable ({type(exc).__name__}: {exc})"
        logger.info(f"TCT stage 2: decomposition of client {k} recomputed: {why}")
        return False

    def _decompose(self, solvers: dict, logger, cache: dict) -> None:
        """Every local client's one-time eigendecomposition, before stage 2's rounds, each logged with
        its size and a time estimate (measured so far, or from a small probe for the first). With the
        disk store (`cache`: client -> (file, key)) a saved decomposition of the same key is loaded
        instead, and a computed one is saved (atomically: a crash leaves the old file or the new)."""
        solvers = {k: s for k, s in solvers.items() if not (k in cache and self._load_decomposition(k, s, *cache[k],
                                                                                                      logger))}
        first = next(iter(solvers.values()), None)
        rates = probe_rates(first.dtype) if first is not None else (0.0, 0.0)
        costs = {k: decomposition_seconds(s, *rates) for k, s in solvers.items()}
        # rate: measured seconds per predicted second, 1 until the first client is done
        rate, spent, done = 1.0, 0.0, 0.0
        for i, (k, solver) in enumerate(solvers.items(), 1):
            if done:
                rate = spent / done
            side = solver.n if solver.basis == "samples" else solver.p + int(solver.bias)
            left = rate * sum(costs[j] for j in list(solvers)[i - 1:])
            logger.info(f"TCT stage 2: eigendecomposing client {i}/{len(solvers)} (client {k}, {side} x {side}, "
                        f"{torch.get_num_threads()} thread(s)), ~{rate * costs[k]:.1f} s each, ~{left:.0f} s left")
            t0 = time.perf_counter()
            solver.decompose()
            spent, done = spent + time.perf_counter() - t0, done + costs[k]
            if k in cache:
                path, key = cache[k]
                saved = {name: (t.cpu() if isinstance(t, torch.Tensor) else t)
                         for name, t in solver.decomposition().items()}
                checkpoint.atomic_torch_save({"key": key, **saved}, path)

    def _round(self, context, solvers, psi, t, n_total, q, c):
        tc = context.cfg.tct
        sizes = context.population.sizes
        segments = [Segment("psi", q * c), Segment("stop", 1, kind="int")]
        if tc.check_invariant:
            segments.append(Segment("h_sum", q * c))
        stats = StatBuffer(segments, context.device, len(context.population))
        for k, solver in solvers.items():
            weight = int(sizes[k]) / n_total
            state = None
            if tc.solver == "scaffold":  # stage-2 keys, beside any state the stage-1 algorithm kept
                saved = context.store.get(k, dict, device=STAGE2_DEVICE)
                state = {"h": saved.get("tct_h", solver.zeros()), "last": saved.get("tct_last")}
            if tc.solver == "gd":
                out = psi - tc.lr * solver.gradient(psi)
            elif tc.solver == "scaffold":
                out = scaffold_client_round(solver, psi, state, tc.lr, tc.local_steps, tc.local_solver)
            else:
                out = fedavg_client_round(solver, psi, None, tc.lr, tc.local_steps, tc.local_solver)
            stats.add("psi", out, weight)
            if tc.check_invariant:
                stats.add("h_sum", state["h"], weight)
            if state is not None:
                context.store.put(k, {"tct_h": state["h"], "tct_last": state["last"]})
        stats.add("stop", stopping.stop_code(context.stop))
        reduced = stats.reduce(context.ctx, name="tct_round")
        stopping.agree(context.stop, int(reduced["stop"][0]))
        problems = reduced.problems()
        if problems:
            found = "; ".join(f"{name}: {what}" for name, what in problems.items())
            raise DivergenceError(f"TCT stage 2 round {t}: the clients produced a non-finite or huge model ({found}); "
                                  f"{divergence_advice(tc.lr, tc.local_steps, self.lambda_max)}")
        if tc.check_invariant:
            self.invariant = float(reduced["h_sum"].abs().max())
        return reduced["psi"].view(q, c).to(STAGE2_DEVICE)

    def _evaluate(self, context, psi) -> dict:
        """test_acc of the linear model psi, from this rank's test batches; with eval.clients the statistics
        of its accuracy on every client's local test set (`client_acc_*`, client_eval.py), scored on the
        features of those samples: rows of the test features (client_split=test) or the client's held-out
        features (holdout). Each client's correct and total counts fill its int slots of the same
        all_reduce, so the statistics are exact and identical on any number of ranks."""
        num_clients = len(context.population)
        clients = context.cfg.eval.clients
        stats = StatBuffer([Segment("correct", 1, kind="int"), *(client_segments(num_clients) if clients else [])],
                           context.device, 1)
        hits = _hits(self.test_z, self.test_y, psi)
        stats.add("correct", hits.sum())
        if clients:
            correct = torch.zeros(num_clients, dtype=torch.int64)
            total = torch.zeros(num_clients, dtype=torch.int64)
            if self.holdout:
                for k, z in self.holdout_z.items():
                    correct[k] = _hits(z, self.holdout_y[k], psi).sum()
                    total[k] = len(z)
            else:
                correct.index_add_(0, self.client_of, hits[self.client_rows].to(torch.int64))
                total += self.client_here
            stats.add("client_correct", correct)
            stats.add("client_total", total)
        reduced = stats.reduce(context.ctx, name="tct_eval")
        metrics = {"test_acc": int(reduced["correct"][0]) / len(context.data.test_y)}
        if clients:
            metrics.update(reduced_client_statistics(reduced, context))
        return metrics


def _hits(z: torch.Tensor, y: torch.Tensor, psi: torch.Tensor) -> torch.Tensor:
    """Whether the linear model psi (W; b as its last row) predicts y for each row of z, argmax of the
    float64 scores z @ W + b, 4096 rows at a time (z may be a memory-mapped file)."""
    y = y.to(psi.device)
    hits = torch.zeros(len(z), dtype=torch.bool, device=psi.device)
    for s in range(0, len(z), 4096):
        scores = z[s : s + 4096].to(psi.device, torch.float64) @ psi[:-1] + psi[-1]
        hits[s : s + 4096] = scores.argmax(1) == y[s : s + 4096]
    return hits

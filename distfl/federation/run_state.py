"""The state a checkpoint holds, as objects with `state_dict`/`load_state_dict` (as torchtitan's
checkpointer takes `Stateful`s): the run's progress, the global model, the method's server state and the
privacy mechanism's. `checkpoint.state_of` joins their state_dicts (disjoint keys) into the checkpoint's
state.pt and `checkpoint.load_state` hands a loaded one back; the client store writes its own files
(federation/state.py). The keys are those of every earlier release, so their checkpoints resume.

`RunContext` is what the parts of a run outside the round loop get instead of the Trainer: phases (TCT,
FFC), per-client evaluation and summary.json read the run's objects from it and act through the few
functions it holds.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from .. import checkpoint, dist, faults
from ..checkpoint import to_cpu
from ..errors import RankDisagreement
from ..privacy.secret import NOISE_KEY_FILE
from . import init_from


@dataclass
class RunProgress:
    """Where the run is: `step` numbers checkpoints through the training rounds, then the phases."""

    rounds: int  # train.rounds
    step: int = 0
    start_round: int = 1  # the first round this session trains
    last_round: int = 0  # the round an evaluation after it belongs to (client fine-tuning's lr)
    # The round of the global model's last server step: `step` until a round's server step has run and the
    # round ended before its checkpoint (diverged, failed, a second Ctrl-C). Under DP, the rounds accounted.
    model_round: int = 0
    phases_done: list = field(default_factory=list)
    phase_results: dict = field(default_factory=dict)
    phase_state: dict = field(default_factory=dict)  # the running phase's resumable state
    # bytes_up / bytes_down: the totals over the rounds (absent when resumed from a checkpoint that predates them).
    progress: dict = field(default_factory=lambda: {"best_test_acc": None, "best_round": None, "wall_s": 0.0,
                                                    "last_eval": None, "bytes_up": 0, "bytes_down": 0})
    # Each resume on another runtime (device, threads, determinism, torch build): the round it went on
    # from, the runtime before and after (summary.json).
    runtime_changes: list = field(default_factory=list)

    def record_best(self, acc: float, round_idx: int) -> bool:
        """A training round's test accuracy: whether it is the best so far (then `best_test_acc`, `best_round`)."""
        if self.progress["best_test_acc"] is not None and acc <= self.progress["best_test_acc"]:
            return False
        self.progress["best_test_acc"], self.progress["best_round"] = acc, round_idx
        return True

    def record_eval(self, acc: float, loss: float | None, label: str, client_stats: dict | None = None) -> None:
        """A phase's evaluation of the final model: it becomes the run's final accuracy (`best_test_acc`
        stays the best over the training rounds); `client_stats` (eval.clients) its final_client_acc."""
        self.progress["last_eval"] = {"round": self.rounds, "test_acc": acc, "test_loss": loss, "phase": label,
                                      **(client_stats or {})}

    def state_dict(self) -> dict:
        return {"round": min(self.step, self.rounds), "step": self.step, "phases_done": list(self.phases_done),
                "phase_results": dict(self.phase_results), "phase_state": to_cpu(self.phase_state),
                "progress": dict(self.progress), "runtime_changes": self.runtime_changes}

    def load_state_dict(self, state: dict) -> None:
        self.step = int(state.get("step", state["round"]))
        self.last_round = int(state["round"])
        self.model_round = self.last_round
        self.start_round = self.last_round + 1
        self.phases_done = list(state.get("phases_done", []))
        self.phase_results = dict(state.get("phase_results", {}))
        self.phase_state = dict(state.get("phase_state", {}))
        self.progress = dict(state["progress"])
        self.runtime_changes = list(state.get("runtime_changes", []))


class GlobalModel:
    """The global model as flat tensors (`params`, `buffers`), with what of it lives in the worker only:
    its integer buffers (BatchNorm's counters), a fixed head's buffers and frozen parameters."""

    def __init__(self, worker):
        self.worker = worker
        self.params = worker.params.detach().clone()
        self.buffers = worker.buffers.detach().clone()
        self.layout = init_from.layout(worker)

    def state_dict(self) -> dict:
        return {"frozen": [t.cpu() for t in self.worker.frozen], "params": self.params.cpu(),
                "buffers": self.buffers.cpu(), "int_buffers": [t.cpu() for t in self.worker._int_snapshot],
                # the names and shapes of these tensors: a later run's model.init_from reads the model by name
                "layout": self.layout}

    def load_state_dict(self, state: dict) -> None:
        self.params.copy_(state["params"])
        self.buffers.copy_(state["buffers"])
        for tensor, saved in zip(self.worker.frozen, state.get("frozen", [])):
            tensor.copy_(saved)
        self.worker._int_snapshot = [t.to(self.params.device) for t in state["int_buffers"]]


class BestModel:
    """eval.finetune_from=best: the evaluated global model (`Algorithm.evaluation_model`) of the best round
    so far by test_acc, which each client fine-tunes before per-client scoring. Checkpointed, so a resumed
    run scores its clients from the same model."""

    def __init__(self, params: torch.Tensor, buffers: torch.Tensor):
        self.params = params.detach().clone()
        self.buffers = buffers.detach().clone()

    def take(self, params: torch.Tensor, buffers: torch.Tensor) -> None:
        self.params.copy_(params)
        self.buffers.copy_(buffers)

    def state_dict(self) -> dict:
        return {"best_params": self.params.cpu(), "best_buffers": self.buffers.cpu()}

    def load_state_dict(self, state: dict) -> None:
        self.params.copy_(state["best_params"])
        self.buffers.copy_(state["best_buffers"])


class MethodState:
    """What the method's server keeps between rounds (`Algorithm.server_state`)."""

    def __init__(self, algorithm):
        self.algorithm = algorithm

    def state_dict(self) -> dict:
        return {"server": to_cpu(self.algorithm.server_state())}

    def load_state_dict(self, state: dict) -> None:
        self.algorithm.load_server_state(state["server"])


class PrivacyState:
    """The privacy mechanism's state (the adaptive clip, the noise's mode); {} without one. A secret noise
    key is written beside state.pt, owner-only, in `directory`: the checkpoint being written or read."""

    def __init__(self, mechanism):
        self.mechanism = mechanism
        self.directory = None

    def state_dict(self) -> dict:
        return {"privacy": self.mechanism.checkpoint(self.directory) if self.mechanism is not None else {}}

    def load_state_dict(self, state: dict) -> None:
        if self.mechanism is not None:
            self.mechanism.load_state_dict(state["privacy"], self.directory)


class SystemState:
    """The virtual clock's state (system.*: distfl/system), under the key "system"; nothing without one."""

    def __init__(self, system):
        self.system = system

    def state_dict(self) -> dict:
        return {"system": self.system.state_dict()} if self.system is not None else {}

    def load_state_dict(self, state: dict) -> None:
        if self.system is not None:
            self.system.load_state_dict(state["system"])


class RunRecord:
    """What the run is (config, data files, world size, runtime): written for a resume to check
    (resume.restore checks it before anything is loaded), never loaded back."""

    def __init__(self, config: dict, data: dict, world_size: int, runtime: dict):
        # Every random draw is keyed by (seed, round, client), so no RNG stream state is needed.
        self.record = {"config": config, "data": data, "world_size": world_size, "runtime": runtime, "rng": "keyed"}

    def state_dict(self) -> dict:
        # the data files' hashes as plain values (waiting here for one still computing: data/digest.py)
        return {**self.record, "data": dict(self.record["data"].items())}

    def load_state_dict(self, state: dict) -> None:
        pass


class Checkpoints:
    """Writing the run's checkpoints: the `parts`' state_dicts (state.pt), the client store's files, and
    the check that every rank holds the same global model. Called on every rank."""

    def __init__(self, run_dir: Path, ctx, parts: list, privacy: PrivacyState, model: GlobalModel, store, keep: int,
                 protected_round: int | None, method_name: str):
        self.run_dir, self.ctx, self.parts, self.privacy, self.model, self.store = run_dir, ctx, parts, privacy, model, store
        self.keep, self.method_name = keep, method_name
        self.protect = (checkpoint.checkpoint_name("round", protected_round),) if protected_round is not None else ()

    def save(self, label: str, step: int) -> None:
        name = checkpoint.checkpoint_name(label, step)
        ctx = self.ctx
        if ctx.is_main:
            checkpoint.begin(self.run_dir, name)
        dist.barrier(ctx)
        written = 0
        if self.store is not None:
            written = self.store.write_checkpoint(checkpoint.staging_dir(self.run_dir, name) / "clients", ctx.is_main)
        # How many client files all ranks wrote: rank 0 refuses a checkpoint that holds fewer. In the same
        # all_reduce, two 24-bit hashes of each rank's global model h and their squares: n * sum(h^2) ==
        # sum(h)^2 only if every rank holds the same h (Cauchy-Schwarz), so ranks that drifted apart (a
        # server step drawing from a per-rank RNG) are caught at the first checkpoint.
        hashes = self._model_hashes()
        sums = dist.all_reduce_sum(torch.tensor([written, *hashes, *(h * h for h in hashes)], dtype=torch.int64,
                                                device=ctx.device), ctx, "checkpoint").tolist()
        clients, n = int(sums[0]), ctx.world_size
        if any(n * sums[3 + i] != sums[1 + i] ** 2 for i in range(len(hashes))):
            if ctx.is_main:
                faults.remove_leftovers(self.run_dir)
            raise RankDisagreement(
                f"the ranks' global models differ at checkpoint {name} (their hashes disagree), so the server step "
                f"did not run identically on every rank; the likely cause: algorithm.name={self.method_name}'s "
                "server_update draws from a per-rank or unseeded RNG (draw from a generator keyed by (seed, round)) or "
                "keeps state computed from something other than the reduced sums (docs/extending.md, \"What the "
                "exactness guarantee asks of a method\"). The checkpoint was not written")
        if ctx.is_main:
            self.privacy.directory = checkpoint.staging_dir(self.run_dir, name)  # a secret key goes beside
            checkpoint.commit(self.run_dir, name, checkpoint.state_of(self.parts), self.keep, self.protect, clients,
                              secret=(NOISE_KEY_FILE,))  # a secret noise key: named in the manifest, never hashed

    def _model_hashes(self) -> list[int]:
        """Two 24-bit hashes of the global model (parameters and buffers), for the check at checkpoints."""
        if self.ctx.world_size == 1:
            return [0, 0]
        fp = dist.fingerprint(self.model.params) ^ dist.fingerprint(self.model.buffers)
        return [fp & 0xFFFFFF, (fp >> 24) & 0xFFFFFF]


@dataclass
class StopFlags:
    requested: bool = False  # a stop signal reached this rank
    agreed: bool = False  # every rank saw a request in the last all_reduce: stop after this round
    interrupts: int = 0  # Ctrl-Cs seen (federation/stopping.py: a second one stops at once)
    launcher: int | None = None  # the pid of the torchrun that started this rank, once training began
    reason: int | None = None  # why this rank was asked to stop (an index of stopping.REASONS)
    reasons: list = field(default_factory=list)  # why the ranks stop, once agreed (stopping.REASONS' texts)


@dataclass(frozen=True)
class RunContext:
    """The run as phases, per-client evaluation and the summary see it. Its fields are never rebound
    (the tensors are the run's own and change in place: a phase may calibrate the global model);
    `state` is the run's progress, `stop` its stop flags, and the functions are the actions they take."""

    cfg: object
    ctx: object  # dist.DistContext
    device: torch.device
    run_dir: Path
    data: object
    data_sources: dict
    eval_sample: object  # eval_sample.EvalSample: the rows of the splits the global model is scored on
    population: object
    client_indices: list
    client_test: list | None
    client_test_x: torch.Tensor | None
    client_test_y: torch.Tensor | None
    worker: object  # the rank's FlatModel
    algorithm: object
    store: object | None  # the client state store
    global_params: torch.Tensor  # the global model (flat), as the rounds and phases leave it
    global_buffers: torch.Tensor
    sticky: bool
    pack_size: int
    pack_step: object | None  # pack.PackStep of packs of two or more (its `graphed`: runtime.cuda_graphs), None at pack_size 1
    system: object | None  # the virtual clock (system.*: distfl/system), None while every system.* key is default
    privacy: object | None  # the Gaussian mechanism, under privacy.mechanism=gaussian
    ledger: object | None
    noise_multiplier: float | None
    state: RunProgress
    stop: StopFlags
    hosts: Callable[[int], bool]  # under sticky placement, whether this rank hosts a client in every round
    client_run: Callable[..., object]  # a client's local.ClientRun, built as the rounds build it (round.py)
    evaluate_round: Callable[[bool], dict]  # test_acc, test_loss (and the per-client statistics) of the global model
    save_phase_checkpoint: Callable[[str, dict], None]  # a long phase's progress, found again in state.phase_state

    def evaluate(self) -> tuple[float, float]:
        """Accuracy and mean loss of the global model on the whole test set."""
        metrics = self.evaluate_round(False)
        return metrics["test_acc"], metrics["test_loss"]

"""A run's directory: claiming it (the lock, a run found there), preparing it, what to tell a user
whose directory already holds a run, and what a resume on another runtime gives up."""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import torch

from .. import checkpoint, dist, faults
from ..config import dump_config
from ..errors import ConfigError
from . import summary
from .stopping import resume_command


def run_has_output(run_dir: Path) -> bool:
    return any((run_dir / name).exists() for name in ("summary.json", "metrics.jsonl", "checkpoints"))


class RunDirectory:
    """The run's directory as this rank sees it: its path, whether --overwrite was given, and (rank 0)
    the lock on it, held until `close` or the process's end: a second run there is refused."""

    def __init__(self, path: Path, ctx, overwrite: bool):
        self.path, self.ctx, self.overwrite = path, ctx, overwrite
        # Before any work if the directory exists (else once `claim` creates it).
        self.lock = checkpoint.lock_run_dir(path) if ctx.is_main and path.is_dir() else None

    def claim(self, resume: bool) -> bool:
        """Rank 0 takes the lock, then looks for a run in the directory: the look before the data
        loaded is not enough, since another run may have started and finished there meanwhile. Every
        rank learns its answer (one small all_reduce, also the barrier before --overwrite deletes).
        Returns whether the old output is to be deleted (--overwrite)."""
        found = False
        if self.ctx.is_main:
            with faults.run_dir_errors(self.path):
                self.path.mkdir(parents=True, exist_ok=True)
                self.lock = self.lock or checkpoint.lock_run_dir(self.path)
            found = not resume and run_has_output(self.path)
        flags = torch.tensor([int(found), int(found and not self.overwrite)], dtype=torch.int64, device=self.ctx.device)
        found, refused = (int(v) for v in dist.all_reduce_sum(flags, self.ctx, "check"))
        if refused:
            raise ConfigError(
                f"output.dir {self.path} already holds a run (another distfl run wrote it while this one "
                f"was starting); {next_step(self.path)}")
        return bool(found)

    def prepare(self, cfg, store, resumed_from: str | None, skipped: list) -> None:
        """Claim the directory (`claim`), clear it under --overwrite, and write the config, once the data,
        partition, model and checkpoint are known good. `resumed_from`: the checkpoint a resume loaded
        (None: a new run); `skipped`: the newer checkpoints it passed over, set aside."""
        resume = resumed_from is not None
        clear = self.claim(resume)
        if self.ctx.is_main:
            if clear:  # --overwrite was given
                for name in ("summary.json", "metrics.jsonl", "checkpoints", "tb", "client_state", "trackers.json", "wandb",
                             "clients.csv"):
                    path = self.path / name
                    shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
            faults.remove_leftovers(self.path)
            if resume:
                # From here this session trains: an earlier session's summary.json no longer says how it stands.
                summary.mark_running(self.path, cfg.train.rounds, resume_command(self.path, self.ctx.world_size))
                restored = checkpoint.restore_metrics(self.path, checkpoint.checkpoints_dir(self.path) / resumed_from)
                if restored:
                    print(restored, file=sys.stderr, flush=True)
            if store is not None:
                store.create()
            config_text, saved = dump_config(cfg), self.path / "config.yaml"
            if not (resume and saved.is_file() and saved.read_text() == config_text):  # nothing to write on a full disk
                checkpoint.atomic_write_text(config_text, saved)
        dist.barrier(self.ctx)
        if self.ctx.is_main and skipped:
            checkpoint.set_aside(self.path, [name for name, _ in skipped], resumed_from)

    def close(self) -> None:
        """Release the lock."""
        if self.lock is not None:
            self.lock.close()
            self.lock = None


def next_step(run_dir: Path) -> str:
    """What to do with a directory that holds a run: continue it from its checkpoint, or (none yet)
    start it over."""
    if checkpoint.finished_run(run_dir):
        return checkpoint.finished_run(run_dir)
    if checkpoint.complete_checkpoints(run_dir):
        return f"continue it with `distfl train --resume {run_dir}`, pick another output.dir, or pass --overwrite"
    return ("it stopped before its first checkpoint, so there is nothing to resume: start it over with --overwrite "
            f"(or `distfl train --resume {run_dir}`, which does the same from its saved config), or pick another "
            "output.dir")


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
    return status in ("failed", "stopped", "running")  # not finished, and nothing checkpointed to continue


def lost_guarantees(saved: dict | None, now: dict) -> list[str]:
    """Warnings for a resume whose runtime differs from the checkpoint's: the run goes on, but is no
    longer bit-identical to one that ran through."""
    if saved is None:  # a checkpoint from before distfl recorded its runtime
        return []
    why = {"device": "kernels differ between device types",
           "threads": "intra-op threads change a kernel's reduction order",
           "deterministic": "nondeterministic kernels may now run",
           "torch": "kernels differ between torch builds",
           "pack_size": "a pack trains as one vectorised model, equal to its clients one at a time only up to "
                        "float rounding"}
    return [f"runtime {key} was {saved[key]} when checkpointed and is {now[key]} now; {why[key]}, so this run is "
            "no longer bit-identical to one run through without the stop (nor reproducible from its config)"
            for key in why if key in saved and saved[key] != now[key]]

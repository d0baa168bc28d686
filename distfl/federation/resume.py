"""Resuming a run: which checkpoint, and whether the run may continue from it (the same data, only
resumable keys changed, phases not yet begun with other settings), then its state loaded."""
from __future__ import annotations

from .. import checkpoint, dist
from ..config import config_to_dict, flatten_dict
from ..config.resume import (HOLDOUT_KEYS, PHASE_KEYS, RESUMABLE_KEYS, predated_keys_hint, resume_blockers,
                             saved_values)
from ..errors import CheckpointError
from . import run_dir


def resume_lines(trainer) -> list[str]:
    """What a resumed run says first: checkpoints skipped, where it resumes, guarantees it loses."""
    lines = [f"skipped checkpoint {name}: {why}" for name, why in trainer.skipped]
    if trainer.skipped:
        lines.append(f"resuming from {trainer.resumed_from}, the newest good checkpoint")
    rounds, start = trainer.cfg.train.rounds, trainer.state.start_round
    if start > rounds:
        lines.append(f"resuming {trainer.run_dir} after training ({rounds} rounds), at its phases")
    elif start > 1:
        lines.append(f"resuming {trainer.run_dir} at round {start}")
    return lines + [f"warning: {warning}" for warning in trainer.resume_warnings]


def restore(trainer) -> None:
    """Load the newest good checkpoint of `trainer`'s run directory into it, after checking that it may
    continue: the same checkpoint on every rank, the same data, only resumable keys changed, its phases."""
    path, state, skipped = checkpoint.newest_good(trainer.run_dir, trainer.device)
    # Every rank must resume from the same checkpoint (they differ if output.dir is not shared).
    dist.check_same_on_all_ranks(int(state.get("step", state["round"])), trainer.ctx, "the checkpoint resumed from")
    trainer.resumed_from, trainer.skipped = path.name, skipped
    check_data(trainer, state.get("data"))
    changed = resume_blockers(state["config"], config_to_dict(trainer.cfg))
    if changed:
        raise CheckpointError(
            f"cannot resume {trainer.run_dir}: {', '.join(changed)} differ from the checkpointed run"
            f"{predated_keys_hint(changed)}; "
            f"only {', '.join(RESUMABLE_KEYS)} may change on resume (not {', '.join(HOLDOUT_KEYS)}: "
            "they decide the clients' training data)")
    check_phases(trainer, state)
    trainer.resume_warnings = run_dir.lost_guarantees(state.get("runtime"), trainer.runtime_identity())
    trainer.privacy_state.directory = path  # where a secret noise key was written
    checkpoint.load_state(trainer.checkpointed, state)
    if trainer.resume_warnings:
        trainer.state.runtime_changes.append({"after_round": int(state["round"]), "was": state["runtime"],
                                           "now": trainer.runtime_identity()})
    for phase in trainer.phases:
        if phase.name in trainer.state.phases_done:
            phase.restore(trainer.context)
    if trainer.store is not None:
        trainer.store.restore(path / "clients", trainer.hosts, trainer.ctx.is_main)


def check_data(trainer, saved: dict | None) -> None:
    """Refuse to continue on data or a partition file whose bytes differ from what the run began
    with (a checkpoint from before distfl recorded them has None: nothing to compare)."""
    for role, was in (saved or {}).items():
        now = trainer.data_sources.get(role)
        if now is None or now["sha256"] != was["sha256"]:
            now_text = f"{now['sha256']} now" if now is not None else "not read now"
            weights = role == "model.init_from"  # the saved weights the run started from
            raise CheckpointError(
                f"cannot resume {trainer.run_dir}: {role} {(now or was)['path']} changed since the run started "
                f"(SHA-256 {was['sha256']} when checkpointed, {now_text}); continuing would train on other "
                f"{'weights' if weights else 'data'} than the rounds before. Restore the original file, or "
                f"start a new run {'from these weights' if weights else 'on this data'} (another output.dir)")


def check_phases(trainer, state: dict) -> None:
    trained, rounds = state["round"], trainer.cfg.train.rounds
    done = list(state.get("phases_done", []))
    names = [p.name for p in trainer.phases]
    started = done + ([state["phase_state"]["phase"]] if state.get("phase_state") else [])
    if started:
        saved = saved_values(state["config"])
        now = {k: v for k, v in flatten_dict(config_to_dict(trainer.cfg)).items() if k.startswith(PHASE_KEYS)}
        changed = [k for k, v in now.items() if saved.get(k) != v]
        if changed or any(n not in names for n in done):
            raise CheckpointError(
                f"{trainer.run_dir} already began {', '.join(started)} after training, with the settings it was "
                f"started with, so {', '.join(changed) or 'its phases'} cannot change now. Start a new run (or copy "
                "the run directory and resume the copy from the checkpoint of the last training round)")
        if rounds > trained:
            raise CheckpointError(
                f"{trainer.run_dir} already ran {', '.join(done)} after round {trained}; it cannot train further")
    pending = [n for n in names if n not in done]
    if trained >= rounds and not pending:
        if names:
            raise CheckpointError(f"{trainer.run_dir} is complete: {trained} rounds and {', '.join(done)}; "
                                  "nothing to resume")
        raise CheckpointError(f"{trainer.run_dir} is already at round {trained}; "
                              f"raise train.rounds (e.g. train.rounds={trained + 10}) to continue")


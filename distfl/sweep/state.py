"""The state of a point's run directory, and the `distfl train` arguments that take it from there.

A point is new, overwrite (partial output, no checkpoint), resume (a checkpoint), completed or
diverged; on Slurm also queued (its job from an earlier submission is still there).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from ..config import flatten_dict
from ..config.resume import predated_keys_hint, resume_blockers, saved_values
from ..errors import ConfigError

FINISHED = ("completed", "diverged")
SKIPPED = (*FINISHED, "queued")  # queued: its Slurm job from an earlier submission is still there


def read_summary(run_dir: Path) -> dict | None:
    try:
        return json.loads((Path(run_dir) / "summary.json").read_text())
    except (OSError, ValueError):
        return None


def _has_output(run_dir: Path) -> bool:
    return any((run_dir / n).exists() for n in ("summary.json", "metrics.jsonl", "checkpoints"))


def point_state(run_dir: Path, config: dict) -> str:
    """new | overwrite | resume | completed | diverged, for running `config` in `run_dir`.

    Refuses (ConfigError) a directory that holds a different run: only keys that `--resume` may
    change (train.rounds, eval.*, checkpoint.*, ...) may differ from its config.yaml.
    """
    run_dir = Path(run_dir)
    saved_path = run_dir / "config.yaml"
    if saved_path.exists():
        import yaml

        saved_config = yaml.safe_load(saved_path.read_text()) or {}
        changed = resume_blockers(saved_config, config)
        if changed:
            saved, now = saved_values(saved_config), flatten_dict(config)
            shown = ", ".join(f"{k} ({saved.get(k)!r} there, {now[k]!r} now)" for k in changed[:4])
            raise ConfigError(f"{run_dir} holds a different run: {shown}{predated_keys_hint(changed)}. Use another "
                              "output.dir for this sweep, or delete that directory to redo it")
    summary = read_summary(run_dir)
    if summary is not None:
        if summary.get("status") == "diverged":
            return "diverged"
        if summary.get("status") == "completed" and (summary.get("rounds") or 0) >= config["train"]["rounds"]:
            return "completed"
    # `latest` may be missing (a kill between a checkpoint's rename and its update): any checkpoint
    # directory (LABEL_STEP; not .NAME.partial or .NAME.bad) makes the point resumable, never overwritten.
    if (run_dir / "checkpoints" / "latest").exists() or any(
            p.is_dir() and p.name.rpartition("_")[2].isdigit() for p in (run_dir / "checkpoints").glob("*_[0-9]*")):
        return "resume"
    return "overwrite" if _has_output(run_dir) else "new"


def value_text(value, where: str) -> str:
    """A YAML scalar as override text: `load_config` parses it back to the same value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return repr(value) if isinstance(value, float) else str(value)
    raise ConfigError(f"{where}: grid values must be scalars (number, string, true/false), got {value!r}")


def train_args(run_dir: Path, config: dict, state: str, config_path: str, overrides: list[str]) -> list[str]:
    """Arguments of `distfl train` that start, restart or continue this run (state: see point_state)."""
    if state == "resume":
        import yaml

        saved = flatten_dict(yaml.safe_load((Path(run_dir) / "config.yaml").read_text()) or {})
        # Only resumable keys can differ here (point_state checked); pass the ones that do.
        changed = [f"{k}={value_text(v, k)}" for k, v in flatten_dict(config).items()
                   if k != "output.dir" and saved.get(k) != v]
        return ["--resume", str(run_dir), *changed]
    args = [str(config_path), *overrides, f"output.dir={run_dir}"]
    return args + ["--overwrite"] if state == "overwrite" else args


def runs_text(sweep) -> str:  # sweep: a plan.Sweep
    """The "N runs in SWEEP_DIR, F already finished" of the progress lines, and the points left to
    their Slurm jobs from an earlier submission."""
    finished = sum(p.state in FINISHED for p in sweep.points)
    queued = [p for p in sweep.points if p.state == "queued"]
    text = f"{len(sweep.points)} runs in {sweep.sweep_dir}, {finished} already finished"
    if queued:
        text += (f", {len(queued)} still queued or running on Slurm (left alone: "
                 f"{', '.join(f'{p.name} as job {p.job_id}' for p in queued)})")
    return text


def _how_far(run_dir: Path) -> str:
    """" (stopped at round 26 of 200)": how far an unfinished point's summary.json says it got; "" without one."""
    summary = read_summary(run_dir) or {}
    if summary.get("status") not in ("stopped", "failed", "running") or summary.get("round_reached") is None:
        return ""
    return f" ({summary['status']} at round {summary['round_reached']} of {summary.get('train_rounds')})"


def final_report(sweep, out=None, failed=()) -> int:  # sweep: a plan.Sweep
    out = out or sys.stdout
    states = {p.name: point_state(p.run_dir, p.config) for p in sweep.points}
    done = [n for n, s in states.items() if s == "completed"]
    diverged = [n for n, s in states.items() if s == "diverged"]
    unfinished = [p.name + _how_far(p.run_dir) for p in sweep.points if states[p.name] not in FINISHED]
    print(f"distfl sweep: {len(done)}/{len(states)} completed in {sweep.sweep_dir}"
          + (f"; diverged: {', '.join(diverged)}" if diverged else "")
          + (f"; unfinished: {', '.join(unfinished)}" if unfinished else ""), file=out, flush=True)
    if failed:
        print(f"distfl sweep: failed: {', '.join(failed)}", file=out, flush=True)
    print(f"distfl sweep: summarise with `distfl report {sweep.sweep_dir}`", file=out, flush=True)
    return 0 if len(done) == len(states) else 1

"""The entry points: `run_sweep` (what `distfl sweep` calls) and `python -m distfl.sweep train-args`
(what slurm/train.sbatch asks before it starts a run)."""
from __future__ import annotations

import sys
from pathlib import Path

from ..config import config_to_dict, load_config
from ..errors import DistflError
from .grid import build_sweep, write_sweep_file
from .local import local_command, run_local
from .slurm import submit_slurm, wait_for_jobs
from .state import FINISHED, SKIPPED, final_report, point_state, train_args


def run_sweep(config_path: str, fixed=(), grid_args=(), seeds_arg=None, executor=None, nproc=None,
              slurm_args=None, wait: bool = False, dry_run: bool = False, out=None, points_arg=None,
              zip_args=()) -> int:
    out = out or sys.stdout
    sweep = build_sweep(config_path, fixed, grid_args, seeds_arg, executor, nproc, slurm_args, points_arg, zip_args)
    if dry_run:
        print(f"distfl sweep (dry run): {len(sweep.points)} runs in {sweep.sweep_dir}, executor {sweep.executor}",
              file=out)
        for p in sweep.points:
            line = f"  {p.state:>9}  {p.name}"
            if sweep.executor == "local" and p.state not in SKIPPED:
                line += "\n             " + " ".join(local_command(sweep, p))
            print(line, file=out)
        if sweep.executor == "slurm":
            print(f"  Slurm: {', '.join(f'{k}={v}' for k, v in sweep.slurm.items() if v is not None)}", file=out)
        return 0
    if sweep.executor == "local":
        write_sweep_file(sweep)
        return run_local(sweep, out)
    submit_slurm(sweep, out)
    write_sweep_file(sweep)
    if not wait:
        return 0
    waiting = [p.job_id for p in sweep.points if p.job_id]  # submitted now, or still queued from before
    if waiting:
        print("distfl sweep: waiting for the jobs to finish (--wait)", file=out, flush=True)
        wait_for_jobs(waiting)
    return final_report(sweep, out)


def train_args_main(argv: list[str]) -> int:
    """`python -m distfl.sweep train-args CONFIG [key=value ...]`: for slurm/train.sbatch, the arguments
    of `distfl train` that start, continue (--resume) or restart this run, one per line; nothing when
    the run has finished."""
    if len(argv) < 2 or argv[0] != "train-args":
        print("usage: python -m distfl.sweep train-args CONFIG [key=value ...]", file=sys.stderr)
        return 2
    config_path, overrides = argv[1], argv[2:]
    try:
        cfg = load_config(config_path, overrides)
        run_dir = Path(cfg.output.dir).resolve()
        overrides = [o for o in overrides if not o.startswith("output.dir=")]
        config = config_to_dict(load_config(config_path, [*overrides, f"output.dir={run_dir}"]))
        state = point_state(run_dir, config)
    except DistflError as exc:
        print(f"distfl: error: {exc}", file=sys.stderr)
        return 2
    if state in FINISHED:
        print(f"distfl: {run_dir} has finished ({state}); nothing to do", file=sys.stderr)
        return 0
    print("\n".join(train_args(run_dir, config, state, config_path, overrides)))
    return 0

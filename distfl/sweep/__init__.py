"""`distfl sweep`: a grid of configs x seeds, run here one after another or on Slurm through submitit.

A sweep is a base config, fixed overrides, a grid (key -> values) and seeds. Each combination is a
*point*, one ordinary run whose directory is named after its overrides:

    SWEEP_DIR/algorithm.name=scaffold,partition.alpha=0.1/seed=0

(SWEEP_DIR is the base config's output.dir; grid keys in alphabetical order; characters other than
letters, digits and `._+-` in values become `_`). Running the same sweep again skips the points
that finished (summary.json) and resumes the others from their last checkpoint, so a crashed or
cancelled sweep is continued by submitting it again.

On Slurm every point is one job of nodes x tasks_per_node ranks (one task per rank; the rendezvous
comes from the Slurm environment, `distfl.dist.slurm_environment`), and the points of one submission
form one job array. A job that is preempted, requeued (`scontrol requeue`) or reaches its time limit
checkpoints after the round that all ranks agree on and continues from that checkpoint in its next
allocation: see `SweepJob` (slurm.py) and docs/sweeps.md.

Everything is checked (grid keys, every point's config, Slurm options, that Slurm is there, that an
existing run directory holds the same run) before anything is written or submitted.

The modules, in the order a sweep uses them:

    grid.py       the sweep description: grid, seeds, points and their run directory names; sweep.json
    state.py      a run directory's state (new, resume, completed, ...) and the `distfl train` arguments for it
    local.py      --executor local: the points one after another, here or under torchrun
    slurm.py      --executor slurm: Slurm options, submission through submitit, SweepJob, squeue
    inprocess.py  one point trained in this process, stopped by signals (local one-rank runs, Slurm tasks)
    cli.py        run_sweep (what `distfl sweep` calls) and `python -m distfl.sweep train-args`
"""
from .cli import run_sweep, train_args_main
from .grid import (EXECUTORS, SWEEP_FILE, SWEEP_KEYS, Point, Sweep, build_sweep, parse_grid_arg, parse_seeds,
                   write_sweep_file)
from .local import local_command, run_local
from .slurm import (LOGS_DIR, SLURM_OPTIONS, SweepJob, check_slurm_options, make_executor, parse_slurm_arg,
                    slurm_active_jobs, submit_slurm, wait_for_jobs)
from .state import FINISHED, SKIPPED, point_state, read_summary, train_args

__all__ = [
    "EXECUTORS", "FINISHED", "LOGS_DIR", "SKIPPED", "SLURM_OPTIONS", "SWEEP_FILE", "SWEEP_KEYS", "Point", "Sweep",
    "SweepJob", "build_sweep", "check_slurm_options", "local_command", "make_executor", "parse_grid_arg",
    "parse_seeds", "parse_slurm_arg", "point_state", "read_summary", "run_local", "run_sweep", "slurm_active_jobs",
    "submit_slurm", "train_args", "train_args_main", "wait_for_jobs", "write_sweep_file",
]

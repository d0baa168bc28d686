"""What a sweep is once expanded: its points (config, run directory, state) and its settings. Built by
grid.py, run by local.py and slurm.py, recorded by state.py."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .state import SKIPPED


@dataclass
class Point:
    name: str  # run directory relative to the sweep directory: "k=v,k=v/seed=S"
    overrides: list[str]  # what makes this point: grid overrides and seed=S
    run_dir: Path
    config: dict  # the resolved config (config_to_dict), output.dir = run_dir
    state: str = "new"  # new | overwrite (partial output, no checkpoint) | resume | completed | diverged
    job_id: str | None = None


@dataclass
class Sweep:
    config_path: str
    fixed: list[str]  # overrides applied to every point
    grid: dict[str, list[str]]  # key -> value texts, as override text
    seeds: list[int]
    executor: str
    nproc: int
    slurm: dict
    sweep_dir: Path
    points: list[Point] = field(default_factory=list)
    # listed points (--points FILE, --zip, `points:`/`zip:` of the sweep block): each a dict of key ->
    # value text; the grid's product is taken with each of them
    listed: list[dict[str, str]] = field(default_factory=list)

    @property
    def swept_keys(self) -> list[str]:
        return sorted(set(self.grid).union(*self.listed))

    @property
    def todo(self) -> list[Point]:
        """The points to run or submit: those not finished and with no job still queued on Slurm."""
        return [p for p in self.points if p.state not in SKIPPED]

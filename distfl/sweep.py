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
allocation: see `SweepJob` and docs/sweeps.md.

Everything is checked (grid keys, every point's config, Slurm options, that Slurm is there, that an
existing run directory holds the same run) before anything is written or submitted.
"""
from __future__ import annotations

import difflib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .config import OPTIONS_KEY, config_keys, config_to_dict, flatten_dict, load_config, load_sweep_block
from .errors import ConfigError, DistflError, Interrupted

try:  # submitit is a dependency; without it only the Slurm executor is unavailable
    import submitit
    from submitit.helpers import Checkpointable as _JobBase
except ImportError:  # pragma: no cover
    submitit = None
    _JobBase = object

EXECUTORS = ("local", "slurm")
SWEEP_KEYS = ("grid", "seeds", "executor", "nproc", "slurm")
SWEEP_FILE = "sweep.json"
LOGS_DIR = "slurm-logs"
SAFE = re.compile(r"[^A-Za-z0-9._+\-]")

# name -> (type, default, what it is). The names are those of the `sweep.slurm` block and `--slurm KEY=VALUE`.
SLURM_OPTIONS = {
    "partition": (str, None, "partition (queue) to submit to; the cluster's default if unset"),
    "time": ("time", 60, "time limit of each job: minutes, or [D-]HH:MM[:SS]"),
    "nodes": (int, 1, "nodes per run"),
    "tasks_per_node": (int, 1, "ranks per node (one Slurm task per rank); world size = nodes x tasks_per_node"),
    "gpus_per_node": (int, 0, "GPUs per node (0: none requested)"),
    "cpus_per_task": (int, 1, "CPU cores per rank"),
    "mem_gb": (float, None, "memory per node in GB (the cluster's default if unset)"),
    "account": (str, None, "account to charge"),
    "qos": (str, None, "quality of service"),
    "constraint": (str, None, "node features, e.g. a100"),
    "job_name": (str, "distfl", "job name shown by squeue"),
    "array_parallelism": (int, 64, "at most this many points of one submission run at a time"),
    "signal_delay_s": (int, 120, "USR2 this many seconds before the time limit: checkpoint and requeue"),
    "max_requeues": (int, 10, "a job requeues itself after a time limit at most this many times"),
    "setup": (list, None, "shell lines run before the ranks start, e.g. ['module load cuda']"),
    "additional": (dict, None, "raw sbatch options, e.g. {exclusive: true, reservation: x}"),
}
# Slurm option -> submitit AutoExecutor parameter
_SUBMITIT_NAMES = {
    "partition": "slurm_partition", "time": "timeout_min", "nodes": "nodes", "tasks_per_node": "tasks_per_node",
    "gpus_per_node": "gpus_per_node", "cpus_per_task": "cpus_per_task", "mem_gb": "mem_gb",
    "account": "slurm_account", "qos": "slurm_qos", "constraint": "slurm_constraint", "job_name": "name",
    "array_parallelism": "slurm_array_parallelism", "signal_delay_s": "slurm_signal_delay_s",
    "setup": "slurm_setup", "additional": "slurm_additional_parameters",
}


# --- the sweep description ----------------------------------------------------------------------

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

    @property
    def swept_keys(self) -> list[str]:
        return sorted(self.grid)


def _value_text(value, where: str) -> str:
    """A YAML scalar as override text: `load_config` parses it back to the same value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return repr(value) if isinstance(value, float) else str(value)
    raise ConfigError(f"{where}: grid values must be scalars (number, string, true/false), got {value!r}")


def _check_grid_key(key: str, where: str) -> None:
    keys = config_keys()
    if key.startswith(OPTIONS_KEY + ".") and key != OPTIONS_KEY + ".":
        return  # a plugin method's option: each point's config checks it against the method's Options
    if key in keys:
        if key == "seed":
            raise ConfigError(f"{where}: give seeds with --seeds 0,1,2 (or `seeds:` in the sweep block), "
                              "not as a grid key; each seed gets its own seed=S directory")
        if key == "output.dir":
            raise ConfigError(f"{where}: output.dir cannot be swept; it is the sweep directory, and each "
                              "point's run directory is named after its overrides")
        return
    close = difflib.get_close_matches(key, keys, n=1, cutoff=0.5)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise ConfigError(f"{where}: {key!r} is not a config key{hint} (every key is listed in docs/config.md)")


def parse_grid_arg(item: str) -> tuple[str, list[str]]:
    """`--grid key=v1,v2` -> (key, ["v1", "v2"])."""
    key, sep, text = item.partition("=")
    key = key.strip()
    values = [v.strip() for v in text.split(",")]
    if not sep or not key or not text.strip() or any(v == "" for v in values):
        raise ConfigError(f"--grid {item!r}: expected KEY=V1,V2,... e.g. --grid algorithm.name=fedavg,scaffold")
    _check_grid_key(key, f"--grid {item!r}")
    return key, values


def _grid_from_block(grid, where: str) -> dict[str, list[str]]:
    if not isinstance(grid, dict):
        raise ConfigError(f"{where} must be a mapping of config keys to lists of values, "
                          f"e.g. {{algorithm.name: [fedavg, scaffold]}}; got {grid!r}")
    out = {}
    for key, values in flatten_dict(grid).items():
        _check_grid_key(key, f"{where}.{key}")
        if not isinstance(values, list):
            values = [values]
        if not values:
            raise ConfigError(f"{where}.{key}: the list of values is empty")
        out[key] = [_value_text(v, f"{where}.{key}") for v in values]
    return out


def parse_seeds(value, where: str = "--seeds") -> list[int]:
    """"0,1,2", "0-4", [0, 1, 2] or 3 -> a list of distinct non-negative ints, in order."""
    items = value if isinstance(value, list) else [value] if isinstance(value, int) else str(value).split(",")
    seeds = []
    for item in items:
        text = str(item).strip()
        lo, dash, hi = text.partition("-")
        try:
            if isinstance(item, bool):
                raise ValueError
            chunk = list(range(int(lo), int(hi) + 1)) if dash and lo else [int(text)]
        except ValueError:
            raise ConfigError(f"{where}: {value!r} is not a list of seeds; expected e.g. 0,1,2 or 0-4") from None
        seeds += chunk
    if not seeds or any(s < 0 for s in seeds):
        raise ConfigError(f"{where}: {value!r}: seeds must be non-negative integers, e.g. 0,1,2")
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"{where}: {value!r} repeats a seed")
    return seeds


def _parse_time(value, where: str) -> int:
    """Minutes from 90, "90", "01:30:00", "1-00:00:00" or "30:00" (MM:SS, as sbatch reads it)."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    text = str(value).strip()
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text)
    if m and not isinstance(value, bool):
        days, a, b, c = m.groups()
        if days is None and b is None:
            minutes = int(a)
        elif days is None and c is None:
            minutes = int(a) + (int(b) > 0)  # MM:SS, rounded up to a minute
        else:
            hours, mins, secs = int(a), int(b or 0), int(c or 0)
            minutes = int(days or 0) * 1440 + hours * 60 + mins + (secs > 0)
        if minutes > 0:
            return minutes
    raise ConfigError(f"{where}: {value!r} is not a time limit; give minutes (90) or [D-]HH:MM[:SS] (01:30:00)")


def check_slurm_options(options: dict, where: str) -> dict:
    """Validate a mapping of Slurm options (names of SLURM_OPTIONS); return it typed."""
    out = {}
    for name, value in options.items():
        name = str(name).replace("-", "_")
        if name not in SLURM_OPTIONS:
            close = difflib.get_close_matches(name, list(SLURM_OPTIONS), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ConfigError(f"{where}: unknown Slurm option {name!r}; {hint}valid: {', '.join(SLURM_OPTIONS)} "
                              "(any other sbatch option goes in `additional`, e.g. --slurm additional.exclusive=true)")
        typ = SLURM_OPTIONS[name][0]
        bad = ConfigError(f"{where}: Slurm option {name} must be {getattr(typ, '__name__', typ)}, got {value!r}")
        if value is None:
            out[name] = None
        elif typ == "time":
            out[name] = _parse_time(value, f"{where}: Slurm option time")
        elif typ is int:
            if isinstance(value, str) and value.strip().isdigit():
                value = int(value)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise bad
            if value == 0 and name not in ("gpus_per_node", "max_requeues"):
                raise ConfigError(f"{where}: Slurm option {name} must be at least 1, got 0")
            out[name] = value
        elif typ is float:
            try:
                out[name] = float(value)
            except (TypeError, ValueError):
                raise bad from None
        elif typ is str:
            if isinstance(value, (dict, list)):
                raise bad
            out[name] = str(value)
        elif typ is list:
            out[name] = [str(v) for v in (value if isinstance(value, list) else [value])]
        elif typ is dict:
            if not isinstance(value, dict):
                raise bad
            out[name] = {str(k).replace("_", "-"): v for k, v in value.items()}
    return out


def parse_slurm_arg(item: str) -> dict:
    """`--slurm KEY=VALUE` (KEY a Slurm option, or additional.SBATCH_OPTION) -> {KEY: VALUE}."""
    import yaml

    key, sep, text = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"--slurm {item!r}: expected KEY=VALUE, e.g. --slurm partition=gpu")
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        value = text
    if key.startswith("additional."):
        return {"additional": {key.split(".", 1)[1]: value}}
    if key in ("partition", "account", "qos", "constraint", "job_name"):
        value = text
    return {key: value}


def build_sweep(config_path: str, fixed=(), grid_args=(), seeds_arg=None, executor=None, nproc=None,
                slurm_args: dict | None = None) -> Sweep:
    """Everything the sweep will do, checked, with nothing written: grid x seeds points and their state."""
    block = load_sweep_block(config_path)
    unknown = [k for k in block if k not in SWEEP_KEYS]
    if unknown:
        close = difflib.get_close_matches(str(unknown[0]), SWEEP_KEYS, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ConfigError(f"sweep.{unknown[0]} in {config_path}: unknown key; {hint}valid: {', '.join(SWEEP_KEYS)}")
    grid = _grid_from_block(block["grid"], f"sweep.grid in {config_path}") if block.get("grid") is not None else {}
    for item in grid_args:
        key, values = parse_grid_arg(item)
        grid[key] = values
    for key, values in grid.items():
        if len(set(values)) != len(values):
            raise ConfigError(f"grid {key}: {', '.join(values)} repeats a value")

    executor = executor or block.get("executor") or "local"
    if executor not in EXECUTORS:
        raise ConfigError(f"executor {executor!r}: valid: {', '.join(EXECUTORS)}")
    block_nproc = block.get("nproc", 1)
    nproc = nproc if nproc is not None else block_nproc
    if not isinstance(nproc, int) or isinstance(nproc, bool) or nproc < 1:
        raise ConfigError(f"nproc must be a positive integer (ranks per local run), got {nproc!r}")
    if executor == "slurm" and nproc != 1:
        raise ConfigError("--nproc is for --executor local; on Slurm the ranks of a run are "
                          "nodes x tasks_per_node (--nodes, --tasks-per-node)")
    slurm_block = block.get("slurm") or {}
    if not isinstance(slurm_block, dict):
        raise ConfigError(f"sweep.slurm in {config_path} must be a mapping of Slurm options, got {slurm_block!r}")
    slurm = {name: spec[1] for name, spec in SLURM_OPTIONS.items()}
    slurm.update(check_slurm_options(slurm_block, f"sweep.slurm in {config_path}"))
    cli_slurm = check_slurm_options(slurm_args or {}, "command line")
    if "additional" in cli_slurm and slurm.get("additional"):
        cli_slurm["additional"] = {**slurm["additional"], **cli_slurm["additional"]}
    slurm.update(cli_slurm)

    seeds_value = seeds_arg if seeds_arg is not None else block.get("seeds")
    base = load_config(config_path, list(fixed))
    seeds = parse_seeds(seeds_value, "--seeds" if seeds_arg is not None else "sweep.seeds") \
        if seeds_value is not None else [base.seed]
    if executor == "slurm":
        _check_slurm_available()

    sweep_dir = Path(base.output.dir).resolve()
    sweep = Sweep(config_path, list(fixed), grid, seeds, executor, nproc, slurm, sweep_dir)
    keys = sorted(grid)
    combos = [[]]
    for key in keys:
        combos = [c + [f"{key}={v}"] for c in combos for v in grid[key]]
    seen_names, seen_configs = {}, {}
    for combo in combos:
        prefix = ",".join(_safe_part(o) for o in combo)
        if len(prefix) > 200:  # many keys: one path component must stay under 255 bytes
            import hashlib

            prefix = prefix[:180] + "-" + hashlib.sha256(",".join(combo).encode()).hexdigest()[:12]
        for seed in seeds:
            name = f"{prefix}/seed={seed}" if prefix else f"seed={seed}"
            run_dir = sweep_dir / name
            overrides = [*combo, f"seed={seed}"]
            try:
                cfg = load_config(config_path, [*fixed, *overrides, f"output.dir={run_dir}"])
            except ConfigError as exc:
                raise ConfigError(f"sweep point {name}: {exc}") from None
            d = config_to_dict(cfg)
            fingerprint = json.dumps({**d, "output": None}, sort_keys=True)
            if name in seen_names:
                raise ConfigError(f"sweep points {' '.join(seen_names[name])} and {' '.join(overrides)} get "
                                  f"the same directory name {name!r}; use values that differ in letters or digits")
            if fingerprint in seen_configs:
                raise ConfigError(f"sweep points {seen_configs[fingerprint]} and {name} are the same run "
                                  "(their values parse to the same config)")
            seen_names[name], seen_configs[fingerprint] = overrides, name
            sweep.points.append(Point(name, overrides, run_dir, d))
    for point in sweep.points:
        point.state = point_state(point.run_dir, point.config)
    _mark_queued(sweep)
    return sweep


def _mark_queued(sweep: Sweep) -> None:
    """Points whose job from an earlier submission is still queued or running get state "queued": a
    second job (or a local run) on the same run directory would write over the first."""
    try:
        record = json.loads((sweep.sweep_dir / SWEEP_FILE).read_text())
    except (OSError, ValueError):
        return
    previous = {p.get("name"): p.get("job_id") for p in record.get("points", []) if p.get("job_id")}
    unfinished = [p for p in sweep.points if p.state not in FINISHED and previous.get(p.name)]
    if not unfinished or shutil.which("squeue") is None:
        return
    try:
        active = slurm_active_jobs()
    except (DistflError, OSError, subprocess.SubprocessError):
        return
    for point in unfinished:
        if previous[point.name] in active:
            point.state, point.job_id = "queued", previous[point.name]


def _safe_part(override: str) -> str:
    key, _, value = override.partition("=")
    text = f"{key}={SAFE.sub('_', value)}"
    if len(text) > 120:  # keep path components well under the 255-byte limit
        import hashlib

        text = text[:100] + "-" + hashlib.sha256(override.encode()).hexdigest()[:12]
    return text


def _check_slurm_available() -> None:
    missing = [tool for tool in ("sbatch", "srun", "squeue") if shutil.which(tool) is None]
    if missing:
        raise ConfigError(
            f"--executor slurm: {', '.join(missing)} not found on PATH, so this machine cannot submit Slurm jobs. "
            "Run the sweep on the cluster's login node, use --executor local, or start a one-node Slurm "
            "here with `sudo slurm/dev-cluster.sh start` (docs/sweeps.md)")
    if submitit is None:
        raise ConfigError("--executor slurm needs the submitit package: pip install submitit")


# --- the state of a run directory ----------------------------------------------------------------

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

        from .config import resume_blockers

        saved = flatten_dict(yaml.safe_load(saved_path.read_text()) or {})
        now = flatten_dict(config)
        changed = resume_blockers(yaml.safe_load(saved_path.read_text()) or {}, config)
        if changed:
            shown = ", ".join(f"{k} ({saved.get(k)!r} there, {now[k]!r} now)" for k in changed[:4])
            raise ConfigError(f"{run_dir} holds a different run: {shown}. Use another output.dir for this sweep, "
                              f"or delete that directory to redo it")
    summary = read_summary(run_dir)
    if summary is not None:
        if summary.get("status") == "diverged":
            return "diverged"
        if summary.get("status") == "completed" and (summary.get("rounds") or 0) >= config["train"]["rounds"]:
            return "completed"
    if (run_dir / "checkpoints" / "latest").exists():
        return "resume"
    return "overwrite" if _has_output(run_dir) else "new"


FINISHED = ("completed", "diverged")
SKIPPED = (*FINISHED, "queued")  # queued: its Slurm job from an earlier submission is still there


# --- running a point -----------------------------------------------------------------------------

def _train_in_process(config: dict, state: str, stop: dict) -> dict:
    """Train one point in this process (one rank: alone, or one Slurm task). `stop` is shared with the
    signal handlers of `_catch_signals`: a signal before the rounds start is passed to the trainer."""
    from . import dist
    from .config import config_from_dict
    from .federation.runner import Trainer

    cfg = config_from_dict(config, source=str(Path(config["output"]["dir"]) / "config.yaml"))
    ctx = dist.init(cfg.runtime.device, cfg.runtime.threads, cfg.runtime.deterministic)
    try:
        with dist.deterministic_ops():
            trainer = Trainer(cfg, ctx, resume=state == "resume", overwrite=state == "overwrite")
            stop["trainer"] = trainer
            if stop["signal"] is not None:
                trainer.request_stop()  # agreed with the other ranks after the first round
            return trainer.run()
    finally:
        if stop["trainer"] is not None:
            stop["trainer"].close()  # release the run directory's lock now, not when collected
        stop["trainer"] = None
        dist.shutdown(ctx)


def _catch_signals(stop: dict) -> dict:
    """Until the trainer installs its own handlers (and after), SIGTERM/SIGUSR1 (preemption, requeue,
    cancel) and SIGUSR2 (submitit's time-limit warning) ask for a checkpoint at the next round
    boundary. SIGUSR2 stays ours during training (the trainer handles SIGTERM/SIGUSR1 only) and marks
    the stop as a time limit, after which the job requeues itself."""
    def handler(signum, frame):
        stop["signal"] = signum
        if signum == signal.SIGUSR2:
            stop["timeout"] = True
        if stop["trainer"] is not None:
            stop["trainer"].request_stop()

    return {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)}


class SweepJob(_JobBase):
    """The function submitit runs in every task (rank) of a point's Slurm job.

    It trains the point, resuming from RUN_DIR's last checkpoint when there is one, and returns
    immediately when RUN_DIR already holds the finished run, so running it again is always safe.
    Stops: SIGTERM (preemption, `scontrol requeue`, scancel) and SIGUSR2 (sent `signal_delay_s`
    before the time limit) make all ranks checkpoint after the same round. After SIGUSR2 the job
    requeues itself (`scontrol requeue`, at most `max_requeues` times); after SIGTERM Slurm decides
    (a preempted or requeued job comes back, a cancelled one does not). The task then exits without
    a submitit result, since the job is not over. If a signal reaches submitit before training
    starts, `checkpoint()` hands submitit this same job to requeue.
    """

    def __init__(self, config: dict, max_requeues: int = 10):
        self.config = config
        self.max_requeues = max_requeues

    @property
    def run_dir(self) -> Path:
        return Path(self.config["output"]["dir"])

    def __call__(self) -> dict:
        state = point_state(self.run_dir, self.config)
        if state in FINISHED:
            return self._result(read_summary(self.run_dir))
        stop = {"trainer": None, "signal": None, "timeout": False}
        previous = _catch_signals(stop)
        try:
            summary = _train_in_process(self.config, state, stop)
        except Interrupted as exc:
            restarts = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
            if stop["timeout"] and restarts < self.max_requeues:
                self._requeue(f"{exc}; time limit near (restart {restarts + 1} of at most {self.max_requeues})")
            elif stop["timeout"]:
                _log(f"{exc}; not requeued: max_requeues={self.max_requeues} reached. Submit the sweep again "
                     "to continue from the checkpoint")
            else:
                _log(f"{exc}; Slurm stopped the job (preemption, requeue or cancel); a requeued job continues "
                     "from this checkpoint")
            # SystemExit is not an Exception: submitit writes no result, so the job is not taken as over.
            raise SystemExit(3) from None
        except DistflError as exc:
            if read_summary(self.run_dir) is not None:  # diverged: the summary says so, the point is finished
                return self._result(read_summary(self.run_dir))
            raise RuntimeError(f"{self.run_dir}: {exc}") from None
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return self._result(summary)

    def _result(self, summary: dict | None) -> dict:
        summary = summary or {}
        return {"run_dir": str(self.run_dir), "status": summary.get("status"),
                "final_test_acc": summary.get("final_test_acc"), "model_sha256": summary.get("model_sha256")}

    @staticmethod
    def _requeue(why: str) -> None:
        job = os.environ.get("SLURM_JOB_ID")
        # Every rank that saw the signal asks; Slurm requeues the job once (a second request fails).
        proc = subprocess.run(["scontrol", "requeue", str(job)], capture_output=True, text=True, timeout=60)
        if proc.returncode == 0:
            _log(f"{why}: requeued job {job}; it continues from the checkpoint")
        elif "pending" in proc.stderr.lower() or "completing" in proc.stderr.lower():
            _log(f"{why}: job {job} is already being requeued")
        else:
            _log(f"{why}: `scontrol requeue {job}` failed: {proc.stderr.strip()}; submit the sweep again to continue")

    def checkpoint(self, *args, **kwargs):
        """submitit's time-limit path (USR2 outside training): requeue this job; it resumes by itself."""
        _log(f"checkpoint requested by submitit; the job will resume {self.run_dir} from its last checkpoint")
        return submitit.helpers.DelayedSubmission(SweepJob(self.config, self.max_requeues))


def _log(message: str) -> None:
    rank = os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))
    print(f"distfl sweep [rank {rank}]: {message}", file=sys.stderr, flush=True)


# --- executors ----------------------------------------------------------------------------------

def _package_root() -> str:
    return str(Path(__file__).resolve().parents[1])


def _child_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_package_root(), env.get("PYTHONPATH")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def local_command(sweep: Sweep, point: Point) -> list[str]:
    """The `distfl train` command line (under torchrun for nproc > 1) that runs `point` here."""
    fixed = [o for o in sweep.fixed if not o.startswith("output.dir=")]  # the point's own comes last
    if sweep.nproc > 1:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={sweep.nproc}"]
    else:
        launcher = [sys.executable]
    return [*launcher, "-m", "distfl", "train", *train_args(point.run_dir, point.config, point.state,
                                                              sweep.config_path, [*fixed, *point.overrides])]


def train_args(run_dir: Path, config: dict, state: str, config_path: str, overrides: list[str]) -> list[str]:
    """Arguments of `distfl train` that start, restart or continue this run (state: see point_state)."""
    if state == "resume":
        import yaml

        saved = flatten_dict(yaml.safe_load((Path(run_dir) / "config.yaml").read_text()) or {})
        # Only resumable keys can differ here (point_state checked); pass the ones that do.
        changed = [f"{k}={_value_text(v, k)}" for k, v in flatten_dict(config).items()
                   if k != "output.dir" and saved.get(k) != v]
        return ["--resume", str(run_dir), *changed]
    args = [str(config_path), *overrides, f"output.dir={run_dir}"]
    return args + ["--overwrite"] if state == "overwrite" else args


def run_local(sweep: Sweep, out=None) -> int:
    """Run the points here one after another; 0 when all finished, 3 when stopped by a signal, 1 else."""
    out = out or sys.stdout
    failed = []
    todo = [p for p in sweep.points if p.state not in SKIPPED]
    print(f"distfl sweep: {len(sweep.points)} runs in {sweep.sweep_dir}, {_skipped_text(sweep)}; "
          f"running {len(todo)} here, {sweep.nproc} rank(s) each", file=out, flush=True)
    for i, point in enumerate(todo, 1):
        verb = "resuming" if point.state == "resume" else "running"
        print(f"[{i}/{len(todo)}] {verb} {point.name}", file=out, flush=True)
        if sweep.nproc == 1:
            code = _run_point_in_process(point, out)
        else:
            code = _run_point_subprocess(local_command(sweep, point), out)
        if code == 3:
            print(f"distfl sweep: stopped by a signal during {point.name} (checkpointed); run the same "
                  "command again to continue", file=out, flush=True)
            return 3
        if code == 130:
            return 130
        if code != 0:
            failed.append(point.name)
    return _final_report(sweep, out, failed)


def _skipped_text(sweep: Sweep) -> str:
    finished = sum(p.state in FINISHED for p in sweep.points)
    queued = [p for p in sweep.points if p.state == "queued"]
    text = f"{finished} already finished"
    if queued:
        text += (f", {len(queued)} still queued or running on Slurm (left alone: "
                 f"{', '.join(f'{p.name} as job {p.job_id}' for p in queued)})")
    return text


def _run_point_in_process(point: Point, out) -> int:
    stop = {"trainer": None, "signal": None, "timeout": False}
    previous = _catch_signals(stop)
    try:
        summary = _train_in_process(point.config, point.state, stop)
        print(f"  final test accuracy {100 * (summary['final_test_acc'] or 0):.2f}%, "
              f"{summary['rounds']} rounds in {summary['wall_s']:.1f}s", file=out, flush=True)
        return 0
    except Interrupted:
        return 3
    except DistflError as exc:
        print(f"  failed: {exc}", file=out, flush=True)
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _run_point_subprocess(cmd: list[str], out) -> int:
    """Run one point under torchrun; a SIGTERM/SIGUSR1 to the sweep becomes a SIGUSR1 to each rank.
    Not to torchrun: its agent answers a SIGTERM by killing the ranks 30 s later, which loses the
    checkpoint of a longer round (and a SIGUSR1 would end torchrun itself)."""
    proc = subprocess.Popen(cmd, env=_child_env())
    signalled = []

    def forward(signum, frame):
        signalled.append(signum)
        for rank in _children(proc.pid):
            try:
                os.kill(rank, signal.SIGUSR1)
            except ProcessLookupError:
                pass

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGUSR1)}
    try:
        while True:
            try:
                code = proc.wait()
                # The ranks exit 3 after the checkpoint; torchrun reports any rank's non-zero exit as 1.
                return 3 if signalled and code != 0 else code
            except KeyboardInterrupt:  # the ranks got the SIGINT too; let them finish dying
                proc.wait()
                return 130
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _children(pid: int) -> list[int]:
    """The child processes of `pid` (Linux /proc), those of every thread."""
    pids = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            pids += [int(c) for c in (task / "children").read_text().split()]
        except OSError:  # the thread or the process has ended
            pass
    return pids


def _final_report(sweep: Sweep, out=None, failed=()) -> int:
    out = out or sys.stdout
    states = {p.name: point_state(p.run_dir, p.config) for p in sweep.points}
    done = [n for n, s in states.items() if s == "completed"]
    diverged = [n for n, s in states.items() if s == "diverged"]
    unfinished = [n for n, s in states.items() if s not in FINISHED]
    print(f"distfl sweep: {len(done)}/{len(states)} completed in {sweep.sweep_dir}"
          + (f"; diverged: {', '.join(diverged)}" if diverged else "")
          + (f"; unfinished: {', '.join(unfinished)}" if unfinished else ""), file=out, flush=True)
    if failed:
        print(f"distfl sweep: failed: {', '.join(failed)}", file=out, flush=True)
    print(f"distfl sweep: summarise with `distfl report {sweep.sweep_dir}`", file=out, flush=True)
    return 0 if len(done) == len(states) else 1


def make_executor(sweep: Sweep):
    """The submitit executor for the sweep's Slurm options (one job per point, job arrays)."""
    logs = sweep.sweep_dir / LOGS_DIR
    executor = submitit.AutoExecutor(folder=str(logs), cluster="slurm")
    params = {}
    for name, value in sweep.slurm.items():
        if value is None or name == "max_requeues" or (name == "gpus_per_node" and value == 0):
            continue
        params[_SUBMITIT_NAMES[name]] = value
    # The ranks must import this distfl even where it is not installed.
    params["slurm_setup"] = [f"export PYTHONPATH={_package_root()}${{PYTHONPATH:+:$PYTHONPATH}}",
                             *(params.get("slurm_setup") or [])]
    # A preempted job is requeued rather than cancelled (where the cluster preempts by requeueing).
    params["slurm_additional_parameters"] = {"requeue": True, **(params.get("slurm_additional_parameters") or {})}
    try:
        executor.update_parameters(**params)
    except ValueError as exc:  # submitit's own check of the parameters
        raise ConfigError(f"Slurm options: {exc}") from None
    return executor


def submit_slurm(sweep: Sweep, out=None) -> list[Point]:
    """Submit the unfinished points (one job array); record job ids in SWEEP_DIR/sweep.json."""
    out = out or sys.stdout
    todo = [p for p in sweep.points if p.state not in SKIPPED]
    print(f"distfl sweep: {len(sweep.points)} runs in {sweep.sweep_dir}, {_skipped_text(sweep)}; "
          f"submitting {len(todo)} to Slurm, {sweep.slurm['nodes']} node(s) x "
          f"{sweep.slurm['tasks_per_node']} rank(s) each", file=out, flush=True)
    if not todo:
        return []
    executor = make_executor(sweep)
    dir_existed, logs_existed = sweep.sweep_dir.exists(), (sweep.sweep_dir / LOGS_DIR).exists()
    sweep.sweep_dir.mkdir(parents=True, exist_ok=True)
    try:
        with executor.batch():
            jobs = [executor.submit(SweepJob(p.config, sweep.slurm["max_requeues"])) for p in todo]
    except Exception as exc:  # sbatch refused (bad partition, account, ...): nothing was submitted
        detail = getattr(exc, "stderr", None) or getattr(exc, "output", None) or str(exc)
        if isinstance(detail, bytes):
            detail = detail.decode(errors="replace")
        if not dir_existed or not logs_existed:  # leave no trace of a submission that did not happen
            shutil.rmtree(sweep.sweep_dir if not dir_existed else sweep.sweep_dir / LOGS_DIR, ignore_errors=True)
        raise DistflError(f"sbatch refused the sweep, nothing was submitted: {str(detail).strip()}") from None
    for point, job in zip(todo, jobs):
        point.job_id = str(job.job_id)
        print(f"  {point.job_id:>12}  {'resume' if point.state == 'resume' else 'new   '}  {point.name}",
              file=out, flush=True)
    print(f"distfl sweep: logs in {sweep.sweep_dir / LOGS_DIR}; watch with `squeue --me`; "
          f"`distfl report {sweep.sweep_dir}` summarises what has finished", file=out, flush=True)
    return todo


def _job_ids(earlier: list, job_id: str | None) -> list:
    return earlier + [job_id] if job_id and job_id not in earlier else earlier


def write_sweep_file(sweep: Sweep) -> None:
    path = sweep.sweep_dir / SWEEP_FILE
    previous = {}
    try:
        previous = {p["name"]: p for p in json.loads(path.read_text()).get("points", [])}
    except (OSError, ValueError):
        pass
    record = {
        "config": str(Path(sweep.config_path).resolve()),
        "overrides": sweep.fixed,
        "grid": sweep.grid,
        "swept_keys": sweep.swept_keys,
        "seeds": sweep.seeds,
        "executor": sweep.executor,
        "nproc": sweep.nproc,
        "slurm": sweep.slurm if sweep.executor == "slurm" else None,
        "points": [{"name": p.name, "run_dir": str(p.run_dir), "overrides": p.overrides,
                    "job_id": p.job_id or previous.get(p.name, {}).get("job_id"),
                    "job_ids": _job_ids(previous.get(p.name, {}).get("job_ids", []), p.job_id)}
                   for p in sweep.points],
    }
    sweep.sweep_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(tmp, path)


# --- waiting for Slurm jobs ---------------------------------------------------------------------

def slurm_active_jobs() -> dict[str, str]:
    """Job id ("123" or "123_4" for array tasks) -> state, for every job Slurm still has queued or running."""
    for attempt in range(5):  # a busy controller can time out a query; ask again
        proc = subprocess.run(["squeue", "-h", "-r", "-o", "%i|%T"], capture_output=True, text=True, timeout=120)
        if proc.returncode == 0:
            return dict(line.split("|", 1) for line in proc.stdout.split() if "|" in line)
        time.sleep(2 * (attempt + 1))
    raise DistflError(f"squeue failed: {proc.stderr.strip()}")


def wait_for_jobs(job_ids, timeout_s: float | None = None, poll_s: float = 2.0, on_poll=None) -> None:
    """Block until none of `job_ids` is pending, running or completing (a requeued job is pending)."""
    job_ids = {str(j) for j in job_ids}
    deadline = None if timeout_s is None else time.time() + timeout_s
    while True:
        active = job_ids & set(slurm_active_jobs())
        if on_poll is not None:
            on_poll(active)
        if not active:
            return
        if deadline is not None and time.time() > deadline:
            raise TimeoutError(f"Slurm jobs still active after {timeout_s:.0f}s: {', '.join(sorted(active))}")
        time.sleep(poll_s)


# --- entry points -------------------------------------------------------------------------------

def run_sweep(config_path: str, fixed=(), grid_args=(), seeds_arg=None, executor=None, nproc=None,
              slurm_args=None, wait: bool = False, dry_run: bool = False, out=None) -> int:
    out = out or sys.stdout
    sweep = build_sweep(config_path, fixed, grid_args, seeds_arg, executor, nproc, slurm_args)
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
    return _final_report(sweep, out)


def _main(argv: list[str]) -> int:
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


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))

"""`--executor slurm`: the Slurm options, submission through submitit (one job array a submission, one
job of nodes x tasks_per_node ranks a point), `SweepJob` (what each task runs) and squeue queries."""
from __future__ import annotations

import difflib
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ConfigError, DistflError, Interrupted
from ..launch import PACKAGE_ROOT
from .inprocess import stop_signals, train_in_process
from .state import FINISHED, point_state, read_summary, runs_text

try:  # submitit is a dependency; without it only the Slurm executor is unavailable
    import submitit
    from submitit.helpers import Checkpointable as _JobBase
except ImportError:  # pragma: no cover
    submitit = None
    _JobBase = object

if TYPE_CHECKING:
    from .plan import Point, Sweep

LOGS_DIR = "slurm-logs"

# --- Slurm options -------------------------------------------------------------------------------

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
    from distfl.yaml_loader import ConfigLoader

    try:
        value = yaml.load(text, Loader=ConfigLoader)  # not safe_load: YAML 1.1 reads 2:00:00 as 7200
    except yaml.YAMLError:
        value = text
    if key.startswith("additional."):
        return {"additional": {key.split(".", 1)[1]: value}}
    if key in ("partition", "account", "qos", "constraint", "job_name"):
        value = text
    return {key: value}


def check_slurm_available() -> None:
    missing = [tool for tool in ("sbatch", "srun", "squeue") if shutil.which(tool) is None]
    if missing:
        raise ConfigError(
            f"--executor slurm: {', '.join(missing)} not found on PATH, so this machine cannot submit Slurm jobs. "
            "Run the sweep on the cluster's login node, use --executor local, or start a one-node Slurm "
            "here with `sudo slurm/dev-cluster.sh start` (docs/sweeps.md)")
    if submitit is None:
        raise ConfigError("--executor slurm needs the submitit package: pip install submitit")


# --- what every task of a point's job runs -----------------------------------------------------

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
        with stop_signals() as stop:
            try:
                summary = train_in_process(self.config, state, stop)
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
                done = read_summary(self.run_dir)
                if done is not None and done.get("status") == "diverged":  # the summary says so: the point is finished
                    return self._result(done)
                raise RuntimeError(f"{self.run_dir}: {exc}") from None
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


# --- submitting --------------------------------------------------------------------------------

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
    params["slurm_setup"] = [f"export PYTHONPATH={PACKAGE_ROOT}${{PYTHONPATH:+:$PYTHONPATH}}",
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
    todo = sweep.todo
    print(f"distfl sweep: {runs_text(sweep)}; submitting {len(todo)} to Slurm, "
          f"{sweep.slurm['nodes']} node(s) x {sweep.slurm['tasks_per_node']} rank(s) each", file=out, flush=True)
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

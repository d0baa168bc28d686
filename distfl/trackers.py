"""Experiment trackers (`output.trackers`): where rank 0 sends a run's scalars, its config and its final
metrics, besides metrics.jsonl. One interface, three trackers:

    tensorboard  RUN_DIR/tb event files (torch's SummaryWriter); resumed runs purge the steps after the
                 checkpoint, as metrics.jsonl drops its rows
    mlflow       an MLflow run under experiment `output.experiment` at `output.mlflow_uri` (default a
                 local file store, ./mlruns); a resumed run continues the same MLflow run (its id is kept
                 in RUN_DIR/trackers.json)
    wandb        a Weights & Biases run in project `output.experiment`, written under RUN_DIR/wandb
                 (`output.wandb_mode`: offline by default, no network); a resumed run continues it (its id
                 is kept in RUN_DIR/trackers.json)

`check_trackers` refuses, before any work and before the run directory exists, a tracker that cannot
work (a missing package, an MLflow URI that cannot be written or reached, W&B online without a login).
MLflow and W&B are observers: one that fails mid-run is dropped with one warning line (logging.py) and
the run goes on. Every tracker gets the same names: the scalars' tags (`tag`), the run's name (`run_name`: the run
directory, with its sweep point for a sweep's `k=v/seed=S`), the config keys worth a column (`hparams`:
those that differ from their defaults, and what names the run) and the final metrics.
"""
from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path

from .errors import ConfigError
from .faults import writing

# metrics.jsonl key -> tag; other keys by their prefix (PREFIXES), or under method/ (an algorithm's own).
TAGS = {
    "test_acc": "test/accuracy",
    "test_loss": "test/loss",
    "train_loss": "train/loss",
    "lr": "train/lr",
    "server_lr": "train/server_lr",
    "cohort_size": "train/cohort_size",
    "update_norm": "train/update_norm",
    "round_s": "time/round_s",
    "eval_s": "time/eval_s",
    "wall_s": "time/wall_s",
    "virtual_time_s": "time/virtual_time_s",
    "round_virtual_s": "time/round_virtual_s",
    "global_train_loss": "train/global_loss",
    "global_train_acc": "train/global_accuracy",
    "client_model_round": "test/client_model_round",
    "samples_per_s": "time/samples_per_s",
    "bytes_reduced": "comm/bytes_reduced",
    "bytes_up": "comm/bytes_up",
    "bytes_down": "comm/bytes_down",
    "clients_never_sampled": "test/clients_never_sampled",
}
PREFIXES = {"client_acc_": "test/client_acc_", "privacy_": "privacy/"}
# The system section's counters of a round (system/clock.py) or an asynchronous step (system/asynchronous.py).
SYSTEM = ("sampled", "finished", "partial", "late", "dropped", "updates", "discarded", "in_flight", "staleness_mean",
          "staleness_max")
# Keys that name a run: always HParams columns, whatever their value.
IDENTITY = ("algorithm.name", "data.dataset", "model.name", "partition.scheme", "seed")
PACKAGES = {"mlflow": "mlflow-skinny", "wandb": "wandb"}


def tag(key: str) -> str:
    """The tracker name of a metrics.jsonl key: test_acc -> test/accuracy, lr -> train/lr, dropped ->
    system/dropped, a method's own key -> method/KEY, ..."""
    if key in TAGS:
        return TAGS[key]
    for prefix, namespace in PREFIXES.items():
        if key.startswith(prefix):
            return namespace + key[len(prefix):]
    if key in SYSTEM:
        return f"system/{key}"
    return f"method/{key}"


def run_name(run_dir: Path) -> str:
    """`k=v/seed=0` for a sweep's run directory, else the directory's name."""
    run_dir = Path(run_dir).resolve()
    return f"{run_dir.parent.name}/{run_dir.name}" if run_dir.name.startswith("seed=") else run_dir.name


def hparams(flat_config: dict, defaults: dict) -> dict:
    """The config keys worth a column in a comparison of runs: those that differ from their defaults,
    and the keys that name a run (IDENTITY), without output.* and checkpoint.*; lists and mappings as
    text."""
    out = {}
    for key, value in flat_config.items():
        if key.startswith(("output.", "checkpoint.")):
            continue
        if key in IDENTITY or value != defaults.get(key, object()):
            out[key] = value if isinstance(value, (bool, int, float, str)) else json.dumps(value)
    return out


def check_installed(names) -> None:
    """A tracker whose package is missing: one line, before any data loads."""
    import importlib.util

    for name in names:
        if name in PACKAGES and importlib.util.find_spec(name) is None:
            raise ConfigError(f"output.trackers lists {name}, which is not installed: pip install "
                              f"'distfl[{name}]' (or pip install {PACKAGES[name]})")


# Seconds a tracker's server has to accept a connection when the run is checked, before any work.
CONNECT_TIMEOUT_S = 5
# MLflow's HTTP client retries 7 times with growing waits, over two minutes of silence when its server goes
# away mid-run; distfl's runs give it these instead (a user's own MLFLOW_HTTP_* variables are kept).
MLFLOW_HTTP = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
               "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
DATABASE_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")
PSEUDO_FILESYSTEMS = ("/proc", "/sys", "/dev")


def check_trackers(v: dict) -> None:
    """ConfigError in one line, before any work and before the run directory is made, for a tracker that
    cannot work: its package missing, an MLflow URI that cannot be written or reached, W&B online
    without a login or without a reachable server. `v`: the dotted config values."""
    names = [n for n in v["output.trackers"] if n != "tensorboard" or v["output.tensorboard"]]
    check_installed(names)
    if "mlflow" in names:
        _check_mlflow_uri(v["output.mlflow_uri"])
    if "wandb" in names and v["output.wandb_mode"] == "online":
        _check_wandb_online()


def mlflow_uri(configured: str) -> str:
    """output.mlflow_uri, or the default: the file store ./mlruns of the working directory."""
    return configured or (Path.cwd() / "mlruns").as_uri()


def _check_mlflow_uri(configured: str) -> None:
    from urllib.parse import urlparse

    uri = mlflow_uri(configured)
    parsed = urlparse(uri)
    scheme = parsed.scheme.split("+")[0] if "://" in uri else "file"
    key = f"output.mlflow_uri={configured}" if configured else "output.mlflow_uri (default ./mlruns)"
    if scheme == "file":
        _check_writable_folder(key, parsed.path if "://" in uri else uri, "MLflow's file store")
    elif scheme in DATABASE_SCHEMES:
        import importlib.util

        if importlib.util.find_spec("sqlalchemy") is None or importlib.util.find_spec("alembic") is None:
            raise ConfigError(f"{key}: an MLflow database store needs the full MLflow package (pip install "
                              f"mlflow=={_mlflow_version()}), which distfl[mlflow] (mlflow-skinny) does not "
                              "install; or leave output.mlflow_uri empty for the file store ./mlruns")
        database = uri.partition(":///")[2]  # sqlite:///REL/PATH.db or sqlite:////ABS/PATH.db
        if scheme == "sqlite" and database not in ("", ":memory:"):
            _check_writable_folder(key, str(Path(database).parent), "the SQLite file")
    elif scheme in ("http", "https"):
        _check_reachable(key, parsed.hostname or "", parsed.port or (443 if scheme == "https" else 80),
                         "MLflow tracking server")


def _mlflow_version() -> str:
    try:
        from importlib.metadata import version

        return version("mlflow-skinny")
    except Exception:  # not installed: check_installed said so first
        return "3.17.2"


def _check_writable_folder(key: str, path: str, what: str) -> None:
    """`path` (to be made if missing) must be a folder distfl can write: not under /proc, /sys or /dev, not
    inside a file, and its first existing ancestor writable."""
    folder = Path(os.path.abspath(os.path.expanduser(path)))
    real = os.path.realpath(folder)
    if any(real == p or real.startswith(p + "/") for p in PSEUDO_FILESYSTEMS):
        raise ConfigError(f"{key}: {what} would be in {real}, on a system pseudo-filesystem (/proc, /sys, /dev); "
                          "give a folder on disk")
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"{key}: {what} would be inside {existing}, which is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"{key}: {what} would be in {existing}, which this user cannot write")


def _check_reachable(key: str, host: str, port: int, what: str) -> None:
    import socket

    try:
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise ConfigError(f"{key}: no {what} answers at {host}:{port} within {CONNECT_TIMEOUT_S} s "
                          f"({exc.strerror or exc}); start it, or check the address") from None


def _check_wandb_online() -> None:
    """output.wandb_mode=online needs a W&B login (WANDB_API_KEY, or `wandb login`'s ~/.netrc entry) and
    its server reachable."""
    import netrc
    from urllib.parse import urlparse

    base = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")
    host = urlparse(base).hostname or ""
    logged_in = bool(os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"))
    if not logged_in:
        try:
            logged_in = netrc.netrc(os.environ.get("NETRC") or None).authenticators(host) is not None
        except (OSError, netrc.NetrcParseError):
            logged_in = False
    if not logged_in:
        raise ConfigError(f"output.wandb_mode=online needs a W&B login for {host} (run `wandb login`, or set "
                          "WANDB_API_KEY); output.wandb_mode=offline needs none and `wandb sync` uploads later")
    _check_reachable("output.wandb_mode=online", host, urlparse(base).port or (443 if base.startswith("https")
                                                                                else 80), "W&B server")


class Tracker:
    """What RunLogger calls. Scalars arrive by tag; `params` are the HParams columns."""

    # The time stamped on every scalar: None, the clock; a fixed time (a private run without
    # privacy.release_timings) keeps the rounds' wall times out of the tracker's records.
    walltime: float | None = None
    name = "tensorboard"

    def scalars(self, values: dict, step: int) -> None:
        raise NotImplementedError

    def hparams(self, params: dict, metrics: dict, step: int) -> None:
        raise NotImplementedError

    def close(self, status: str) -> None:
        """`status`: completed | diverged | failed | interrupted."""

    def abandon(self) -> None:
        """After a failed call: let go of the tracker quietly (nothing raised, nothing printed)."""


class TensorBoard(Tracker):
    def __init__(self, run_dir: Path, purge_step: int):
        from torch.utils.tensorboard import SummaryWriter

        quiet_tensorboard_thread()
        self.dir = Path(run_dir) / "tb"
        with writing(self.dir):
            self.writer = SummaryWriter(str(self.dir), purge_step=purge_step)

    def scalars(self, values: dict, step: int) -> None:
        with writing(self.dir):
            for name, value in values.items():
                self.writer.add_scalar(name, value, step, walltime=self.walltime)

    def hparams(self, params: dict, metrics: dict, step: int) -> None:
        from torch.utils.tensorboard.summary import hparams

        metrics = {f"hparams/{k}": v for k, v in metrics.items()}
        with writing(self.dir):
            for summary in hparams(params, metrics):  # into the run's own event file
                self.writer.file_writer.add_summary(summary, walltime=self.walltime)
            for name, value in metrics.items():
                self.writer.add_scalar(name, value, step, walltime=self.walltime)

    def close(self, status: str = "completed") -> None:
        with writing(self.dir):
            self.writer.close()


def quiet_tensorboard_thread() -> None:
    """TensorBoard writes from a thread, which re-raises a failed write (a full disk) in the next call
    of ours; the thread's own dying print would put a traceback beside distfl's one line."""
    previous = threading.excepthook
    if getattr(previous, "distfl", False):
        return

    def hook(args):
        if not (type(args.thread).__module__.startswith("tensorboard.") and isinstance(args.exc_value, OSError)):
            previous(args)

    hook.distfl = True
    threading.excepthook = hook



def _ids(run_dir: Path) -> dict:
    try:
        return json.loads((Path(run_dir) / "trackers.json").read_text())
    except (OSError, ValueError):
        return {}


def _save_ids(run_dir: Path, ids: dict) -> None:
    """RUN_DIR/trackers.json: the MLflow and W&B run ids, so that a resumed run continues them."""
    from .checkpoint import atomic_write_text

    atomic_write_text(json.dumps(ids) + "\n", Path(run_dir) / "trackers.json")


class MLflow(Tracker):
    name = "mlflow"

    def __init__(self, run_dir: Path, output_cfg, name: str, params: dict):
        for variable, value in MLFLOW_HTTP.items():
            os.environ.setdefault(variable, value)
        from mlflow.tracking import MlflowClient

        uri = mlflow_uri(output_cfg.mlflow_uri)
        if uri.startswith("file:") or "://" not in uri:
            # MLflow 3 asks for this opt-in before it writes its (maintained, not developed) file store.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=uri)
        experiment = self.client.get_experiment_by_name(output_cfg.experiment)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(output_cfg.experiment)
        ids, self.run_id = _ids(run_dir), None
        if ids.get("mlflow_run_id"):
            try:
                self.run_id = self.client.get_run(ids["mlflow_run_id"]).info.run_id
                self.client.update_run(self.run_id, status="RUNNING")
            except Exception:  # deleted, or another store: a new MLflow run
                self.run_id = None
        if self.run_id is None:
            self.run_id = self.client.create_run(experiment_id, run_name=name,
                                                 tags={"distfl.run_dir": str(Path(run_dir).resolve())}).info.run_id
            _save_ids(run_dir, {**_ids(run_dir), "mlflow_run_id": self.run_id})
        self._params(params)

    def _params(self, params: dict) -> None:
        """Params are written once per MLflow run: a resumed run adds only the new keys (its changed
        values, train.rounds for one, are in the config.yaml it rewrites)."""
        from mlflow.entities import Param

        logged = self.client.get_run(self.run_id).data.params
        new = [Param(k, str(v)[:6000]) for k, v in params.items() if k not in logged]
        for i in range(0, len(new), 100):
            self.client.log_batch(self.run_id, params=new[i:i + 100])

    def scalars(self, values: dict, step: int) -> None:
        import time

        from mlflow.entities import Metric

        now = int((time.time() if self.walltime is None else self.walltime) * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, float(v), now, step) for k, v in values.items()])

    def hparams(self, params: dict, metrics: dict, step: int) -> None:
        self._params(params)
        self.scalars(metrics, step)

    def close(self, status: str = "completed") -> None:
        self.client.set_terminated(self.run_id, {"completed": "FINISHED", "interrupted": "KILLED"}.get(status, "FAILED"))

    def abandon(self) -> None:
        pass  # MLflow's client holds nothing open


class Wandb(Tracker):
    name = "wandb"

    def __init__(self, run_dir: Path, output_cfg, name: str, params: dict):
        import wandb

        import time

        run_dir = Path(run_dir).resolve()
        ids = _ids(run_dir)
        run_id = ids.get("wandb_run_id")
        if run_id is None:  # a new run (also after --overwrite, which removes trackers.json)
            run_id = hashlib.sha256(f"{run_dir}:{time.time_ns()}".encode()).hexdigest()[:16]
            _save_ids(run_dir, {**ids, "wandb_run_id": run_id})
        self.run = wandb.init(project=output_cfg.experiment, name=name, id=run_id, resume="allow",
                              dir=str(run_dir), mode=output_cfg.wandb_mode, config=params,
                              settings=wandb.Settings(console="off", silent=True))

    def scalars(self, values: dict, step: int) -> None:
        self.run.log(values, step=step)

    def hparams(self, params: dict, metrics: dict, step: int) -> None:
        self.run.config.update(params, allow_val_change=True)
        self.run.summary.update(metrics)

    def close(self, status: str = "completed") -> None:
        self.run.finish(exit_code=0 if status == "completed" else 1)

    def abandon(self) -> None:
        _end_wandb(self.run)

def _end_wandb(run=None) -> None:
    """After W&B failed: its own exit hook would print the failure (some 30 lines) when the process ends,
    so the run and W&B's service are ended now, their errors and prints silenced."""
    import contextlib
    import io

    import wandb

    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        for end in ((lambda: run.finish(exit_code=1)) if run is not None else None, wandb.teardown):
            try:
                if end is not None:
                    end()
            except Exception:
                pass


def open_trackers(run_dir: Path, output_cfg, purge_step: int, params: dict, warn=print,
                  walltime: float | None = None) -> list[Tracker]:
    """The trackers `output.trackers` lists (TensorBoard also needs output.tensorboard), opened. MLflow or
    W&B failing to open (its server gone since the config was checked) is one `warn` line; the run goes
    on without it. `walltime`: the fixed time they stamp on every scalar (None: the clock)."""
    names = [n for n in output_cfg.trackers if n != "tensorboard" or output_cfg.tensorboard]
    check_installed(names)
    name = run_name(run_dir)
    found = []
    for tracker in names:
        if tracker == "tensorboard":
            found.append(TensorBoard(run_dir, purge_step))
            continue
        kind = MLflow if tracker == "mlflow" else Wandb
        try:
            found.append(kind(run_dir, output_cfg, name, params))
        except Exception as exc:
            if kind is Wandb:
                _end_wandb()
            warn(f"warning: the {tracker} tracker failed to start ({type(exc).__name__}: "
                 f"{' '.join(str(exc).split())[:200]}); this run goes on without it, and metrics.jsonl keeps every round")
    for tracker in found:
        tracker.walltime = walltime
    return found

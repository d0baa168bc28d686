"""Shared helpers: small synthetic configs, in-process runs, and real torchrun runs with gloo."""
from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]

# The ordinary suite runs on the CPU on every machine (its 2-rank tests use gloo, several assert cpu):
# CUDA is hidden from this process and every run it starts, before torch is imported. tests/integration/test_cuda.py
# runs its real-GPU checks in subprocesses with `cuda_env()`.
# The machine's own value is kept in DISTFL_TESTS_CUDA_VISIBLE_DEVICES ("<unset>" for none), which processes
# started from here inherit: a pytest-xdist worker imports this file with CUDA already hidden.
_UNSET = "<unset>"
os.environ.setdefault("DISTFL_TESTS_CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES", _UNSET))
ORIGINAL_CUDA_VISIBLE_DEVICES = (None if os.environ["DISTFL_TESTS_CUDA_VISIBLE_DEVICES"] == _UNSET
                                 else os.environ["DISTFL_TESTS_CUDA_VISIBLE_DEVICES"])
os.environ["CUDA_VISIBLE_DEVICES"] = ""

# Checkpoints are written without fsync in this process and every run it starts (DISTFL_FSYNC=0,
# docs/checkpoints.md): no test can crash the machine, which is all the flushes guard against, and each one
# took about 20 ms here (28 a six-round run). test_checkpoint.py checks the flushes themselves;
# DISTFL_FSYNC=1 runs the suite with them.
os.environ.setdefault("DISTFL_FSYNC", "0")


def cuda_env(**extra: str) -> dict:
    """The environment of a subprocess that may use the machine's GPUs (as this session found them)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **extra}
    if ORIGINAL_CUDA_VISIBLE_DEVICES is None:
        env.pop("CUDA_VISIBLE_DEVICES")
    else:
        env["CUDA_VISIBLE_DEVICES"] = ORIGINAL_CUDA_VISIBLE_DEVICES
    return env

# A run that takes about a second: 12 clients of synthetic 8x8 images, a small MLP.
SMALL = {
    "seed": 3,
    "data": {"dataset": "synthetic"},
    "partition": {"scheme": "dirichlet", "num_clients": 12, "alpha": 0.5},
    "model": {"name": "mlp"},
    "train": {"rounds": 6, "clients_per_round": 5, "lr": 0.1, "batch_size": 16},
    "eval": {"every": 3},
    "checkpoint": {"every": 2, "keep": 5},
    "output": {"progress": "none", "tensorboard": False},
}


def write_config(path: Path, base: dict = SMALL, **sections) -> Path:
    cfg = json.loads(json.dumps(base))
    for section, values in sections.items():
        if isinstance(values, dict):
            cfg.setdefault(section, {}).update(values)
        else:
            cfg[section] = values
    path.write_text(yaml.safe_dump(cfg))
    return path


def run_cli(args: list[str], nproc: int = 1, timeout: int = 600, subprocess_: bool = False, paths=(), env=None):
    """`distfl ARGS`. nproc == 1: in this process (fast; no torch import); nproc > 1, subprocess_ or env:
    a fresh process, under torchrun (gloo on CPU) for nproc > 1. Returns a CompletedProcess.
    `paths`: more PYTHONPATH entries for the subprocesses (an out-of-tree plugin package); an in-process
    run sees what is on sys.path. `env`: the subprocesses' whole environment instead (e.g.
    `env_with_sitecustomize`)."""
    if nproc == 1 and not subprocess_ and env is None:
        from distfl.cli import main

        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main([str(a) for a in args])
        return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())
    cmd, env = _command(args, nproc, paths, env)
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def _command(args, nproc: int, paths, env) -> tuple[list[str], dict]:
    """(command, environment) of `distfl ARGS` in a fresh process (under torchrun for nproc > 1)."""
    if nproc == 1:
        cmd = [sys.executable, "-m", "distfl", *map(str, args)]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
               "-m", "distfl", *map(str, args)]
    if env is None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *map(str, paths)]), "OMP_NUM_THREADS": "1"}
    return cmd, env


class Started:
    """`distfl ARGS` started in a fresh process (`run_cli`'s subprocess), its output going to files, so that
    the test can do other work meanwhile; `finish` waits for it (`timeout` s at most) and returns what
    `run_cli` would have."""

    def __init__(self, args, nproc: int, paths=()):
        import tempfile

        self.args = args
        cmd, env = _command(args, nproc, paths, None)
        self.out, self.err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=self.out, stderr=self.err, text=True)

    def finish(self, timeout: int = 600) -> subprocess.CompletedProcess:
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise
        outputs = []
        for f in (self.out, self.err):
            f.seek(0)
            outputs.append(f.read())
            f.close()
        return subprocess.CompletedProcess(self.args, code, *outputs)

    def stop(self) -> None:
        """Kill it if it still runs (the test failed meanwhile): no run outlives its test."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def train_ok(config: Path, *overrides: str, nproc: int = 1, resume: str | None = None, paths=(),
             started: Started | None = None) -> dict:
    """The summary of `distfl train CONFIG OVERRIDES` (or `--resume RESUME`), which must succeed; `started`:
    that run, already started (`Started`), is waited for instead."""
    args = ["train", "--resume", resume, *overrides] if resume else ["train", str(config), *overrides]
    proc = started.finish() if started is not None else run_cli(args, nproc=nproc, paths=paths)
    assert proc.returncode == 0, f"distfl {' '.join(map(str, args))} failed:\n{proc.stdout}\n{proc.stderr}"
    out_dir = resume or next(o.split("=", 1)[1] for o in overrides if o.startswith("output.dir="))
    return summary(Path(out_dir))


def one_and_two(config: Path, tmp_path: Path, *args: str, paths=()) -> tuple[dict, dict]:
    """The summaries of `config` with `args` trained on 1 rank (in this process, into tmp_path/one) and on 2
    ranks (torchrun, into tmp_path/two); the 2-rank run trains beside the other."""
    started = Started(["train", str(config), f"output.dir={tmp_path / 'two'}", *args], nproc=2, paths=paths)
    try:
        one = train_ok(config, f"output.dir={tmp_path / 'one'}", *args, paths=paths)
        two = train_ok(config, f"output.dir={tmp_path / 'two'}", *args, started=started)
    finally:
        started.stop()
    return one, two


def one_two_resumed(config: Path, tmp_path: Path, *args: str, two: tuple[str, ...] = (), stop_at: int = 4,
                    rounds: int = 6, paths=()) -> tuple[dict, dict, dict]:
    """Train `config` with `args` three ways: on 1 rank; on 2 ranks (with the extra overrides `two`); and
    on 1 rank stopped after `stop_at` rounds, then resumed on 2 ranks to `rounds`. Asserts that the three
    give the same model, test accuracy and train loss every round; returns their summaries. `paths`: as
    run_cli's (a plugin's folder)."""
    # The 2-rank run trains beside the others: the 1-rank runs in this process leave one core of two idle.
    two_overrides = (f"output.dir={tmp_path / 'two'}", *args, *two)
    started = Started(["train", str(config), *two_overrides], nproc=2, paths=paths)
    try:
        one = train_ok(config, f"output.dir={tmp_path / 'one'}", *args, paths=paths)
        train_ok(config, f"output.dir={tmp_path / 'stopped'}", *args, f"train.rounds={stop_at}", paths=paths)
        resumed = train_ok(None, f"train.rounds={rounds}", resume=str(tmp_path / "stopped"), nproc=2, paths=paths)
        on_two = train_ok(config, *two_overrides, started=started)
    finally:
        started.stop()
    assert one["model_sha256"] == on_two["model_sha256"] == resumed["model_sha256"]
    assert one["final_test_acc"] == on_two["final_test_acc"] == resumed["final_test_acc"]
    # (a private run withholds train_loss: its rows are compared on what they hold)
    losses = [r.get("train_loss") for r in metrics(tmp_path / "one")]
    assert losses == [r.get("train_loss") for r in metrics(tmp_path / "two")]
    assert losses == [r.get("train_loss") for r in metrics(tmp_path / "stopped")]
    return one, on_two, resumed


def assert_refused(config: Path, run: Path, overrides, says: str) -> None:
    """`distfl train` refuses `overrides` before any work: exit 2, one line naming `says`, no run dir."""
    proc = run_cli(["train", str(config), f"output.dir={run}", *overrides])
    assert proc.returncode == 2, proc.stderr
    assert says in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not run.exists()


def build_trainer(config: Path | None, out_dir: Path, *overrides: str):
    """A one-rank CPU Trainer of CONFIG (None: every key's default) with OVERRIDES, writing to OUT_DIR;
    nothing trained yet."""
    from distfl import dist
    from distfl.config import load_config
    from distfl.federation.runner import Trainer

    return Trainer(load_config(None if config is None else str(config), [*overrides, f"output.dir={out_dir}"]),
                   dist.init("cpu", 1))


def record_client_models(trainer) -> list:
    """Wrap the algorithm's client_statistics to record (client model after local training, aggregation
    weight) of every client of a round, in the order the clients ran."""
    seen = []
    inner = trainer.algorithm.client_statistics

    def recording(run, worker, stats):
        seen.append((worker.params.detach().clone(), run.weight))
        inner(run, worker, stats)

    trainer.algorithm.client_statistics = recording
    return seen


def summary(run_dir: Path) -> dict:
    return json.loads((Path(run_dir) / "summary.json").read_text())


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def assert_packs_train_as_one_at_a_time(config: Path, tmp_path: Path, pack: int, *overrides: str) -> None:
    """Round 1 of `config` in packs of `pack` clients (torch.func) moves the model as one client at a
    time does, up to float rounding."""
    import torch

    params = {}
    for size in (1, pack):
        trainer = build_trainer(config, tmp_path / f"pack{size}", f"runtime.pack_size={size}", *overrides)
        try:
            assert trainer.pack_size == size
            start = trainer.global_params.clone()
            trainer.run_round(1)
            params[size] = trainer.global_params.clone()
            assert not torch.equal(params[size], start)
        finally:
            trainer.close()
    torch.testing.assert_close(params[pack], params[1], rtol=1e-4, atol=1e-6)


@pytest.fixture
def small_config(tmp_path) -> Path:
    return write_config(tmp_path / "small.yaml")


def env_with_sitecustomize(tmp_path: Path, code: str, **extra: str) -> dict:
    """An environment in which every Python (the launcher's, each rank's) runs `code` at start-up: a
    sitecustomize.py on PYTHONPATH, before the repository. For faults that only a real process shows."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(code)
    return {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{REPO}", "OMP_NUM_THREADS": "1", **extra}


# In each rank (RANK is set by torchrun), round 1 takes 40 s, longer than the 30 s torchrun's agent
# grants its ranks after a SIGTERM, and marks its start in $SLOW_ROUND_MARKS.
SLOW_FIRST_ROUND = """
import os
if "RANK" in os.environ and "SLOW_ROUND_MARKS" in os.environ:
    import time
    from pathlib import Path
    from distfl.federation import runner

    _run_round = runner.Trainer.run_round

    def run_round(self, round_idx):
        if round_idx == 1:
            (Path(os.environ["SLOW_ROUND_MARKS"]) / f"rank{os.environ['RANK']}").touch()
            time.sleep(40)
        return _run_round(self, round_idx)

    runner.Trainer.run_round = run_round
"""


def slow_first_round(tmp_path: Path) -> tuple[dict, Path]:
    """(environment, marks folder) for runs whose round 1 takes 40 s on every rank."""
    marks = tmp_path / "marks"
    marks.mkdir()
    return env_with_sitecustomize(tmp_path, SLOW_FIRST_ROUND, SLOW_ROUND_MARKS=str(marks)), marks


def wait_for_marks(marks: Path, count: int, timeout_s: float = 240) -> None:
    import time

    deadline = time.time() + timeout_s
    while time.time() < deadline and len(list(marks.iterdir())) < count:
        time.sleep(0.2)
    assert len(list(marks.iterdir())) == count, f"only {len(list(marks.iterdir()))} of {count} ranks started round 1"


class MethodFixture:
    """A method built as a run builds it (wrapped in the features its config asks for), without a run
    directory: a model of the config's architecture on CPU, and `clients` clients of `samples` samples
    each (labels cycling through the classes, inputs drawn from the seed), which can train."""

    def __init__(self, overrides, clients: int, samples: int, input_shape, num_classes: int):
        import types

        import numpy as np
        import torch

        from distfl.algorithms import build_algorithm
        from distfl.config import load_config
        from distfl.federation.local import FlatModel
        from distfl.federation.population import Population
        from distfl.models import build_model

        self.cfg = load_config(None, ["data.dataset=synthetic", "model.name=mlp", *overrides])
        labels = np.arange(clients * samples) % num_classes
        self.population = Population(np.split(np.arange(clients * samples), clients), labels, num_classes)
        inputs = torch.randn(clients * samples, *input_shape, generator=torch.Generator().manual_seed(self.cfg.seed))
        self.data = types.SimpleNamespace(train_x=inputs, train_y=torch.from_numpy(labels), augment=None)
        torch.manual_seed(self.cfg.seed)
        self.worker = FlatModel(build_model(self.cfg.model, input_shape, num_classes))
        self.global_params = self.worker.params.detach().clone()
        self.global_buffers = self.worker.buffers.detach().clone()
        noise = None if self.cfg.privacy.mechanism == "none" else self.cfg.privacy.noise_multiplier
        self.method = build_algorithm(self.cfg, self.population, self.worker, torch.device("cpu"),
                                      lambda: build_model(self.cfg.model, input_shape, num_classes), noise)

    def client_run(self, client: int, round_idx: int = 1, cohort=None):
        """A ClientRun of `client` in `cohort` (default: every client), from the current global model, bound
        to the client's data and the method's hooks (`run.train()` takes its local SGD steps)."""
        import torch

        from distfl.federation.local import ClientRun, LocalSGD, local_steps

        cohort = list(range(len(self.population))) if cohort is None else cohort
        n, train = int(self.population.sizes[client]), self.cfg.train
        indices = torch.as_tensor(self.population.indices[client])
        return ClientRun(client_id=client, round_idx=round_idx, num_samples=n,
                         weight=self.method.client_weight(client, cohort),
                         steps=local_steps(n, train.batch_size, train.local_epochs, train.local_steps,
                                           self.worker.fold_single),
                         global_params=self.global_params, state=self.method.init_client_state(),
                         sgd=LocalSGD(self.worker, self.data, indices, train, self.method))

    def train(self, run):
        """`run`'s local training as a round runs it (the global model loaded, the method's begin_client and
        local_training, the client's keyed RNG): the worker then holds the client's model. Returns `run`."""
        from distfl.federation.local import train_client

        return next(train_client(self.worker, self.data, [run.sgd.indices], [run], self.cfg.train, self.method,
                                 self.global_buffers))


@pytest.fixture
def method_fixture():
    """`method_fixture(*overrides, clients=4, samples=8, input_shape=(1, 8, 8), num_classes=4)`: a
    MethodFixture, for testing a method's hooks without a Trainer."""

    def build(*overrides, clients: int = 4, samples: int = 8, input_shape=(1, 8, 8), num_classes: int = 4):
        return MethodFixture(overrides, clients, samples, input_shape, num_classes)

    return build


def trained_model(run_dir: Path):
    """The run's config, data and model of its first checkpoint of a training round (the last one when
    checkpoint.every=0), loaded into a FlatModel: (cfg, data, model, flat)."""
    from distfl.checkpoint import complete_checkpoints, load
    from distfl.config import load_config
    from distfl.data.datasets import load_dataset
    from distfl.federation.local import FlatModel
    from distfl.models import build_model

    cfg = load_config(str(run_dir / "config.yaml"))
    data = load_dataset(cfg.data, cfg.seed)
    state = load(next(p for p in complete_checkpoints(run_dir) if p.name.startswith("round_")), "cpu")
    model = build_model(cfg.model, data.input_shape, data.num_classes)
    flat = FlatModel(model)
    flat.load(state["params"], state["buffers"])
    return cfg, data, model, flat

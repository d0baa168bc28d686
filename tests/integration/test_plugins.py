"""A researcher's own method, model, data and partition, in a package outside distfl (written into a temp
directory): loaded by import path or entry point, exact on 1 and 2 ranks, across resume, in a sweep over a
plugin option, and refused with a clear error when wrong."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import SMALL, metrics, run_cli, summary, train_ok, write_config
from distfl.config import load_config
from distfl.errors import ConfigError, DataError, DistflError

REPO_DOCS = Path(__file__).resolve().parents[2] / "docs" / "extending.md"


def guide_block(module: str) -> str:
    """The code block of docs/extending.md marked as mylab/<module>: the guide's example is what we run."""
    text = REPO_DOCS.read_text()
    marker = f"<!-- tests/integration/test_plugins.py runs this block as mylab/{module} -->\n```python\n"
    return text[text.index(marker) + len(marker):].split("```", 1)[0]


METHODS = guide_block("methods.py") + '''

@dataclass
class ProxOptions:
    mu: float = field(default=0.01, metadata={"range": ">= 0"})


class Prox(distfl.Algorithm):
    """FedProx again: the gradient of mu/2 ||w - w_global||^2."""
    Options = ProxOptions

    def correct_gradient(self, w, g, run):
        g.add_(w - run.global_params, alpha=self.options.mu)


class NotAMethod:
    pass


class Undeclared(distfl.Algorithm):
    """Adds a statistic it never declared in segments()."""

    def client_statistics(self, run, worker, stats):
        super().client_statistics(run, worker, stats)
        stats.add("extra", torch.ones(1))


class Forgetful(distfl.Algorithm):
    """Keeps client state but forgets `stateful = True`."""

    def init_client_state(self):
        return {"n": torch.zeros(())}

    def correct_gradient(self, w, g, run):
        g.mul_(1.0 + float(run.state["n"]))


class Huge(distfl.Algorithm):
    """Adds a count far beyond what a fixed-point segment without a bound holds (2^13 at 2^-40)."""

    def segments(self):
        return super().segments() + [distfl.Segment("count", 1)]

    def client_statistics(self, run, worker, stats):
        super().client_statistics(run, worker, stats)
        stats.add("count", run.num_samples * 1e6)


class PerRankNoise(distfl.Algorithm):
    """A server step drawing from the global RNG, whose state differs between ranks (each seeded it for
    its own clients last)."""

    def server_direction(self, params, reduced):
        return super().server_direction(params, reduced) + 1e-3 * torch.randn_like(params)
'''

MODELS = guide_block("models.py") + '''

def classifier(input_shape, num_classes):
    import distfl

    return distfl.Classifier(nn.Sequential(nn.Flatten(), nn.Linear(50, 16), nn.ReLU()), 16, num_classes)


def plain(input_shape, num_classes):
    return nn.Linear(50, num_classes)
'''

ENTRY_POINTS = '''
[distfl.algorithms]
labprox = mylab.methods:Prox
labdamped = mylab.methods:Damped

[distfl.models]
labnet = mylab.models:build
'''


@pytest.fixture(scope="module")
def plugin_dir(tmp_path_factory):
    """The package `mylab` (methods, a model) with an installed-looking dist-info, the npz dataset and a
    partition file written by our own small writer; on sys.path for this module's in-process runs."""
    root = tmp_path_factory.mktemp("plugin")
    (root / "mylab").mkdir()
    (root / "mylab" / "__init__.py").write_text("")
    (root / "mylab" / "methods.py").write_text(METHODS)
    (root / "mylab" / "models.py").write_text(MODELS)
    info = root / "mylab-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mylab\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)

    rng = np.random.RandomState(7)
    means = rng.rand(6, 2, 5, 5).astype(np.float32)

    def split(n):
        y = rng.randint(0, 6, n)
        return (means[y] + 0.4 * rng.randn(n, 2, 5, 5)).astype(np.float32), y.astype(np.int64)

    (x_train, y_train), (x_test, y_test) = split(480), split(120)
    np.savez(root / "data.npz", x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
    # Eight clients of uneven sizes, each a contiguous run of one fixed permutation (as a writer split).
    order = rng.permutation(480)
    # Clients 0, 2 and 4 (17, 49, 81 samples) end each pass with one sample at batch size 16, which the guide's
    # BatchNorm1d cannot train on alone: distfl folds it into the batch before (docs/extending.md).
    cuts = np.cumsum([17, 35, 49, 66, 81, 60, 90])
    np.savez(root / "split.npz", **{f"client_{i}": p.astype(np.int64) for i, p in enumerate(np.split(order, cuts))})

    sys.path.insert(0, str(root))
    yield root
    sys.path.remove(str(root))
    for name in [m for m in sys.modules if m == "mylab" or m.startswith("mylab.")]:
        del sys.modules[name]


def own_config(tmp_path, plugin_dir):
    """Everything of the researcher's own: data, split, model (with BatchNorm, FedBN, the sphere head), method."""
    return write_config(
        tmp_path / "own.yaml",
        data={"dataset": "files", "path": str(plugin_dir / "data.npz")},
        partition={"scheme": "file", "path": str(plugin_dir / "split.npz"), "num_clients": 8},
        model={"name": "mylab.models:build", "head": "sphere"},
        aggregation={"fedbn": True},
        algorithm={"name": "mylab.methods:Damped", "options": {"beta": 0.5}},
        train={"rounds": 6, "clients_per_round": 3, "lr": 0.1, "batch_size": 16})


def test_correct_gradient_plugin_equals_builtin_fedprox(tmp_path, small_config, plugin_dir):
    """FedProx written out of tree gives the built-in FedProx's model bit for bit: by import path on 1 rank,
    by its entry-point name on 2 ranks, and resumed."""
    prox = ["algorithm.options.mu=0.1", "train.momentum=0.9"]
    builtin = train_ok(small_config, f"output.dir={tmp_path / 'builtin'}", "algorithm.name=fedprox",
                       "algorithm.mu=0.1", "train.momentum=0.9")
    path = train_ok(small_config, f"output.dir={tmp_path / 'path'}", "algorithm.name=mylab.methods:Prox", *prox)
    entry = train_ok(small_config, f"output.dir={tmp_path / 'entry'}", "algorithm.name=labprox", *prox,
                     nproc=2, paths=[plugin_dir])
    train_ok(small_config, f"output.dir={tmp_path / 'resumed'}", "algorithm.name=labprox", *prox, "train.rounds=3")
    resumed = train_ok(small_config, "train.rounds=6", resume=str(tmp_path / "resumed"))
    fedavg = train_ok(small_config, f"output.dir={tmp_path / 'fedavg'}", "train.momentum=0.9")
    assert entry["world_size"] == 2
    assert path["model_sha256"] == entry["model_sha256"] == resumed["model_sha256"] == builtin["model_sha256"]
    assert fedavg["model_sha256"] != builtin["model_sha256"]  # mu = 0.1 changes the model


def test_own_method_model_data_and_split_one_rank_two_ranks_resumed(tmp_path, plugin_dir):
    """A stateful plugin method with its own segment, a plugin model with FedBN and the sphere head, an npz
    dataset and a partition file: 1 rank == 2 ranks (the model by its entry-point name there, client state
    on disk and balanced placement) == stopped at round 3 and resumed."""
    config = own_config(tmp_path, plugin_dir)
    one = train_ok(config, f"output.dir={tmp_path / 'one'}")
    two = train_ok(config, f"output.dir={tmp_path / 'two'}", "model.name=labnet", "runtime.client_state=disk",
                   nproc=2, paths=[plugin_dir])
    train_ok(config, f"output.dir={tmp_path / 'resumed'}", "train.rounds=3")
    resumed = train_ok(config, "train.rounds=6", resume=str(tmp_path / "resumed"))
    assert two["world_size"] == 2
    assert one["model_sha256"] == two["model_sha256"] == resumed["model_sha256"]
    assert [r["train_loss"] for r in metrics(tmp_path / "one")] == [r["train_loss"] for r in metrics(tmp_path / "resumed")]

    # The method's own all_reduced statistic, recomputed from the cohorts independently.
    from distfl.federation.population import Population

    split = np.load(plugin_dir / "split.npz")
    labels = np.load(plugin_dir / "data.npz")["y_train"]
    population = Population([split[f"client_{i}"] for i in range(8)], labels, 6)
    visits, expected = [0] * 8, []
    for t in range(1, 7):
        cohort = population.cohort(SMALL["seed"], t, 3, "random")
        expected.append(sum(visits[c] for c in cohort) / 3)
        for c in cohort:
            visits[c] += 1
    assert [r["mean_visits"] for r in metrics(tmp_path / "one")] == expected
    assert [r["mean_visits"] for r in metrics(tmp_path / "two")] == expected
    assert max(expected) > 0


def test_partition_file_is_used_as_it_is(tmp_path, plugin_dir):
    from distfl.data.partition import partition

    cfg = load_config(own_config(tmp_path, plugin_dir))
    parts = partition(np.load(plugin_dir / "data.npz")["y_train"], cfg.partition, 6, cfg.seed)
    split = np.load(plugin_dir / "split.npz")
    assert [p.tolist() for p in parts] == [split[f"client_{i}"].tolist() for i in range(8)]
    assert all(p.dtype == np.int64 for p in parts)


def test_sweep_over_a_plugin_option(tmp_path, plugin_dir):
    """`--grid algorithm.options.beta=...` over the researcher's own method, model, data and split: two
    points, each the same model as a plain run with that option; run again, both are skipped."""
    config = own_config(tmp_path, plugin_dir)
    sweep = ["sweep", config, f"output.dir={tmp_path / 'sweep'}", "--grid", "algorithm.options.beta=0.0,0.9"]
    proc = run_cli(sweep)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    again = run_cli(sweep)
    assert again.returncode == 0 and "running 0 here" in again.stdout, again.stdout + again.stderr
    shas = {}
    for beta in ("0.0", "0.9"):
        point = summary(tmp_path / "sweep" / f"algorithm.options.beta={beta}" / "seed=3")
        plain = train_ok(config, f"output.dir={tmp_path / beta}", f"algorithm.options.beta={beta}")
        assert point["model_sha256"] == plain["model_sha256"]
        shas[beta] = plain["model_sha256"]
    assert shas["0.0"] != shas["0.9"]


def test_print_config_shows_plugin_options_with_defaults(tmp_path, plugin_dir):
    proc = run_cli(["train", write_config(tmp_path / "c.yaml"), "algorithm.name=mylab.methods:Damped",
                    "algorithm.options.beta=0.25", "--print-config"])
    assert proc.returncode == 0, proc.stderr
    assert "  options:\n    beta: 0.25\n    mode: visits\n" in proc.stdout


@pytest.mark.parametrize("overrides,expected", [
    (["algorithm.name=mylab.nope:X"], "algorithm.name='mylab.nope:X': cannot import module 'mylab.nope'"),
    (["algorithm.name=mylab.methods:Nope"], "algorithm.name='mylab.methods:Nope': module 'mylab.methods' has no attribute 'Nope'"),
    (["algorithm.name=mylab.methods:NotAMethod"], "not a subclass of distfl.Algorithm"),
    (["algorithm.name=labprx"], "algorithm.name: unknown choice 'labprx'; did you mean 'labprox'?"),
    (["algorithm.name=mylab.methods:Damped", "algorithm.options.bta=0.5"],
     "unknown key 'algorithm.options.bta'; did you mean 'algorithm.options.beta'? valid keys in 'algorithm.options' "
     "for mylab.methods:Damped: beta, mode"),
    (["algorithm.name=mylab.methods:Damped", "algorithm.options.beta=high"], "algorithm.options.beta must be a number"),
    (["algorithm.name=mylab.methods:Damped", "algorithm.options.beta=2"], "algorithm.options.beta must be in [0, 1], got 2.0"),
    (["algorithm.name=mylab.methods:Damped", "algorithm.options.mode=vists"],
     "algorithm.options.mode: unknown choice 'vists'; did you mean 'visits'?"),
    (["algorithm.options.mu=0.1"], "algorithm.options.mu: algorithm.name=fedavg declares no options"),
    (["model.name=mylab.models:nope"], "model.name='mylab.models:nope': module 'mylab.models' has no attribute"),
    (["data.dataset=files"], "data.dataset=files needs data.path"),
    (["partition.scheme=file", "partition.path=/nonexistent/split.npz"], "partition.path: /nonexistent/split.npz does not exist"),
])
def test_bad_plugin_input_fails_before_any_work(tmp_path, plugin_dir, overrides, expected):
    config = write_config(tmp_path / "c.yaml")
    with pytest.raises(ConfigError) as info:
        load_config(config, overrides)
    assert expected in str(info.value)
    proc = run_cli(["train", config, f"output.dir={tmp_path / 'run'}", *overrides])
    assert proc.returncode == 2 and expected in proc.stderr
    assert not (tmp_path / "run").exists()


def test_partition_file_must_match_num_clients_and_the_training_set(tmp_path, plugin_dir):
    config = own_config(tmp_path, plugin_dir)
    with pytest.raises(ConfigError, match=r"holds 8 clients but partition.num_clients=5; set partition.num_clients=8"):
        load_config(config, ["partition.num_clients=5", "train.clients_per_round=2"])
    np.savez(tmp_path / "bad.npz", client_0=np.array([0, 1]), client_2=np.array([2]))
    with pytest.raises(DistflError, match="client_0 .. client_{N-1}"):
        load_config(config, [f"partition.path={tmp_path / 'bad.npz'}", "partition.num_clients=2", "train.clients_per_round=2"])
    np.savez(tmp_path / "far.npz", client_0=np.array([0, 1]), client_1=np.array([2, 480]))
    proc = run_cli(["train", config, f"output.dir={tmp_path / 'run'}", f"partition.path={tmp_path / 'far.npz'}",
                    "partition.num_clients=2", "train.clients_per_round=2"])
    assert proc.returncode == 2 and "client_1 holds index 480" in proc.stderr and "0..479" in proc.stderr
    assert not (tmp_path / "run").exists()


def test_npz_vectors_image_folders_and_bad_files(tmp_path):
    from PIL import Image

    from distfl.data.datasets import load_dataset
    from distfl.config.schema import DataConfig

    rng = np.random.RandomState(0)
    np.savez(tmp_path / "vec.npz", x_train=rng.rand(10, 7), y_train=np.arange(10) % 3,
             x_test=rng.rand(4, 7), y_test=np.array([0, 1, 2, 2]))
    ds = load_dataset(DataConfig(dataset="files", path=str(tmp_path / "vec.npz")), 0)
    assert ds.input_shape == (1, 1, 7) and ds.num_classes == 3 and ds.train_x.dtype.is_floating_point
    assert np.array_equal(ds.train_x[:, 0, 0].numpy(), rng.__class__(0).rand(10, 7).astype(np.float32))

    for split, count in (("train", 3), ("test", 2)):
        for label in ("cat", "dog"):
            (tmp_path / "tree" / split / label).mkdir(parents=True)
            for i in range(count):
                Image.fromarray(np.full((6, 5, 3), 40 * i, dtype=np.uint8)).save(tmp_path / "tree" / split / label / f"{i}.png")
    ds = load_dataset(DataConfig(dataset="files", path=str(tmp_path / "tree")), 0)
    assert ds.input_shape == (3, 6, 5) and len(ds.train_y) == 6 and len(ds.test_y) == 4 and ds.num_classes == 2
    assert ds.train_y.tolist() == [0, 0, 0, 1, 1, 1] and float(ds.train_x[2].max()) == pytest.approx(80 / 255)

    np.savez(tmp_path / "half.npz", x_train=rng.rand(10, 7), y_train=np.zeros(10, dtype=np.int64))
    with pytest.raises(DataError, match="lacks x_test, y_test"):
        load_dataset(DataConfig(dataset="files", path=str(tmp_path / "half.npz")), 0)
    shutil.rmtree(tmp_path / "tree" / "test")
    with pytest.raises(DataError, match="not an ImageFolder tree"):
        load_dataset(DataConfig(dataset="files", path=str(tmp_path / "tree")), 0)


def test_tensorboard_hparams_hold_the_config_and_final_metrics(tmp_path, small_config):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    run = train_ok(small_config, f"output.dir={tmp_path / 'run'}", "output.tensorboard=true", "algorithm.name=fedprox",
                   "algorithm.options.mu=0.2")
    events = EventAccumulator(str(tmp_path / "run" / "tb"))
    events.Reload()
    contents = events.PluginTagToContent("hparams")
    data = plugin_data_pb2.HParamsPluginData.FromString(contents["_hparams_/session_start_info"])
    hparams = {k: v.string_value or v.number_value for k, v in data.session_start_info.hparams.items()}
    assert hparams["algorithm.name"] == "fedprox" and hparams["algorithm.options.mu"] == 0.2
    assert hparams["train.rounds"] == 6 and hparams["data.dataset"] == "synthetic"
    experiment = plugin_data_pb2.HParamsPluginData.FromString(contents["_hparams_/experiment"]).experiment
    assert {m.name.tag for m in experiment.metric_infos} == {"hparams/final_test_acc", "hparams/final_test_loss",
                                                             "hparams/best_test_acc"}
    final = events.Scalars("hparams/final_test_acc")
    assert [(e.step, e.value) for e in final] == [(6, pytest.approx(run["final_test_acc"]))]


def test_cli_help_and_version():
    import distfl

    proc = run_cli(["sweep", "--help"], subprocess_=True)
    assert proc.returncode == 0 and proc.stdout.startswith("usage: distfl sweep CONFIG")
    assert "distfl train" not in proc.stdout and "--grid KEY=V1,V2" in proc.stdout
    for command in ("train", "calibrate", "partition", "bench", "report"):
        proc = run_cli([command, "--help"], subprocess_=True)
        assert proc.returncode == 0 and proc.stdout.startswith(f"usage: distfl {command} ")
        assert all(line.lstrip().startswith(f"distfl {command} ") for line in
                   proc.stdout.split("\n\n")[0].removeprefix("usage: ").splitlines() if line.lstrip().startswith("distfl"))
    proc = run_cli(["--version"], subprocess_=True)
    assert proc.returncode == 0 and proc.stdout.strip() == f"distfl {distfl.__version__}"


def test_plugin_models_become_classifiers_with_any_head(plugin_dir):
    import torch

    from distfl.models import Classifier, build_model
    from distfl.models.heads import FixedHead
    from distfl.config.schema import ModelConfig
    from mylab.models import build

    torch.manual_seed(0)
    raw = build((2, 5, 5), 6).eval()
    torch.manual_seed(0)
    model = build_model(ModelConfig(name="mylab.models:build"), (2, 5, 5), 6).eval()
    x = torch.randn(3, 2, 5, 5)
    assert torch.equal(model(x), raw(x))  # features = all but the last layer, head = the user's own Linear
    assert isinstance(model.head, torch.nn.Linear) and model.feature_dim == 24

    sphere = build_model(ModelConfig(name="mylab.models:build", head="sphere"), (2, 5, 5), 6)
    assert isinstance(sphere.head, FixedHead) and sphere.feature_norm and sphere.loss_kind == "mse"
    assert sphere(x).shape == (3, 6)
    assert isinstance(build_model(ModelConfig(name="mylab.models:classifier"), (2, 5, 5), 6), Classifier)
    with pytest.raises(ConfigError, match="model.name=mylab.models:plain returned Linear; return a distfl.Classifier"):
        build_model(ModelConfig(name="mylab.models:plain"), (2, 5, 5), 6)


def test_plugin_misuse_ends_in_one_line_naming_it(tmp_path, small_config, plugin_dir):
    """stats.add on an undeclared segment, and a method statistic too large for its segment, end the run
    with one line naming the segment (not "diverged, lower train.lr"); init_client_state without
    `stateful = True` is refused before any work."""
    proc = run_cli(["train", small_config, f"output.dir={tmp_path / 'undeclared'}", "algorithm.name=mylab.methods:Undeclared"])
    assert proc.returncode == 1
    assert ("round 1, local training of client" in proc.stderr and "PluginError: stats.add('extra'): this round has "
            "no segment 'extra'; its segments are loss_sum, samples, nonfinite, clients, stop, delta, buffers. Declare "
            "it in the method's segments()") in proc.stderr
    assert proc.stderr.count("distfl: error:") == 1 and summary(tmp_path / "undeclared")["status"] == "failed"

    proc = run_cli(["train", small_config, f"output.dir={tmp_path / 'huge'}", "algorithm.name=mylab.methods:Huge"])
    assert proc.returncode == 1 and "diverged" not in proc.stderr and "lower train.lr" not in proc.stderr
    assert ("PluginError: round 1: statistic count out of range (sum of |weight| * max|value| above 8.19e+03 on 1 "
            "rank(s)), while the clients' models and losses were finite: algorithm.name=mylab.methods:Huge adds values "
            "its segment cannot hold") in proc.stderr

    proc = run_cli(["train", small_config, f"output.dir={tmp_path / 'forgetful'}", "algorithm.name=mylab.methods:Forgetful"])
    assert proc.returncode == 2 and not (tmp_path / "forgetful").exists()
    assert ("algorithm.name=mylab.methods:Forgetful: Forgetful defines init_client_state but not `stateful = True`"
            in proc.stderr)


def test_a_server_step_on_a_per_rank_rng_is_caught_at_the_first_checkpoint(tmp_path, small_config, plugin_dir):
    one = train_ok(small_config, f"output.dir={tmp_path / 'one'}", "algorithm.name=mylab.methods:PerRankNoise")
    assert one["status"] == "completed"
    proc = run_cli(["train", small_config, f"output.dir={tmp_path / 'two'}", "algorithm.name=mylab.methods:PerRankNoise"],
                   nproc=2, paths=[plugin_dir])
    assert proc.returncode != 0, proc.stdout + proc.stderr  # torchrun answers 1 for a rank that exited 2
    assert proc.stderr.count("distfl: error: the ranks' global models differ at checkpoint round_000002") == 1
    assert "server_update draws from a per-rank or unseeded RNG" in proc.stderr
    assert not (tmp_path / "two" / "checkpoints" / "round_000002").exists()
    assert not list((tmp_path / "two" / "checkpoints").glob(".*partial"))


def test_a_plugin_swept_beside_its_baseline_and_reported_with_it(tmp_path, small_config, plugin_dir):
    """`--grid algorithm.name=fedavg,PLUGIN` with the plugin's option set (fixed) and swept: the option applies
    to the plugin's points only, so fedavg is one point (not one per option value) and the plain fedavg run; each
    plugin point is the plain run with its option. A report of two sweeps (the plugin's options; fedavg) groups
    fedavg by its name, not as "mu=None"."""
    import csv

    mixed = tmp_path / "mixed"
    proc = run_cli(["sweep", small_config, f"output.dir={mixed}", "algorithm.options.mu=0.3", "--grid",
                    "algorithm.name=fedavg,mylab.methods:Prox", "--grid", "algorithm.options.mu=0.01,0.1"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "3 runs in" in proc.stdout
    assert sorted(str(p.parent.relative_to(mixed)) for p in mixed.glob("*/seed=3")) == [
        "algorithm.name=fedavg", "algorithm.name=mylab.methods_Prox,algorithm.options.mu=0.01",
        "algorithm.name=mylab.methods_Prox,algorithm.options.mu=0.1"]
    fedavg = train_ok(small_config, f"output.dir={tmp_path / 'fedavg'}")
    assert summary(mixed / "algorithm.name=fedavg" / "seed=3")["model_sha256"] == fedavg["model_sha256"]
    for mu in ("0.01", "0.1"):
        plain = train_ok(small_config, f"output.dir={tmp_path / mu}", "algorithm.name=mylab.methods:Prox",
                         f"algorithm.options.mu={mu}")
        point = summary(mixed / f"algorithm.name=mylab.methods_Prox,algorithm.options.mu={mu}" / "seed=3")
        assert point["model_sha256"] == plain["model_sha256"] != fedavg["model_sha256"]
    # A typo is still refused, naming the grid's methods and their options.
    typo = run_cli(["sweep", small_config, f"output.dir={tmp_path / 'typo'}", "algorithm.options.mux=0.3", "--grid",
                    "algorithm.name=fedavg,mylab.methods:Prox"])
    assert typo.returncode == 2 and not (tmp_path / "typo").exists()
    assert ("unknown key 'algorithm.options.mux'; did you mean 'algorithm.options.mu'? valid keys in 'algorithm.options' "
            "for mylab.methods:Prox: mu") in typo.stderr
    typo = run_cli(["sweep", small_config, f"output.dir={tmp_path / 'typo'}", "--grid",
                    "algorithm.name=fedavg,mylab.methods:Prox", "--grid", "algorithm.options.mux=0.1,0.3"])
    assert typo.returncode == 2 and not (tmp_path / "typo").exists()
    assert ("algorithm.options.mux: no method of the grid (algorithm.name=fedavg,mylab.methods:Prox) declares it; did "
            "you mean 'algorithm.options.mu'? (their options: mu)") in typo.stderr
    # Run again: every point is finished, none is re-planned.
    again = run_cli(["sweep", small_config, f"output.dir={mixed}", "algorithm.options.mu=0.3", "--grid",
                     "algorithm.name=fedavg,mylab.methods:Prox", "--grid", "algorithm.options.mu=0.01,0.1"])
    assert again.returncode == 0 and "running 0 here" in again.stdout, again.stdout + again.stderr

    options = tmp_path / "options"
    base = tmp_path / "base"
    assert run_cli(["sweep", small_config, f"output.dir={options}", "algorithm.name=mylab.methods:Prox",
                    "--grid", "algorithm.options.mu=0.01,0.1"]).returncode == 0
    assert run_cli(["sweep", small_config, f"output.dir={base}", "--grid", "train.lr=0.1"]).returncode == 0
    proc = run_cli(["report", options, base, "--out", tmp_path / "report"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with open(tmp_path / "report" / "report.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["algorithm.name"], r["algorithm.options.mu"], r["train.lr"]) for r in rows] == [
        ("fedavg", "", "0.1"), ("mylab.methods:Prox", "0.01", "0.1"), ("mylab.methods:Prox", "0.1", "0.1")]
    table = (tmp_path / "report" / "report.md").read_text()
    assert "| fedavg | - | 0.1 |" in table and "None" not in table

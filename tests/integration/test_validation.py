"""Bad config values and inputs are refused before any work, with one line (issue 27, config half).

Every float key beyond float32, every int key beyond its limit, quoted numbers, YAML nested too deeply,
a model.name that is not a model builder, unreadable .npz files, `distfl calibrate` with other keys,
and the `distfl` console script importing a plugin from the current directory. The keys are enumerated
from the schema, so a key added later is covered without touching this file."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from conftest import REPO, run_cli, summary, train_ok, write_config
from distfl.config import config_to_dict, load_config
from distfl.config.schema import KEYS
from distfl.errors import ConfigError
from distfl.config.values import FLOAT32_MAX, INT_MAX

FLOAT_KEYS = [name for name, key in KEYS.items() if key.type is float]
INT_KEYS = [name for name, key in KEYS.items() if key.type is int]


def refused_before_any_work(tmp_path: Path, *args, config: Path | None = None) -> str:
    """Run `distfl train CONFIG ARGS` in this process: exit 2, no run directory, one error line (returned)."""
    run_dir = tmp_path / "run"
    config = config or write_config(tmp_path / "small.yaml")
    proc = run_cli(["train", config, *map(str, args), f"output.dir={run_dir}"])
    assert proc.returncode == 2, proc
    assert not run_dir.exists()
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("distfl: error: "), proc.stderr
    return lines[0]


def test_the_schema_has_keys_of_each_type():
    """The parametrizations below enumerate the schema: they must find what they are meant to cover."""
    assert {"train.lr", "server.lr", "server.eps", "partition.alpha", "privacy.clip_norm"} <= set(FLOAT_KEYS)
    assert {"data.synthetic_train", "model.mlp_hidden", "train.local_steps", "runtime.threads"} <= set(INT_KEYS)
    assert {name for name, key in KEYS.items() if key.limit or key.seed_max} <= set(INT_KEYS)


# ---- 1: float keys -------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["1e39", "1e300"])
@pytest.mark.parametrize("key", FLOAT_KEYS)
def test_every_float_key_beyond_float32_is_refused_before_any_work(tmp_path, key, value):
    line = refused_before_any_work(tmp_path, f"{key}={value}")
    assert f"{key}={float(value)!r} is beyond float32" in line


@pytest.mark.filterwarnings("ignore::distfl.config.ConfigWarning")
@pytest.mark.parametrize("key", FLOAT_KEYS)
def test_float32_bounds_of_every_float_key(key):
    """The largest float32 passes the float32 rule (a key's own range may still refuse it); the next
    float64 above it and a positive value that rounds to 0 in float32 are refused, naming the key."""
    try:
        load_config(None, [f"{key}={FLOAT32_MAX!r}"])
    except ConfigError as e:  # its range ([0, 1), ...), for server.eps its square, or a rule of the key's own
        # (train.virtual_time_s needs a system model)
        assert "beyond float32" not in str(e) and str(e).startswith((f"{key} must be", f"{key}={FLOAT32_MAX!r}: its square",
                                                                     f"{key}={FLOAT32_MAX:g} is a budget"))
    for value, says in [(float(np.nextafter(FLOAT32_MAX, np.inf)), "is beyond float32"),
                        (1e-46, "rounds to 0 in float32")]:
        with pytest.raises(ConfigError, match=re.escape(f"{key}={value!r} {says}")):
            load_config(None, [f"{key}={value!r}"])


@pytest.mark.parametrize("overrides,says", [
    (["algorithm.name=feddyn", "algorithm.options.alpha=1e-39"],
     "algorithm.options.alpha=1e-39: 1 / alpha (FedDyn's server step) = 1e+39"),
    (["algorithm.name=fedadc", "algorithm.options.kd_lambda=0.35", "algorithm.options.kd_temperature=1e-40"],
     "algorithm.options.kd_temperature=1e-40: 1 / kd_temperature"),
    (["algorithm.name=fedfor", "algorithm.options.alpha=1e10", "train.lr=1e-30"],
     "alpha / train.lr (FedFOR's penalty weight) = 1e+40"),
    (["algorithm.name=tct", "tct.stage1=feddyn", "algorithm.options.alpha=1e-39"], "1 / alpha (FedDyn's server step)"),
    (["server.eps=1e30"], "server.eps=1e+30: its square"),
])
def test_quantities_formed_from_float_keys_must_be_finite_in_float32(tmp_path, overrides, says):
    assert says in refused_before_any_work(tmp_path, *overrides)


def test_derived_quantities_only_count_for_the_method_that_forms_them():
    """FedDyn's 1 / alpha is not formed by FedAvg: a tiny (old-style) algorithm.alpha there is only ignored
    (a warning), and FedFOR's alpha is not FedDyn's."""
    with pytest.warns(UserWarning, match="algorithm.alpha is set but only used by"):
        assert load_config(None, ["algorithm.alpha=1e-39"]).algorithm.options == {}
    assert load_config(None, ["algorithm.name=fedfor", "algorithm.options.alpha=1e-39"]).algorithm.options["alpha"] == 1e-39


def test_a_plugin_option_beyond_float32_is_refused(tmp_path, monkeypatch):
    (tmp_path / "bigopt.py").write_text(
        "from dataclasses import dataclass\nimport distfl\n\n"
        "@dataclass\nclass Options:\n    strength: float = 1.0\n\n"
        "class Method(distfl.Algorithm):\n    Options = Options\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load_config(None, ["algorithm.name=bigopt:Method", "algorithm.options.strength=2.5"]) \
        .algorithm.options == {"strength": 2.5}
    with pytest.raises(ConfigError, match=r"algorithm.options.strength=1e\+39 is beyond float32"):
        load_config(None, ["algorithm.name=bigopt:Method", "algorithm.options.strength=1e39"])


# ---- 2: int keys ---------------------------------------------------------------------------------------
def largest(key: str) -> int:
    return KEYS[key].seed_max or KEYS[key].limit or INT_MAX


@pytest.mark.parametrize("key", INT_KEYS)
def test_every_int_key_above_its_limit_is_refused_before_any_work(tmp_path, key):
    value = max(2**31, largest(key) + 1)
    assert f"{key} must be at most {largest(key)}" in refused_before_any_work(tmp_path, f"{key}={value}")
    if largest(key) < 2**31:
        line = refused_before_any_work(tmp_path, f"{key}={largest(key) + 1}")
        assert f"{key} must be at most {largest(key)}, got {largest(key) + 1}" in line


# Keys whose limit another key bounds further: a cohort is at most partition.num_clients.
BOUNDED_BY_ANOTHER_KEY = ("train.clients_per_round",)


@pytest.mark.filterwarnings("ignore::distfl.config.ConfigWarning")
@pytest.mark.parametrize("key", [k for k in INT_KEYS if k not in BOUNDED_BY_ANOTHER_KEY])
def test_every_int_key_at_its_limit_passes_validation(key):
    # A key that acts only beside another setting is set with it (else it is refused for that reason).
    companions = {"eval.finetune_epochs": ["eval.clients=true"]}.get(key, [])
    cfg = config_to_dict(load_config(None, [f"{key}={largest(key)}", *companions]))
    section, _, leaf = key.rpartition(".")
    assert (cfg[section] if section else cfg)[leaf] == largest(key)


def test_the_synthetic_dataset_is_bounded_as_a_whole(tmp_path):
    line = refused_before_any_work(tmp_path, "data.synthetic_train=100000000", "data.synthetic_image_size=8")
    assert "the synthetic dataset would hold 6,400,032,000 float32 values" in line and "more than 268,435,456 (1 GiB)" in line
    # Each key is within its own limit; another dataset ignores them.
    assert load_config(None, ["data.dataset=fmnist", "data.synthetic_train=100000000"]).data.synthetic_train == 10**8


# ---- 3: quoted numbers ------------------------------------------------------------------------------------
def test_a_quoted_number_means_what_it_means_unquoted(tmp_path):
    quoted = tmp_path / "quoted.yaml"
    quoted.write_text('train:\n  rounds: "6"\n  lr: "0.05"\n  weight_decay: "1e-4"\n'
                      'data:\n  download: "false"\nseed: "3"\n')
    plain = tmp_path / "plain.yaml"
    plain.write_text("train:\n  rounds: 6\n  lr: 0.05\n  weight_decay: 1e-4\ndata:\n  download: false\nseed: 3\n")
    cfg = load_config(str(quoted))
    assert config_to_dict(cfg) == config_to_dict(load_config(str(plain)))
    assert (cfg.train.rounds, cfg.train.lr, cfg.train.weight_decay, cfg.data.download, cfg.seed) == \
        (6, 0.05, 1e-4, False, 3)
    assert type(cfg.train.rounds) is int and type(cfg.train.lr) is float
    # The same through overrides (the shell keeps the quotes when they are quoted themselves).
    cfg = load_config(None, ['train.rounds="6"', "train.lr='0.05'"])
    assert (cfg.train.rounds, cfg.train.lr) == (6, 0.05)


@pytest.mark.parametrize("override,says", [
    ('train.rounds="6.0"', "train.rounds must be an integer, got '6.0' (str)"),
    ("train.rounds=6.0", "train.rounds must be an integer, got 6.0 (float)"),
    ('train.rounds="0x10"', "train.rounds must be an integer, got '0x10' (str)"),
    ('train.lr="fast"', "train.lr must be a number, got 'fast' (str)"),
    ('train.lr=" 0.05"', "train.lr must be a number"),
    ('train.lr=".inf"', "train.lr must be a finite number"),
    ('train.lr="1e39"', "train.lr=1e+39 is beyond float32"),
    ('data.download="yes"', "data.download must be true or false, got 'yes' (str)"),
])
def test_a_quoted_value_is_refused_exactly_when_its_unquoted_text_is(tmp_path, override, says):
    assert says in refused_before_any_work(tmp_path, override)


def test_the_rules_are_in_the_config_reference():
    text = (REPO / "docs" / "config.md").read_text()
    assert "A quoted number\n(`\"0.05\"`," in text and "every float key must be finite in float32" in text
    assert "| `model.mlp_hidden` | int | `64` | >= 1, <= 8192 |" in text


# ---- 4: inputs -----------------------------------------------------------------------------------------
DEEP = {"flow": "train: " + "[" * 5000 + "]" * 5000 + "\n",
        "block": "".join("  " * i + f"k{i}:\n" for i in range(5000)),
        "in a section": "train:\n  lr: " + "{a: " * 5000 + "1" + "}" * 5000 + "\n"}


@pytest.mark.parametrize("shape", list(DEEP))
def test_yaml_nested_thousands_deep_is_one_line(tmp_path, shape):
    config = tmp_path / "deep.yaml"
    config.write_text(DEEP[shape])
    line = refused_before_any_work(tmp_path, config=config)
    assert f"cannot parse config file {config} as YAML: nested deeper than 64 levels" in line
    assert re.search(r"\(line \d+, column \d+\)$", line)


def test_an_override_nested_thousands_deep_is_one_short_line(tmp_path):
    line = refused_before_any_work(tmp_path, "train.lr=" + "[" * 5000 + "]" * 5000)
    assert "train.lr must be a number, got '[[[[" in line and "(10002 characters) (str) in override 'train.lr=[[[[" in line
    assert len(line) < 250


def test_a_saved_config_nested_thousands_deep_is_one_line_on_resume(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(DEEP["flow"])
    proc = run_cli(["train", "--resume", run_dir])
    assert proc.returncode == 2
    assert proc.stderr.strip() == (f"distfl: error: --resume: cannot read {run_dir / 'config.yaml'}: it is nested "
                                   "too deeply to be a distfl config; it is the run's config as distfl wrote it: "
                                   "restore it (every checkpoint's state.pt holds it too)")


def test_model_name_must_be_a_model_class_or_factory(tmp_path, monkeypatch):
    line = refused_before_any_work(tmp_path, "model.name=os:system")
    assert "model.name='os:system' is <built-in function system>, not a model class or factory" in line
    (tmp_path / "shapes.py").write_text(
        "from torch import nn\n\n"
        "def build(input_shape, num_classes):\n    return nn.Sequential(nn.Flatten(), nn.Linear(64, num_classes))\n\n"
        "class Net(nn.Sequential):\n    def __init__(self, input_shape, num_classes, width=8):\n"
        "        super().__init__(nn.Flatten(), nn.Linear(64, width), nn.ReLU(), nn.Linear(width, num_classes))\n\n"
        "def no_arguments():\n    return nn.Linear(64, 10)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for builder in ("shapes:build", "shapes:Net"):  # a function and an nn.Module class
        assert load_config(None, [f"model.name={builder}", "data.dataset=synthetic"]).model.name == builder
    with pytest.raises(ConfigError, match="not a model class or factory"):
        load_config(None, ["model.name=shapes:no_arguments"])


def _npz_cases(tmp_path: Path) -> dict[str, Path]:
    """A good data file and partition file, and each of them empty, truncated and with a damaged member."""
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "data.npz", x_train=rng.random((120, 8), dtype=np.float32), y_train=np.arange(120) % 3,
             x_test=rng.random((30, 8), dtype=np.float32), y_test=np.arange(30) % 3)
    np.savez(tmp_path / "split.npz", **{f"client_{i}": np.arange(i, 120, 4) for i in range(4)})
    cases = {}
    for name in ("data", "split"):
        good = (tmp_path / f"{name}.npz").read_bytes()
        damaged = bytearray(good)
        damaged[len(good) // 3] ^= 0xFF  # inside the first array's bytes: its CRC no longer matches
        for case, data in [("empty", b""), ("truncated", good[: len(good) // 2]), ("damaged", bytes(damaged))]:
            path = cases[f"{name} {case}"] = tmp_path / f"{name}_{case}.npz"
            path.write_bytes(data)
    return cases


@pytest.mark.parametrize("case", [f"{name} {how}" for name in ("data", "split") for how in ("empty", "truncated", "damaged")])
def test_an_unreadable_npz_file_is_one_line_naming_it(tmp_path, case):
    path = _npz_cases(tmp_path)[case]
    key = "data.path" if case.startswith("data") else "partition.path"
    args = ["data.dataset=files", f"data.path={tmp_path / 'data.npz'}", "model.name=mlp",
            "partition.num_clients=4", "train.clients_per_round=2", "partition.scheme=iid"]
    args += [f"data.path={path}"] if key == "data.path" else ["partition.scheme=file", f"partition.path={path}"]
    line = refused_before_any_work(tmp_path, *args)
    assert f"cannot read {key} {path} as an .npz file: " in line
    if case.endswith("empty"):
        assert line.endswith("it is empty (0 bytes)")
    elif case.endswith("truncated"):
        assert "is it truncated?" in line


def test_an_empty_partition_file_is_one_line_even_for_print_config(tmp_path):
    empty = tmp_path / "split.npz"
    empty.write_bytes(b"")
    proc = run_cli(["train", write_config(tmp_path / "c.yaml"), "partition.scheme=file", f"partition.path={empty}",
                    "--print-config"])
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"distfl: error: cannot read partition.path {empty} as an .npz file: it is empty (0 bytes)"


# ---- 5: distfl calibrate ----------------------------------------------------------------------------------
def test_calibrate_refuses_keys_other_than_the_ffc_settings(tmp_path):
    run_dir = tmp_path / "run"
    train_ok(write_config(tmp_path / "c.yaml", train={"rounds": 2}), f"output.dir={run_dir}")
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    for item in ("train.rounds=3", "calibration.method=none", "output.dir=elsewhere"):
        proc = run_cli(["calibrate", run_dir, "calibration.ridge=0.1", item])
        assert proc.returncode == 2
        assert proc.stderr.strip() == (
            "distfl: error: distfl calibrate takes only the FFC settings calibration.ridge, calibration.clients, "
            f"calibration.batch_size; got {item}. To change other keys, continue the run: `distfl train --resume "
            f"{run_dir} calibration.method=ffc KEY=VALUE`")
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before  # summary.json untouched
    assert summary(run_dir)["rounds"] == 2


# ---- 6: the console script imports a plugin from the current directory, as python -m distfl does -------------
PLUGIN = """def build(input_shape, num_classes):
    from torch import nn

    return nn.Sequential(nn.Flatten(), nn.Linear(64, num_classes))
"""


def _console_script(tmp_path: Path) -> Path:
    """A script as pip writes for setup.py's console_scripts entry `distfl` (in a folder of its own, which
    Python puts on sys.path instead of the current directory)."""
    setup = (REPO / "setup.py").read_text()
    entry = re.search(r'"distfl=([\w.]+):(\w+)"', setup)
    assert entry, "setup.py declares the console script distfl=MODULE:FUNCTION"
    script = tmp_path / "bin" / "distfl"
    script.parent.mkdir()
    script.write_text(f"import sys\nfrom {entry[1]} import {entry[2]}\n"
                      f"if __name__ == '__main__':\n    sys.exit({entry[2]}())\n")
    return script


@pytest.mark.parametrize("how", ["console script", "installed console script", "python -m distfl"])
def test_a_plugin_in_the_current_directory_is_found(tmp_path, how):
    work = tmp_path / "work"
    work.mkdir()
    (work / "labmodel.py").write_text(PLUGIN)
    write_config(work / "c.yaml")
    if how == "console script":
        launcher = [sys.executable, str(_console_script(tmp_path))]
    elif how == "installed console script":  # the environment's own, running this checkout's distfl (PYTHONPATH)
        installed = Path(sys.executable).parent / "distfl"
        if not installed.is_file():
            pytest.skip(f"no console script {installed}")
        launcher = [str(installed)]
    else:
        launcher = [sys.executable, "-m", "distfl"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([*launcher, "train", "c.yaml", "model.name=labmodel:build", "--print-config"],
                          cwd=work, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert yaml.safe_load(proc.stdout)["model"]["name"] == "labmodel:build"


# ---- 7: a resume while the disk is still full leaves nothing behind ----------------------------------------
@pytest.fixture
def small_tmpfs(tmp_path):
    """A 120 KB tmpfs (root only): a run fills it while writing its first checkpoint."""
    mount = tmp_path / "mnt"
    mount.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=120k", "tmpfs", str(mount)],
                                           capture_output=True).returncode != 0:
        pytest.skip("mounting a tmpfs needs root")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def test_resumes_on_a_still_full_disk_leave_nothing_behind(tmp_path, small_tmpfs):
    config = write_config(tmp_path / "c.yaml")
    through = train_ok(config, f"output.dir={tmp_path / 'through'}", "train.rounds=8")
    run_dir = small_tmpfs / "run"
    proc = run_cli(["train", config, f"output.dir={run_dir}", "checkpoint.every=1"])
    assert proc.returncode == 1 and "disk full writing" in proc.stderr
    saved = (run_dir / "config.yaml").read_text()
    for _ in range(2):  # train.rounds=8 changes config.yaml, which must be rewritten first
        proc = run_cli(["train", "--resume", run_dir, "train.rounds=8"])
        assert proc.returncode == 1, proc.stderr
        line = proc.stderr.strip().splitlines()[-1]
        assert line.startswith(f"distfl: error: disk full writing {run_dir}"), proc.stderr
        assert sorted(p.name for p in run_dir.rglob(".*") if p.name != ".lock") == []  # no .partial, no .tmpPID
        assert (run_dir / "config.yaml").read_text() in (saved, saved.replace("rounds: 6", "rounds: 8"))  # whole
    subprocess.run(["mount", "-o", "remount,size=20m", str(small_tmpfs)], check=True)
    resumed = train_ok(None, "train.rounds=8", resume=str(run_dir))
    assert resumed["model_sha256"] == through["model_sha256"] and resumed["rounds"] == 8

import dataclasses
import warnings
from pathlib import Path

import pytest
import yaml

from distfl.algorithms import ALGORITHMS
from distfl.config import (
    ConfigWarning,
    apply_overrides,
    config_from_dict,
    config_keys,
    config_to_dict,
    dump_config,
    load_config,
    validate,
)
from distfl.config.schema import KEYS, NUM_CLASSES, Config
from distfl.config.values import in_range
from distfl.config.docs import config_reference_markdown
from distfl.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def write(tmp_path, text, name="cfg.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def error(fn, *args, **kwargs) -> str:
    with pytest.raises(ConfigError) as info:
        fn(*args, **kwargs)
    return str(info.value)


# --- loading ------------------------------------------------------------------------------------------

def test_defaults():
    cfg = load_config(None)
    assert cfg == Config()
    assert cfg._explicit == frozenset()


def test_yaml_then_overrides(tmp_path):
    path = write(tmp_path, "seed: 7\ntrain:\n  rounds: 5\n  lr: 0.1\nalgorithm:\n  name: fedprox\n")
    cfg = load_config(path, ["train.rounds=50", "algorithm.mu=0.5", "data.download=false"])
    assert cfg.seed == 7
    assert cfg.train.rounds == 50  # the override wins over the YAML
    assert cfg.train.lr == 0.1
    assert cfg.algorithm.name == "fedprox"
    assert cfg.algorithm.options == {"mu": 0.5}
    assert cfg.data.download is False
    assert cfg.train.batch_size == Config().train.batch_size
    assert cfg._explicit == {"seed", "train.rounds", "train.lr", "algorithm.name", "algorithm.options",
                             "data.download"}


def test_empty_file_and_empty_section_are_defaults(tmp_path):
    assert load_config(write(tmp_path, "")) == Config()
    assert load_config(write(tmp_path, "train:\n", "b.yaml")) == Config()


def test_float_from_yaml_string_and_int(tmp_path):
    # PyYAML reads 1e-3 (no dot) as the string "1e-3".
    assert yaml.safe_load("x: 1e-3")["x"] == "1e-3"
    cfg = load_config(write(tmp_path, "train:\n  lr: 1e-3\nserver:\n  lr: 2\n"), ["server.eps=1e-8"])
    assert cfg.train.lr == 0.001 and isinstance(cfg.train.lr, float)
    assert cfg.server.lr == 2.0 and isinstance(cfg.server.lr, float)
    assert cfg.server.eps == 1e-8


def test_override_values_are_parsed():
    cfg = load_config(None, ["seed=3", "train.lr=1e-3", "data.download=0", "output.tensorboard=true",
                             "output.dir=2024", "data.root=/tmp/a=b"])
    assert cfg.seed == 3
    assert cfg.train.lr == 0.001
    assert cfg.data.download is False
    assert cfg.output.tensorboard is True
    assert cfg.output.dir == "2024"  # a string key keeps the text
    assert cfg.data.root == "/tmp/a=b"  # only the first '=' splits


def test_apply_overrides_does_not_mutate():
    base = {"train": {"rounds": 5}}
    out = apply_overrides(base, ["train.rounds=9", "model.name=mlp", "seed=1"])
    assert base == {"train": {"rounds": 5}}
    assert out == {"train": {"rounds": 9}, "model": {"name": "mlp"}, "seed": 1}


def test_config_from_dict():
    cfg = config_from_dict({"partition": {"num_clients": 20}}, ["train.clients_per_round=20"])
    assert cfg.partition.num_clients == 20 and cfg.train.clients_per_round == 20
    assert cfg._explicit == {"partition.num_clients", "train.clients_per_round"}


def test_dump_round_trips(tmp_path):
    cfg = load_config(None, ["train.lr=1e-5", "server.optimizer=adam", "data.dataset=synthetic",
                             "output.dir=2024", "model.name=resnet18", "model.norm=gn"])
    text = dump_config(cfg)
    assert list(yaml.safe_load(text)) == [f.name for f in dataclasses.fields(Config)]
    assert load_config(write(tmp_path, text)) == cfg
    assert config_from_dict(yaml.safe_load(text)) == cfg
    assert config_to_dict(cfg)["train"]["lr"] == 1e-5


def test_config_keys():
    keys = config_keys()
    assert "train.rounds" in keys and "seed" in keys and "data.dataset" in keys
    assert "train" not in keys
    assert len(keys) == len(set(keys))
    assert list(KEYS) == keys
    # Every applies-to names a key with choices (or the method), and only those choices.
    for key in KEYS.values():
        if key.applies:
            controller, used_by = key.applies
            valid = KEYS[controller].choices or list(ALGORITHMS)
            assert set(used_by) <= set(valid), key.name
    assert set(KEYS["data.dataset"].choices) == set(NUM_CLASSES) | {"synthetic", "files", "leaf", "tff", "prepared"}
    # A range or a choice list holds the key's own default.
    for key in KEYS.values():
        assert key.choices is None or set(key.default if key.type is list else [key.default]) <= set(key.choices), key.name
        assert key.range is None or in_range(key.default, key.range), key.name


# --- errors -------------------------------------------------------------------------------------------

def test_unknown_key_in_yaml(tmp_path):
    path = write(tmp_path, "train:\n  round: 5\n")
    msg = error(load_config, path)
    assert "'train.round'" in msg and path in msg
    assert "did you mean 'train.rounds'" in msg
    assert "valid keys in 'train': rounds, clients_per_round" in msg


def test_unknown_section_in_yaml(tmp_path):
    path = write(tmp_path, "trian:\n  rounds: 5\n")
    msg = error(load_config, path)
    assert "'trian'" in msg and path in msg and "did you mean 'train'" in msg
    assert "valid top-level keys: seed, data" in msg


def test_unknown_key_in_override():
    msg = error(load_config, None, ["train.round=5"])
    assert "'train.round'" in msg and "override" in msg and "did you mean 'train.rounds'" in msg
    msg = error(load_config, None, ["trian.rounds=5"])
    assert "did you mean 'train.rounds'" in msg
    assert "did you mean" not in error(load_config, None, ["zzzzzz=1"])


def test_section_must_be_mapping(tmp_path):
    msg = error(load_config, write(tmp_path, "train: 5\n"))
    assert "'train'" in msg and "mapping" in msg
    assert "section" in error(load_config, None, ["train=5"])


def test_bad_override_form():
    assert "section.key=value" in error(load_config, None, ["train.rounds"])
    assert "section.key=value" in error(load_config, None, ["=5"])


@pytest.mark.parametrize("override, expected", [
    ("train.rounds=abc", "train.rounds must be an integer, got 'abc' (str)"),
    ("train.rounds=2.0", "train.rounds must be an integer, got 2.0 (float)"),
    ("train.rounds=1.5", "train.rounds must be an integer"),
    ("seed=true", "seed must be an integer, got True (bool)"),
    ("train.lr=fast", "train.lr must be a number, got 'fast' (str)"),
    ("train.lr=true", "train.lr must be a number"),
    ("train.lr=.inf", "train.lr must be a finite number"),
    ("data.download=maybe", "data.download must be true or false"),
    ("data.download=2", "data.download must be true or false"),
])
def test_type_errors_in_overrides(override, expected):
    msg = error(load_config, None, [override])
    assert expected in msg and "override" in msg


def test_type_errors_in_yaml(tmp_path):
    path = write(tmp_path, "model:\n  name: 5\n")
    msg = error(load_config, path)
    assert "model.name must be a string, got 5 (int)" in msg and path in msg
    # A quoted number reads as unquoted (tests/integration/test_validation.py); quoted text that is no integer is refused.
    assert "train.rounds must be an integer" in error(load_config, write(tmp_path, "train: {rounds: '3.5'}\n"))


def test_unknown_choice():
    msg = error(load_config, None, ["model.name=resnet19"])
    assert "model.name: unknown choice 'resnet19'; did you mean 'resnet18'?" in msg
    assert "valid: simplecnn, tct_cnn, lenet5, cifar_cnn, resnet18, resnet20, mlp" in msg
    msg = error(load_config, None, ["algorithm.name=xyz"])
    assert "did you mean" not in msg and "valid: apfl, ditto, fedadc, fedala, fedavg, fedbabu" in msg


@pytest.mark.parametrize("override, expected", [
    ("seed=-1", "seed must be >= 0, got -1"),
    ("partition.num_clients=0", "partition.num_clients must be >= 1"),
    ("partition.alpha=0", "partition.alpha must be > 0"),
    ("train.rounds=0", "train.rounds must be >= 1, got 0"),
    ("train.lr=0", "train.lr must be > 0"),
    ("train.weight_decay=-1e-4", "train.weight_decay must be >= 0"),
    ("train.momentum=1", "train.momentum must be in [0, 1), got 1.0"),
    ("server.beta2=-0.1", "server.beta2 must be in [0, 1)"),
    ("server.eps=0", "server.eps must be > 0"),
    ("checkpoint.every=-1", "checkpoint.every must be >= 0"),
    ("checkpoint.keep=0", "checkpoint.keep must be >= 1"),
    ("data.synthetic_classes=1", "data.synthetic_classes must be >= 2"),
    ("runtime.threads=0", "runtime.threads must be >= 1"),
])
def test_ranges(override, expected):
    assert expected in error(load_config, None, [override])


def test_range_edges_are_allowed():
    cfg = load_config(None, ["seed=0", "checkpoint.every=0", "train.momentum=0", "partition.min_size=0"])
    assert cfg.checkpoint.every == 0


def test_clients_per_round_exceeds_num_clients():
    msg = error(load_config, None, ["partition.num_clients=10", "train.clients_per_round=20"])
    assert msg == ("train.clients_per_round (20) > partition.num_clients (10): "
                   "a round cannot sample more clients than exist")
    load_config(None, ["partition.num_clients=10", "train.clients_per_round=10"])


def test_local_steps_with_several_local_epochs_is_refused():
    msg = error(load_config, None, ["train.local_steps=8", "train.local_epochs=2"])
    assert "train.local_steps=8" in msg and "train.local_epochs=2 would be ignored" in msg
    assert load_config(None, ["train.local_steps=8"]).train.local_steps == 8
    assert "train.local_steps must be >= 0" in error(load_config, None, ["train.local_steps=-1"])


def test_classes_per_client_exceeds_classes():
    msg = error(load_config, None, ["partition.scheme=n_classes", "partition.classes_per_client=11"])
    assert "partition.classes_per_client (11)" in msg and "(10, from data.dataset=fmnist)" in msg
    load_config(None, ["partition.scheme=n_classes", "partition.classes_per_client=10"])
    load_config(None, ["partition.scheme=n_classes", "partition.classes_per_client=11",
                       "data.dataset=cifar100"])

    synthetic = ["data.dataset=synthetic", "data.synthetic_classes=3", "partition.scheme=n_classes"]
    msg = error(load_config, None, synthetic + ["partition.classes_per_client=4"])
    assert "partition.classes_per_client (4)" in msg and "data.synthetic_classes" in msg
    load_config(None, synthetic + ["partition.classes_per_client=3"])


def test_crop_flip_allowed_everywhere():
    for dataset in ["fmnist", "synthetic"]:
        load_config(None, [f"data.dataset={dataset}", "data.augment=crop_flip"])


def test_validate_on_modified_config():
    cfg = load_config(None)
    cfg.train.rounds = 0
    assert "train.rounds" in error(validate, cfg)
    cfg.train.rounds = "5"
    assert "train.rounds must be an integer" in error(validate, cfg)


def test_file_errors(tmp_path):
    missing = str(tmp_path / "nope.yaml")
    assert missing in error(load_config, missing)
    bad = write(tmp_path, "train: [1, 2\n", "bad.yaml")
    assert bad in error(load_config, bad)
    listing = write(tmp_path, "- 1\n- 2\n", "list.yaml")
    msg = error(load_config, listing)
    assert listing in msg and "mapping" in msg


# --- warnings -----------------------------------------------------------------------------------------

def test_warning_for_inapplicable_key():
    with pytest.warns(ConfigWarning, match=r"algorithm.mu is set but only used by algorithm.name "
                                           r"in \[fedprox\]; it is ignored for fedavg"):
        cfg = load_config(None, ["algorithm.mu=0.1"])
    assert cfg.algorithm.options == {}
    with pytest.warns(ConfigWarning, match=r"algorithm.mu is set .* it is ignored for tct"):
        load_config(None, ["algorithm.name=tct", "tct.stage1=fedavg", "algorithm.mu=0.1"])


def test_no_warning_when_applicable_or_default(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_config(None, ["algorithm.name=fedprox", "algorithm.options.mu=0.1"])
        load_config(None, ["algorithm.name=scaffold"])  # mu left at its default
        # TCT's stage 1 reads the options of the method tct.stage1 names.
        load_config(None, ["algorithm.name=tct", "tct.stage1=fedprox", "algorithm.options.mu=0.1"])
        load_config(None, ["algorithm.name=tct", "tct.stage1=scaffold", "algorithm.options.correction=weights"])
        load_config(write(tmp_path, "server:\n  optimizer: adam\n  beta2: 0.8\n"))
        load_config(write(tmp_path, "algorithm:\n  mu: 0.01\n"))  # explicit but equal to the default
        load_config(write(tmp_path, dump_config(load_config(None))))  # a dumped config sets every key


def test_every_inapplicable_key_warns():
    from distfl.algorithms import ALGORITHMS

    cfg = Config()
    for key, (controller, used_by) in ((k, spec.applies) for k, spec in KEYS.items() if spec.applies):
        ignored_by = next(c for c in (KEYS[controller].choices or list(ALGORITHMS)) if c not in used_by)
        section, leaf = key.split(".")
        default = getattr(getattr(cfg, section), leaf)
        # A valid value that differs from the default.
        if KEYS[key].choices:
            value = next(c for c in KEYS[key].choices if c != default)
        elif isinstance(default, bool):
            value = not default
        else:
            value = default + 1 if isinstance(default, int) else 0.25
        assert value != default
        with pytest.warns(ConfigWarning, match=f"{key} is set but only used by {controller}"):
            load_config(None, [f"{controller}={ignored_by}", f"{key}={value}"])


# --- docs ---------------------------------------------------------------------------------------------

def test_docs_in_sync():
    committed = (REPO / "docs" / "config.md").read_text()
    assert committed == config_reference_markdown(), \
        "docs/config.md is stale; regenerate: python -m distfl.config.docs > docs/config.md"


def test_reference_mentions_every_key():
    text = config_reference_markdown()
    for key in config_keys():
        assert f"`{key}`" in text
    assert "local SGD learning rate" in text  # comments come from config/schema.py


# --- hostile or surprising YAML -----------------------------------------------------------------------

def test_alias_bomb_is_refused(tmp_path):
    """Ten levels of aliases under a known key expand to 10^10 nodes (and their repr in an error
    message would never end); aliases are refused before anything is expanded, naming the file and
    the line (were they expanded, this test would not finish)."""
    lines = ["a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 10)]
    bomb = write(tmp_path, "train:\n  lr:\n" + "".join(f"    {line}\n" for line in lines), "bomb.yaml")
    msg = error(load_config, bomb)
    assert "aliases are not accepted" in msg and "line 4" in msg and bomb in msg


@pytest.mark.parametrize("text, expected", [
    ("train:\n  rounds: 5\n  lr: 0.1\n  rounds: 50\n", "duplicate key 'rounds' (first given on line 2)"),
    ("train:\n  rounds: 5\ntrain:\n  lr: 0.1\n", "duplicate key 'train'"),
])
def test_duplicate_keys_are_refused(tmp_path, text, expected):
    path = write(tmp_path, text)
    msg = error(load_config, path)
    assert expected in msg and path in msg


@pytest.mark.parametrize("text, expected", [
    ("train:\n  rounds: 1:30\n", "train.rounds must be an integer, got '1:30'"),  # YAML 1.1: 90
    ("seed: 0x10\n", "seed must be an integer, got '0x10'"),  # YAML 1.1: 16
    ("seed: 010\n", "seed must be an integer, got '010'"),  # YAML 1.1: 8
    ("train:\n  lr: 1:30\n", "train.lr must be a number, got '1:30'"),  # YAML 1.1: 90.0
    ("train:\n  rounds: yes\n", "train.rounds must be an integer, got 'yes'"),
    ("output:\n  tensorboard: yes\n", "output.tensorboard must be true or false, got 'yes'"),
])
def test_yaml11_surprises_do_not_slip_into_a_key(tmp_path, text, expected):
    path = write(tmp_path, text)
    msg = error(load_config, path)
    assert expected in msg and path in msg


def test_yaml11_words_stay_strings_where_strings_are_expected(tmp_path):
    """`on`/`off` are choices of model.feature_norm; YAML 1.1 would read them as booleans."""
    cfg = load_config(write(tmp_path, "model:\n  feature_norm: off\noutput:\n  dir: runs/2024-01-01\n"))
    assert cfg.model.feature_norm == "off" and cfg.output.dir == "runs/2024-01-01"
    assert load_config(None, ["model.feature_norm=on"]).model.feature_norm == "on"
    assert load_config(write(tmp_path, "train:\n  lr: 1e-3\n  rounds: 1_000\n")).train.lr == 0.001


@pytest.mark.parametrize("override, expected", [
    ("seed=4294967296", "seed must be at most 4294967295"),
    ("model.head_seed=18446744073709551616", "model.head_seed must be at most 18446744073709551615"),
    ("tct.coordinate_seed=18446744073709551616", "tct.coordinate_seed must be at most"),
    ("output.dir=", "output.dir must name a directory"),
    ("output.dir=  ", "output.dir must name a directory"),
    ("output.dir=runs/a\0b", "output.dir must name a directory"),
    ("server.eps=1e-23", "server.eps=1e-23: its square"),
    ("server.eps=1e20", "server.eps=1e+20: its square"),
])
def test_values_that_would_crash_later_are_refused(override, expected):
    assert expected in error(load_config, None, [override])


def test_largest_accepted_seeds_work_where_they_are_used():
    """The bounds are the consumers' own: at the bound they accept, one above they raise."""
    import numpy as np
    import torch

    np.random.RandomState(4294967295)
    torch.Generator().manual_seed(18446744073709551615)
    with pytest.raises(ValueError):
        np.random.RandomState(4294967296)
    with pytest.raises((RuntimeError, ValueError)):
        torch.Generator().manual_seed(18446744073709551616)
    load_config(None, ["seed=4294967295", "model.head_seed=18446744073709551615", "server.eps=1e-22"])

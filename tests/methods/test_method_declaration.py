"""A method declares itself once, in its own class: options (with ranges and choices), flags
(personalised, head split, private release, client store) and `check_config`. distfl reads the
declaration at config validation, so a plugin method is refused or accepted before any data loads,
exactly as a built-in one (MOON is written in the form a plugin has)."""
from __future__ import annotations

import sys

import pytest

from conftest import run_cli, write_config

PLUGIN = '''
from dataclasses import dataclass, field

import distfl
from distfl.errors import ConfigError


class Shrink(distfl.Algorithm):
    """A personalised method with a head split and two options."""
    personalised = True
    head_split = True
    why_not_private = "Shrink releases its clients' head norms unclipped"

    @dataclass
    class Options:
        factor: float = field(default=0.5, metadata={"range": "(0, 1]"})  # how much of the update is kept
        mode: str = field(default="all", metadata={"choices": ["all", "body"]})  # which coordinates shrink

    @classmethod
    def check_config(cls, cfg):
        if cls.read_options(cfg).mode == "body" and cfg.train.local_steps == 0:
            raise ConfigError("algorithm.options.mode=body needs train.local_steps > 0 (a fixed number of steps)")
'''


LOADS = []  # one entry per attempt to load the data: the run got past validation


@pytest.fixture
def shrink(tmp_path, monkeypatch):
    (tmp_path / "shrinklab.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "shrinklab", raising=False)
    from distfl.federation import runner

    def no_data(*args, **kwargs):
        LOADS.append(args)
        raise RuntimeError("the data would load here")

    LOADS.clear()
    monkeypatch.setattr(runner, "load_dataset", no_data)
    return write_config(tmp_path / "cfg.yaml", algorithm={"name": "shrinklab:Shrink"}, eval={"every": 3, "clients": True})


def train(config, tmp_path, *overrides):
    """`distfl train` in this process: (exit code, stderr, whether the data was loaded)."""
    proc = run_cli(["train", config, f"output.dir={tmp_path / 'run'}", *overrides])
    return proc.returncode, proc.stderr, bool(LOADS)


@pytest.mark.parametrize("overrides, says", [
    (["algorithm.options.factor=0"], "algorithm.options.factor must be in (0, 1], got 0.0"),
    (["algorithm.options.mode=head"], "algorithm.options.mode: unknown choice 'head'; valid: all, body"),
    (["algorithm.options.mode=body"], "algorithm.options.mode=body needs train.local_steps > 0"),  # check_config
    (["algorithm.options.factr=0.2"], "did you mean 'algorithm.options.factor'?"),
    (["model.head=sphere"], "algorithm.name=shrinklab:Shrink splits the model into a shared body and a learnable "
                            "classifier head; model.head=sphere is fixed"),  # head_split
    (["aggregation.fedbn=true", "model.name=resnet20"], "keeps a personal model part per client already"),  # personalised
    (["eval.finetune_epochs=1"], "algorithm.name=shrinklab:Shrink is personalised"),  # personalised
    (["privacy.mechanism=gaussian", "privacy.noise_multiplier=1", "privacy.delta=1e-5", "algorithm.weighting=uniform",
      "eval.clients=false"], "privacy.mechanism=gaussian: Shrink releases its clients' head norms unclipped; under DP "
                             "use one of fedadc, fedavg, fedfor, fedlc, fedntd, fedprox, slowmo (any server.optimizer)"),  # why_not_private
])
def test_a_plugin_declaration_is_enforced_before_any_data_loads(tmp_path, shrink, overrides, says):
    code, err, loaded = train(shrink, tmp_path, *overrides)
    assert (code, loaded) == (2, False), err
    assert says in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("overrides", [[], ["algorithm.options.mode=body", "train.local_steps=3"],
                                       ["algorithm.options.factor=1"]])
def test_a_plugin_declaration_accepts_what_it_declares(tmp_path, shrink, overrides):
    code, err, loaded = train(shrink, tmp_path, *overrides)
    assert loaded and "the data would load here" in err, err


def test_a_built_in_method_is_declared_the_same_way():
    """MOON is one file: its options, flags and check are its class's, and only its class's."""
    from distfl.algorithms import ALGORITHMS
    from distfl.algorithms.moon import Moon
    from distfl.config import load_config
    from distfl.errors import ConfigError

    assert ALGORITHMS["moon"] is Moon and Moon.stateful and not Moon.private_release
    assert load_config(None, ["algorithm.name=moon", "model.projection_dim=8", "algorithm.options.tau=0.2"]) \
        .algorithm.options == {"mu": 1.0, "tau": 0.2}
    with pytest.raises(ConfigError, match="set model.projection_dim=256"):
        load_config(None, ["algorithm.name=moon"])
    with pytest.raises(ConfigError, match="algorithm.options.tau must be > 0, got 0.0"):
        load_config(None, ["algorithm.name=moon", "model.projection_dim=8", "algorithm.options.tau=0"])


def test_every_built_in_declaration_is_well_formed():
    """Each built-in method's options have a default, a documenting comment and a valid range or choices."""
    import dataclasses

    from distfl.algorithms import ALGORITHMS
    from distfl.config import load_config
    from distfl.config.docs import options_comments

    assert {"fedavg", "fedprox", "moon", "tct", "fedrep"} <= set(ALGORITHMS)
    for name, cls in ALGORITHMS.items():
        assert cls.name == name
        assert cls.private_release or cls.why_not_private or cls.personalised or name in {"moon", "fedexp"}
        if cls.Options is None:
            continue
        comments = options_comments(cls.Options)
        for f in dataclasses.fields(cls.Options):
            assert f.default is not dataclasses.MISSING and comments[f.name], (name, f.name)
        extra = ["model.projection_dim=8"] if name == "moon" else []
        defaults = {f.name: f.default for f in dataclasses.fields(cls.Options)}
        assert load_config(None, [f"algorithm.name={name}", *extra]).algorithm.options == defaults


# Each built-in method's needs, refused by config validation (load_config reads no data) with one line
# naming the key: what the methods' own __init__ found only after the data had loaded.
@pytest.mark.parametrize("overrides, says", [
    (["algorithm.name=fedlc", "model.head=sphere"], "algorithm.name=fedlc calibrates the logits of a softmax "
                                                    "cross-entropy; this model is trained with MSE"),
    (["algorithm.name=fedntd", "model.loss=mse"], "use model.head=linear and model.loss=auto"),
    (["algorithm.name=fedrod", "model.loss=mse"], "algorithm.name=fedrod trains its generic head with a balanced softmax"),
    (["algorithm.name=fedrod", "model.head=fixed_random"], "algorithm.name=fedrod trains the model's classifier head; "
                                                           "model.head=fixed_random is fixed: use model.head=linear"),
    (["algorithm.name=fedala", "model.head=sphere"], "model.head=sphere is fixed: use model.head=linear"),
    (["algorithm.name=fedala", "model.name=resnet20"], "model.name=resnet20 has BatchNorm statistics"),
    (["algorithm.name=perfedavg", "model.name=resnet18"], "algorithm.name=perfedavg takes two or three forward passes"),
    (["algorithm.name=pfedme", "model.name=vgg13"], "model.name=vgg13 has BatchNorm statistics: use a model without "
                                                    "BatchNorm (e.g. model.norm=gn)"),
    (["algorithm.name=pfedme", "algorithm.options.lam=30"], "algorithm.options.personal_lr=0.09 x "
                                                            "algorithm.options.lam=30.0 >= 2"),
    (["algorithm.name=lgfedavg", "model.name=resnet20"], "algorithm.name=lgfedavg keeps the body"),
    (["algorithm.name=lgfedavg", "calibration.method=ffc"], "set calibration.method=none"),
    (["algorithm.name=apfl", "model.name=mobilenetv2"], "algorithm.name=apfl mixes two models"),
    (["algorithm.name=local", "aggregation.mask=gma"], "algorithm.name=local aggregates nothing"),
    (["algorithm.name=fedproto", "aggregation.mask=gma"], "algorithm.name=fedproto aggregates nothing"),
    (["algorithm.name=fedala", "model.name=resnet18", "model.norm=gn"], None),  # accepted: GroupNorm
    (["algorithm.name=fedrod", "model.name=resnet20"], None),  # accepted: FedRoD keeps BatchNorm as FedAvg does
])
def test_a_methods_needs_are_refused_at_validation(overrides, says):
    from distfl.config import load_config
    from distfl.errors import ConfigError

    if says is None:
        load_config(None, overrides)
        return
    with pytest.raises(ConfigError) as refused:
        load_config(None, overrides)
    assert says in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.filterwarnings("ignore:model.norm is set but only used by")
def test_every_built_in_model_has_batchnorm_exactly_when_validation_says():
    """Validation judges BatchNorm from model.name and model.norm: the built models agree, for every norm."""
    import torch

    from distfl.config import load_config
    from distfl.config.schema import KEYS
    from distfl.models import SEQUENCE_MODELS, build_model
    from distfl.models.base import has_batchnorm

    for name in KEYS["model.name"].choices:
        for norm in KEYS["model.norm"].choices:
            cfg = load_config(None, [f"model.name={name}", f"model.norm={norm}"]).model
            shape = (80,) if name in SEQUENCE_MODELS else {"femnist_cnn": (1, 28, 28)}.get(name, (3, 32, 32))
            model = build_model(cfg, shape, 10, torch.zeros(6, 4))  # word vectors: sent140_lstm's (others ignore them)
            built = any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules())
            assert built == has_batchnorm(name, norm), (name, norm)


BN_MODEL = """
from torch import nn


def build(input_shape, num_classes):
    return nn.Sequential(nn.Flatten(), nn.Linear(input_shape[0] * input_shape[1] * input_shape[2], 8),
                         nn.BatchNorm1d(8), nn.Linear(8, num_classes))
"""


def test_a_plugin_models_batchnorm_is_refused_when_the_method_is_built(tmp_path, monkeypatch, method_fixture):
    """Validation cannot see a plugin model's layers: the method's declared need is checked on the built model."""
    from distfl.errors import ConfigError

    (tmp_path / "bnlab.py").write_text(BN_MODEL)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "bnlab", raising=False)
    method_fixture("algorithm.name=fedavg", "model.name=bnlab:build")  # a method without the need builds
    with pytest.raises(ConfigError, match="algorithm.name=pfedme takes K forward passes a step, each of which would "
                                          "update the running statistics; model.name=bnlab:build has BatchNorm"):
        method_fixture("algorithm.name=pfedme", "model.name=bnlab:build")


def test_the_smallest_method_in_the_guide_is_fedprox_as_distfl_has_it():
    from conftest import REPO

    guide = (REPO / "docs" / "extending.md").read_text()
    marker = "<!-- tests/methods/test_method_declaration.py checks this block is distfl/algorithms/fedprox.py -->\n```python\n"
    block = guide[guide.index(marker) + len(marker):].split("```\n", 1)[0]
    assert block == (REPO / "distfl" / "algorithms" / "fedprox.py").read_text()


def test_tct_stage1_offers_the_methods_that_declare_it():
    """tct.stage1's choices are read from the methods' own `tct_stage1` flag (validation, docs, did-you-mean)."""
    from distfl.algorithms import ALGORITHMS
    from distfl.config import load_config
    from distfl.config.schema import KEYS
    from distfl.errors import ConfigError

    assert KEYS["tct.stage1"].choices == [name for name, cls in ALGORITHMS.items() if cls.tct_stage1]
    assert set(KEYS["tct.stage1"].choices) == {"fedavg", "fedprox", "scaffold", "feddyn", "fednova", "fedadc", "slowmo",
                                               "fedfor"}
    with pytest.raises(ConfigError, match="tct.stage1: unknown choice 'moon'; valid: fedadc, fedavg, feddyn"):
        load_config(None, ["algorithm.name=tct", "tct.stage1=moon"])

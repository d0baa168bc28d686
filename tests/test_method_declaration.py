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
                             "use one of fedadc, fedavg, fedfor, fedprox, slowmo (any server.optimizer)"),  # why_not_private
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
    from distfl.config_docs import options_comments

    assert {"fedavg", "fedprox", "moon", "tct", "fedrep"} <= set(ALGORITHMS)
    for name, cls in ALGORITHMS.items():
        assert cls.name == name
        assert cls.private_release or cls.why_not_private or name in {"moon", "fedexp", "fedper", "fedrep", "fedbabu",
                                                                      "ditto", "apfl"}
        if cls.Options is None:
            continue
        comments = options_comments(cls.Options)
        for f in dataclasses.fields(cls.Options):
            assert f.default is not dataclasses.MISSING and comments[f.name], (name, f.name)
        extra = ["model.projection_dim=8"] if name == "moon" else []
        defaults = {f.name: f.default for f in dataclasses.fields(cls.Options)}
        assert load_config(None, [f"algorithm.name={name}", *extra]).algorithm.options == defaults


def test_the_smallest_method_in_the_guide_is_fedprox_as_distfl_has_it():
    from conftest import REPO

    guide = (REPO / "docs" / "extending.md").read_text()
    marker = "<!-- tests/test_method_declaration.py checks this block is distfl/algorithms/fedprox.py -->\n```python\n"
    block = guide[guide.index(marker) + len(marker):].split("```\n", 1)[0]
    assert block == (REPO / "distfl" / "algorithms" / "fedprox.py").read_text()

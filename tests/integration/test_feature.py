"""A feature plugs in by algorithm.features alone (docs/extending.md, Write a feature): a toy one, defined only
here, halves every client's model update and adds a segment of its own (the clients it saw, kept in its
state); it runs FedAvg, SCAFFOLD and FedProx the same on 1 and 2 ranks and resumed, and its halving is the
server step the maths gives."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from distfl import Feature, Segment

HERE = Path(__file__).resolve().parent
TOY = "algorithm.features=[test_feature:HalfUpdate]"  # this file, on the runs' PYTHONPATH


class HalfUpdate(Feature):
    """Each client's "delta" times its option `scale` (0.5 unless algorithm.feature_options.half_update.scale
    says otherwise); one more segment counts the round's clients, and the count of every client the server has
    seen is the feature's state (checkpointed) and a metric of each round."""

    feature_name = "half_update"
    order = 25  # between FedBN (20) and compression (30)

    @dataclass
    class Options:
        scale: float = field(default=0.5, metadata={"range": "> 0"})  # what each client's update is multiplied by

    def __init__(self, inner, cfg, setting):
        super().__init__(inner, cfg, setting)
        self._own(clients_seen=0)

    def contribution(self, name, value, weight, run):
        return (value * self.options.scale, weight) if name == "delta" else (value, weight)

    def added_segments(self):
        return [Segment("half_update_clients", 1, kind="int", wire_bytes=0)]

    def add_statistics(self, run, worker, stats):
        stats.add("half_update_clients", 1)

    def transform_reduced(self, reduced):
        self.clients_seen += int(reduced["half_update_clients"][0])
        return reduced

    @property
    def round_metrics(self):
        return {**self.inner.round_metrics, "half_update_clients_seen": self.clients_seen}

    def state_dict(self):
        return {"clients_seen": torch.tensor(self.clients_seen)}

    def load_state_dict(self, state):
        self.clients_seen = int(state["clients_seen"])


@pytest.mark.parametrize("method", ["fedavg", "scaffold", "fedprox"])
def test_a_toy_feature_is_the_same_on_one_two_and_resumed(tmp_path, method):
    from conftest import metrics, one_two_resumed, write_config
    from test_system import BEFORE  # these runs' models without the feature, pinned

    cfg = write_config(tmp_path / "c.yaml", algorithm={"name": method})
    one, two, resumed = one_two_resumed(cfg, tmp_path, TOY, paths=[HERE])
    assert one["model_sha256"] != BEFORE[method]  # the feature changed the model
    assert one["bytes_up"] == two["bytes_up"] == resumed["bytes_up"] > 0  # its segment is bookkeeping (0 bytes)
    # Its state survived the stop: the count goes on from the checkpoint (5 clients a round).
    seen = [row["half_update_clients_seen"] for row in metrics(tmp_path / "one")]
    assert seen == [5 * r for r in range(1, 7)]
    assert seen == [row["half_update_clients_seen"] for row in metrics(tmp_path / "stopped")]


@pytest.mark.parametrize("pack_size", [1, 4])
def test_the_toy_feature_halves_the_server_step(tmp_path, small_config, pack_size):
    """FedAvg with server.lr=1: w' = w + s x sum_i p_i (w_i - w) for the feature's option scale=s (0.25 here, from
    the config), recomputed from the recorded client models; in packs too (a pack then adds its clients'
    statistics one by one, through the feature)."""
    from conftest import build_trainer, record_client_models

    trainer = build_trainer(small_config, tmp_path / "r", TOY, f"runtime.pack_size={pack_size}",
                            "algorithm.feature_options.half_update.scale=0.25")
    assert trainer.pack_size == pack_size
    assert type(trainer.algorithm).__name__ == "HalfUpdate"
    assert trainer.algorithm.options.scale == 0.25
    clients = record_client_models(trainer)
    theta = trainer.global_params.double().clone()
    trainer.run_round(1)
    full = sum(weight * (client.double() - theta) for client, weight in clients)
    tolerance = 8 * torch.finfo(torch.float32).eps * (theta.abs() + full.abs())
    assert ((trainer.global_params.double() - (theta + 0.25 * full)).abs() <= tolerance).all()
    assert ((trainer.global_params.double() - (theta + 0.5 * full)).abs() > 100 * tolerance).any()  # not the default
    assert trainer.algorithm.clients_seen == len(clients) == 5


@pytest.mark.parametrize("name, says", [
    ("no_such_module:Half", "cannot import module 'no_such_module'"),
    ("test_feature:Segment", "not a subclass of distfl.Feature"),
    ("half", "algorithm.features: no feature 'half'"),
])
def test_a_bad_feature_is_refused_before_any_work(tmp_path, small_config, name, says):
    from conftest import assert_refused

    assert_refused(small_config, tmp_path / "run", [f"algorithm.features=[{name}]"], says)


FEATURE_OPTIONS = "algorithm.feature_options"


@pytest.mark.parametrize("overrides, says", [
    ([f"{FEATURE_OPTIONS}.half_update.scal=0.25"], "unknown key 'algorithm.feature_options.half_update.scal'; did you "
     r"mean 'algorithm.feature_options.half_update.scale'\? valid keys in 'algorithm.feature_options.half_update' for "
     "half_update: scale"),
    ([f"{FEATURE_OPTIONS}.half_update.scale=half"], "algorithm.feature_options.half_update.scale must be a number, "
     "got 'half'"),
    ([f"{FEATURE_OPTIONS}.half_update.scale=0"], r"algorithm.feature_options.half_update.scale must be > 0"),
    ([f"{FEATURE_OPTIONS}.half_update=0.25"], "algorithm.feature_options.half_update must be a mapping of "
     "half_update's options"),
    ([f"{FEATURE_OPTIONS}.half.scale=0.25"], r"algorithm.feature_options.half: no enabled feature is named 'half' "
     r"\(the run's features with options: half_update; .* list it in algorithm.features\)"),
    ([f"{FEATURE_OPTIONS}.gma.tau=0.5", "aggregation.mask=gma"], "algorithm.feature_options.gma.tau: the feature gma "
     "declares no options"),
])
def test_a_features_options_are_refused_in_one_line_naming_the_key(overrides, says):
    from distfl.config import load_config
    from distfl.errors import ConfigError

    with pytest.raises(ConfigError, match=says) as refused:
        load_config(None, ["data.dataset=synthetic", TOY, *overrides])
    assert "\n" not in str(refused.value)


def test_options_of_a_feature_that_is_not_on_are_refused():
    from distfl.config import load_config
    from distfl.errors import ConfigError

    with pytest.raises(ConfigError, match="algorithm.feature_options.half_update: no enabled feature is named "
                                          "'half_update' \\(none of the run's features declares options"):
        load_config(None, ["data.dataset=synthetic", f"{FEATURE_OPTIONS}.half_update.scale=0.25"])


def test_a_features_options_are_recorded_complete_and_a_resume_checks_them_as_method_options():
    """The defaults fill in; the run's config.yaml holds the options, so a resume that changes one is refused,
    exactly as a changed algorithm.options key is."""
    import yaml

    from distfl.config import config_to_dict, load_config
    from distfl.config.load import dump_config
    from distfl.config.resume import resume_blockers

    def config(*overrides):
        return load_config(None, ["data.dataset=synthetic", "algorithm.name=fedprox", TOY, *overrides])

    cfg = config()
    assert cfg.algorithm.feature_options == {"half_update": {"scale": 0.5}}
    saved = yaml.safe_load(dump_config(cfg))
    assert saved["algorithm"]["feature_options"] == {"half_update": {"scale": 0.5}}
    assert resume_blockers(saved, config_to_dict(config(f"{FEATURE_OPTIONS}.half_update.scale=0.5"))) == []
    assert resume_blockers(saved, config_to_dict(config(f"{FEATURE_OPTIONS}.half_update.scale=0.25"))) == \
        ["algorithm.feature_options.half_update.scale"]
    assert resume_blockers(saved, config_to_dict(config("algorithm.options.mu=0.5"))) == ["algorithm.options.mu"]


def test_a_features_option_may_be_swept():
    from distfl.sweep.grid import parse_grid_arg

    assert parse_grid_arg(f"{FEATURE_OPTIONS}.half_update.scale=0.25,0.5") == \
        ("algorithm.feature_options.half_update.scale", ["0.25", "0.5"])


class RefusesScaffold(HalfUpdate):
    feature_name = "refuses_scaffold"

    @classmethod
    def refuse(cls, v, method):
        if v["algorithm.name"] == "scaffold":
            from distfl.errors import ConfigError

            raise ConfigError("algorithm.features: refuses_scaffold does not compose with algorithm.name=scaffold")


@pytest.mark.parametrize("overrides, says", [
    (["algorithm.name=scaffold", "algorithm.features=[test_feature:RefusesScaffold]"], "refuses_scaffold does not"),
    (["algorithm.features=[test_feature:HalfUpdate,test_feature:HalfUpdate]"], "two features are named 'half_update'"),
    (["aggregation.mask=gma", "system.async_mode=fedbuff"], "aggregation.mask=gma is not defined for it"),
    (["aggregation.fedbn=true", "model.name=resnet20", "system.async_mode=fedbuff"], "aggregation.fedbn is not defined"),
    (["aggregation.fedbn=true", "model.name=resnet20", "algorithm.name=local"], "algorithm.name=local aggregates nothing"),
    (["aggregation.mask=gma", "algorithm.name=slowmo"], "has its own server step"),
])
def test_validation_asks_each_enabled_feature_for_its_refusals(overrides, says):
    from distfl.config import load_config
    from distfl.errors import ConfigError

    with pytest.raises(ConfigError, match=says):
        load_config(None, ["data.dataset=synthetic", *overrides])
    load_config(None, ["data.dataset=synthetic", *[o for o in overrides if not o.startswith(("algorithm.features",
                                                                                             "system", "aggregation"))]])


def test_the_built_in_features_declare_their_keys_and_order():
    from distfl.algorithms import FEATURES
    from distfl.config.schema import KEYS

    assert {name: cls.order for name, cls in FEATURES.items()} == {"lora_stack": 5, "gma": 10, "fedbn": 20, "compression": 30,
                                                                   "sketch": 30, "download": 35, "dp": 40}
    for cls in FEATURES.values():
        for key in cls.keys:
            assert key in KEYS or any(k.startswith(key.removesuffix("*")) for k in KEYS), (cls.feature_name, key)

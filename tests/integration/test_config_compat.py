"""Configs and runs written before a key moved keep working: every committed experiment config loads,
the old flat method keys (`algorithm.moon_mu=...`) mean what they meant, and a run checkpointed by an
earlier release resumes to the model it would have trained."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from conftest import REPO, train_ok

RELEASE_RUNS = REPO / "tests" / "fixtures" / "release_runs"
# model_sha256 after 4 rounds of each fixture's config, trained without a stop by the release that wrote
# the fixture (stopped after round 2; config.yaml with the flat keys algorithm.moon_mu=2, moon_tau=0.3,
# and algorithm.beta_local=0.5, beta_global=0.8, server_alpha=0.9, variant=heavy_ball).
RELEASE_HASHES = {
    "moon": "4e34b08919adf8c304780602723c9be82ba009960ef4d8aa0a5423c139560d2c",
    "fedadc": "f600fd2080a27c16d79ee8de1524abf7d71d221250d39b1716caebbbbd28fe54",
}


@pytest.mark.parametrize("name", sorted(RELEASE_HASHES))
def test_a_run_checkpointed_by_the_earlier_release_resumes_to_its_model(tmp_path, name):
    run_dir = tmp_path / name
    shutil.copytree(RELEASE_RUNS / name, run_dir)
    resumed = train_ok(None, "train.rounds=4", resume=str(run_dir))
    assert resumed["model_sha256"] == RELEASE_HASHES[name]


# Committed configs that name a partition file the repository does not hold (written by a run into its
# own output tree): they load but for that one check.
MISSING_FILE = {"experiments/gma/results_session3/gma10c_split0_m09_lr0.01_slr1.0/aggregation.mask=gma_seed=1/config.yaml",
                "experiments/gma/results_session3/gma10c_split0_m09_lr0.01_slr1.0/aggregation.mask=none_seed=1/config.yaml"}
# Configs (and their runs' saved configs) whose data files their experiment script writes first, under data/
# (experiments/foundation/run.sh): they load, but for that check where the script has not run.
WRITTEN_DATA = "experiments/foundation/"


def committed_configs() -> list[str]:
    files = [*REPO.glob("configs/**/*.yaml"), *REPO.glob("experiments/**/*.yaml"), *RELEASE_RUNS.glob("*/config.yaml")]
    return sorted(str(f.relative_to(REPO)) for f in files)


def test_every_committed_config_loads():
    """Every experiment config, sweep file and saved run config of the repository (configs/, experiments/,
    the fixtures above) loads and validates, whatever spelling of its keys it was written with."""
    import warnings

    from distfl.config import load_config
    from distfl.errors import ConfigError

    files = committed_configs()
    assert len(files) > 300
    for path in files:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a key its method ignores warns, as it did when it was written
            if path in MISSING_FILE:
                with pytest.raises(ConfigError, match="partition.path: .* does not exist"):
                    load_config(str(REPO / path))
            elif path.startswith(WRITTEN_DATA):
                try:
                    load_config(str(REPO / path))
                except ConfigError as e:
                    assert re.search("data.path: .* does not exist", str(e)), (path, str(e))
            else:
                load_config(str(REPO / path))


def test_every_committed_config_gives_its_method_the_values_it_ran_with():
    """The method keys each committed config ran with (pinned in fixtures/committed_method_options.json by
    the release that read them as flat keys) are exactly its method's options now."""
    import json
    import warnings

    from distfl.algorithms import method_class
    from distfl.config import load_config
    from distfl.config.renamed import RENAMED

    pinned = json.loads((REPO / "tests" / "fixtures" / "committed_method_options.json").read_text())
    assert len(pinned) > 300
    for path, keys in pinned.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cfg = load_config(str(REPO / path))
        expected = {RENAMED[old][0]: value for old, value in keys.items() if old != "name"}
        assert method_class(cfg).name == keys["name"], path
        assert cfg.algorithm.options == expected, path


@pytest.mark.parametrize("old, new, name", [
    ("algorithm.mu=0.3", "algorithm.options.mu=0.3", "fedprox"),
    ("algorithm.moon_mu=4", "algorithm.options.mu=4", "moon"),
    ("algorithm.ditto_lambda=2", "algorithm.options.lam=2", "ditto"),
    ("algorithm.beta_global=0.5", "algorithm.options.beta_global=0.5", "slowmo"),
])
def test_an_old_key_is_its_new_option_and_says_so(old, new, name):
    from distfl.config import load_config
    from distfl.config.renamed import RenamedKeyWarning

    extra = ["model.projection_dim=8"] if name == "moon" else []
    with pytest.warns(RenamedKeyWarning, match=f"{old.split('=')[0]} is now {new.split('=')[0]} "):
        via_old = load_config(None, [f"algorithm.name={name}", old, *extra])
    assert via_old == load_config(None, [f"algorithm.name={name}", new, *extra])


def test_an_old_key_another_method_reads_is_ignored_with_a_warning_and_a_conflict_is_refused():
    from distfl.config import ConfigWarning, load_config
    from distfl.errors import ConfigError

    with pytest.warns(ConfigWarning, match=r"algorithm.moon_mu is set but only used by algorithm.name in \[moon\]; "
                                           "it is ignored for fedprox"):
        cfg = load_config(None, ["algorithm.name=fedprox", "algorithm.moon_mu=3"])
    assert cfg.algorithm.options == {"mu": 0.01}
    with pytest.raises(ConfigError, match="algorithm.mu=0.3 .* is the old name of algorithm.options.mu, also set to 0.2"):
        load_config(None, ["algorithm.name=fedprox", "algorithm.mu=0.3", "algorithm.options.mu=0.2"])


def test_a_sweep_of_an_old_key_beside_a_method_that_does_not_read_it(tmp_path):
    """--grid algorithm.mu=... with algorithm.name=fedavg,fedprox: FedAvg reads no mu, so it is one point
    (without the key); FedProx's two points get their mu as algorithm.options.mu."""
    import warnings

    from conftest import write_config
    from distfl.sweep.grid import build_sweep

    cfg = write_config(tmp_path / "c.yaml", output={"dir": str(tmp_path / "sw")})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sweep = build_sweep(str(cfg), grid_args=["algorithm.name=fedavg,fedprox", "algorithm.mu=0.01,0.1"], seeds_arg="0")
    assert [p.name for p in sweep.points] == ["algorithm.name=fedavg/seed=0",
                                              "algorithm.mu=0.01,algorithm.name=fedprox/seed=0",
                                              "algorithm.mu=0.1,algorithm.name=fedprox/seed=0"]
    assert [p.config["algorithm"]["options"] for p in sweep.points] == [{}, {"mu": 0.01}, {"mu": 0.1}]

"""Configs and runs written before a key moved keep working: every committed experiment config loads,
the old flat method keys (`algorithm.moon_mu=...`) mean what they meant, and a run checkpointed by an
earlier release resumes to the model it would have trained."""
from __future__ import annotations

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
            else:
                load_config(str(REPO / path))

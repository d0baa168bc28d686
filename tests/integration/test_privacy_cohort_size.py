"""Under DP a Poisson cohort drawn from the secret key has a secret size: the accountant's amplification by
sampling assumes nobody learns how many clients took part. Nothing the run releases may depend on it,
the fixed-point unit of the round's sums included (it sets how each released term is rounded and how
much of the clip that rounding takes)."""
from __future__ import annotations

import sys

import pytest

from conftest import build_trainer

SECRET_POISSON = ["privacy.mechanism=gaussian", "privacy.delta=1e-3", "algorithm.weighting=uniform",
                  "privacy.secure_noise=true", "privacy.noise_multiplier=0.3", "train.cohort=poisson"]

# A method whose update segment declares the largest |weight * value| of one term (`Segment.bound`): the
# buffer then picks the finest unit at which the round's terms sum exactly, so the unit follows the number
# of terms it is sized for. 2^11 puts the unit's steps between cohorts of 2, 4, 8 and 16 clients.
PLUGIN = """from distfl import Algorithm, Segment

class BoundedUpdate(Algorithm):
    private_release = True

    def segments(self):
        return [Segment("delta", self.num_params, bound=2.0**11), Segment("buffers", self.num_buffers)]
"""


@pytest.fixture
def bounded_plugin(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "dpbounded.py").write_text(PLUGIN)
    sys.path.insert(0, str(pkg))
    yield
    sys.path.remove(str(pkg))
    sys.modules.pop("dpbounded", None)


@pytest.mark.parametrize("method", ["fedavg", "dpbounded:BoundedUpdate"])
def test_the_units_of_a_private_rounds_sums_do_not_depend_on_the_secret_cohort_size(
        tmp_path, small_config, bounded_plugin, method):
    """Rounds whose secret Poisson cohorts differ in size sum the released segments (the method's, and
    adaptive clipping's count) in the same units: those of a round of every client of the population."""
    trainer = build_trainer(small_config, tmp_path / "run", *SECRET_POISSON, f"algorithm.name={method}",
                            "privacy.adaptive_clip=true")
    cfg, released = trainer.cfg, trainer.algorithm.segments()
    sizes, units = set(), set()
    for t in range(1, 21):
        cohort = trainer.privacy.cohort(trainer.population, t, cfg.train.clients_per_round, cfg.train.cohort)
        sizes.add(len(cohort))
        stats = trainer.new_aggregator(cohort)
        units.add(tuple(stats.unit(s.name) for s in released))
    assert len(sizes) >= 4, sizes  # the cohorts' sizes cross the unit's steps
    everyone = trainer.new_aggregator(list(range(len(trainer.population))))
    assert units == {tuple(everyone.unit(s.name) for s in released)}

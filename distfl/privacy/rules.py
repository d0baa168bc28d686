"""Which runs keep a user-level guarantee under privacy.mechanism (gaussian, dp_ftrl); every other combination is a
ConfigError before any work (the DP feature's refusals, algorithms/private.py, call `check`; config validation
calls `check_distributed`).

The guarantee covers what the server releases from the clients: the noised, clipped sum of their model
updates, and everything computed from it (the server step is post-processing). A method or option that
releases another per-client statistic without clipping and noise would leak past it, so it is refused
with the reason; so are a weighting that depends on the sampled clients and a sampling no accountant
bounds.
"""
from __future__ import annotations

from ..errors import ConfigError
from ..models.base import NORM_MODELS, has_batchnorm  # built-in models with BatchNorm: their statistics are averaged unclipped



DISTRIBUTED = ("ddgauss", "skellam")  # distributed DP, under secure aggregation (secagg/aggregator.py)


def check_distributed(v: dict, algorithm_class) -> None:
    """One line for a distributed-DP setting no run can serve."""
    prefix = f"privacy.mechanism={v['privacy.mechanism']}"
    if not v["secagg.bits"]:
        raise ConfigError(f"{prefix} adds each client's noise under secure aggregation: set secagg.bits (e.g. 20)")
    if not 0 < v["privacy.delta"] < 1:
        raise ConfigError(f"{prefix} needs privacy.delta in (0, 1), the delta of the (epsilon, delta) guarantee")
    z, target = v["privacy.noise_multiplier"], v["privacy.target_epsilon"]
    if (z >= 0) == (target > 0):
        raise ConfigError(f"{prefix} needs exactly one of privacy.noise_multiplier (>= 0) and privacy.target_epsilon "
                          f"(> 0; the multiplier is then calibrated), got noise_multiplier={z}, target_epsilon={target}")
    if v["privacy.adaptive_clip"]:
        raise ConfigError(f"{prefix}: privacy.adaptive_clip is built for privacy.mechanism=gaussian only")
    if v["algorithm.weighting"] != "uniform":
        raise ConfigError(f"{prefix}: algorithm.weighting={v['algorithm.weighting']} weights clients by their sample "
                          "counts, which leaks them; set algorithm.weighting=uniform")
    if not algorithm_class.private_release:
        raise ConfigError(f"{prefix}: algorithm.name={v['algorithm.name']} does not declare private_release = True "
                          "(docs/privacy.md)")


def check(v: dict, algorithm_class) -> None:
    """The central mechanisms' rules (algorithms/private.py's refusals). `v`: dotted key -> value (validated
    types). `algorithm_class`: the class that declares the method (its `private_release` and `why_not_private`)."""
    n, m = v["partition.num_clients"], v["train.clients_per_round"]
    name = v["algorithm.name"]
    prefix = f"privacy.mechanism={v['privacy.mechanism']}"
    if not 0 < v["privacy.delta"] < 1:
        raise ConfigError(f"{prefix} needs privacy.delta in (0, 1), the delta of the (epsilon, delta) guarantee; "
                          f"a common choice is 1/num_clients^1.1 = {1 / n ** 1.1:.3g}")
    z, target = v["privacy.noise_multiplier"], v["privacy.target_epsilon"]
    if (z >= 0) == (target > 0):
        raise ConfigError(f"{prefix} needs exactly one of privacy.noise_multiplier (>= 0) and "
                          f"privacy.target_epsilon (> 0; the multiplier is then calibrated), got noise_multiplier={z}, "
                          f"target_epsilon={target}")
    if -1 < z < 0:
        raise ConfigError(f"privacy.noise_multiplier must be >= 0 (or -1: not set), got {z}")
    cohort = v["train.cohort"]
    if v["privacy.mechanism"] in ("dp_ftrl", "banded_mf"):
        check_dp_ftrl(v, prefix)
    elif cohort == "sequential":
        raise ConfigError(f"{prefix}: train.cohort=sequential is a fixed schedule of clients, which no sampling "
                          "accountant bounds; use train.cohort=poisson (or random), or privacy.mechanism=dp_ftrl "
                          "(tree aggregation, made for cyclic participation)")
    if cohort == "random" and v["privacy.accountant"] == "pld":
        raise ConfigError(f"{prefix}: privacy.accountant=pld bounds Poisson sampling only; use train.cohort=poisson "
                          "with pld, or privacy.accountant=rdp for train.cohort=random")
    if v["algorithm.weighting"] != "uniform":
        raise ConfigError(f"{prefix}: algorithm.weighting={v['algorithm.weighting']} weights clients by their sample "
                          "counts, which leaks them and breaks the bound on one client's influence; set "
                          "algorithm.weighting=uniform (updates are divided by the expected cohort size)")
    if not algorithm_class.private_release:
        from ..algorithms import ALGORITHMS

        why = algorithm_class.why_not_private or (
            f"algorithm.name={name} does not declare private_release = True (docs/privacy.md: only a method whose "
            "clients release nothing but their model update, and whose server uses nothing but its average, may)")
        private = [n for n, cls in ALGORITHMS.items() if cls.private_release]
        raise ConfigError(f"{prefix}: {why}; under DP use one of {', '.join(private)} (any server.optimizer)")
    if v["calibration.method"] != "none":
        raise ConfigError(f"{prefix}: calibration.method={v['calibration.method']} sums every client's feature "
                          "statistics (ffc: Z^T Z, Z^T Y; ccvr: per-class means and covariances) unclipped and unnoised; "
                          "set calibration.method=none")
    if v["data.normalize"] == "mean_std":
        raise ConfigError(f"{prefix}: data.normalize=mean_std computes the mean and std of every client's training "
                          "inputs and releases them un-noised (in every model's inputs and summary.json); use "
                          "data.normalize=none, or auto (fixed published statistics)")
    if v["eval.clients"]:
        raise ConfigError(f"{prefix}: eval.clients releases each client's own accuracy (and its label histogram "
                          "through its test split) unnoised; set eval.clients=false")
    if v["eval.train_metrics"]:
        raise ConfigError(f"{prefix}: eval.train_metrics releases global_train_loss and global_train_acc, the model "
                          "scored on every client's training data, unnoised; set eval.train_metrics=false")
    if "wandb" in v["output.trackers"] and not v["privacy.release_timings"]:
        raise ConfigError(f"{prefix}: output.trackers has wandb, which stamps every logged round with its own clock "
                          "(_timestamp, _runtime): the rounds' wall times, which a private run withholds (they count "
                          "its cohorts); use tensorboard or mlflow, or set privacy.release_timings=true")
    model = v["model.name"]
    if has_batchnorm(model, v["model.norm"]):
        raise ConfigError(f"{prefix}: model.name={model} has BatchNorm, whose running statistics are averaged over "
                          "the clients unclipped; use a model without it (model.norm=gn for "
                          f"{', '.join(NORM_MODELS)}; simplecnn, lenet5, mlp, ...)")
    if v["privacy.adaptive_clip"] and z > 0:
        from .adaptive import count_noise_std

        sigma_b = count_noise_std(v["privacy.count_noise_multiplier"], m)
        if 2 * sigma_b <= z:
            raise ConfigError(f"privacy.adaptive_clip: the count's noise std sigma_b={sigma_b:g} must exceed "
                              f"noise_multiplier / 2 = {z / 2:g} (Andrew et al. Thm 1 splits z between the update "
                              "and the count); raise privacy.count_noise_multiplier")


def check_dp_ftrl(v: dict, prefix: str) -> None:
    """DP-FTRL's accounting (tree.py, banded.py) holds for cyclic participation: each client at most once in any
    floor(N / m) consecutive rounds."""
    if v["train.cohort"] != "sequential":
        raise ConfigError(f"{prefix} is accounted for train.cohort=sequential (each client once per "
                          f"floor(num_clients / clients_per_round) rounds); got train.cohort={v['train.cohort']}, "
                          "under which a client can join a tree twice (use privacy.mechanism=gaussian for it)")
    if v["train.clients_per_round"] > v["partition.num_clients"]:
        raise ConfigError(f"{prefix}: train.clients_per_round={v['train.clients_per_round']} exceeds "
                          f"partition.num_clients={v['partition.num_clients']}, so a round would hold a client twice")
    if v["privacy.accountant"] != "rdp":
        raise ConfigError(f"{prefix} is accounted by the rdp accountant only (tree aggregation: dp-accounting's "
                          "SingleEpochTreeAggregationDpEvent); set privacy.accountant=rdp")
    separation = v["partition.num_clients"] // v["train.clients_per_round"]
    if v["privacy.mechanism"] == "banded_mf" and v["privacy.bands"] > separation:
        raise ConfigError(f"privacy.bands={v['privacy.bands']} exceeds the {separation} rounds between a client's "
                          "participations (floor(num_clients / clients_per_round)), past which banded noise would "
                          f"correlate two of them; set privacy.bands <= {separation} (0: {separation})")
    if v["privacy.adaptive_clip"]:
        raise ConfigError(f"{prefix}: privacy.adaptive_clip is built for privacy.mechanism=gaussian only "
                          "(its clipped count is noised once per round, not by the tree); set adaptive_clip=false")


def check_model_buffers(num_buffers: int, model_name: str) -> None:
    """A plugin model's float buffers (BatchNorm statistics) would be averaged unclipped."""
    if num_buffers:
        raise ConfigError(f"privacy.mechanism: model.name={model_name} has {num_buffers} float buffer "
                          "values (BatchNorm running statistics?), averaged over the clients unclipped; use a model "
                          "without them")

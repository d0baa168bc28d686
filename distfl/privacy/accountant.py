"""Epsilon of a private run, from Google's dp-accounting (its RDP and PLD accountants).

One round of DP-FedAvg is a subsampled Gaussian mechanism on the sum of clipped client updates:
  - train.cohort=poisson: each client joins with probability q = clients_per_round / num_clients.
    Adjacent populations differ by adding or removing one client, whose update moves the sum by at most
    C, and the noise has std z * C: PoissonSampledDpEvent(q, GaussianDpEvent(z)), ADD_OR_REMOVE_ONE.
  - train.cohort=random: a fixed-size sample without replacement. The population size is public, so
    adjacent populations differ by replacing one client (REPLACE_ONE), which moves the sum by up to 2C:
    SampledWithoutReplacementDpEvent(N, m, GaussianDpEvent(z / 2)) (Wang, Balle and Kasiviswanathan
    2019, Thm 27). Only the RDP accountant bounds this sampling.
With adaptive clipping, z is the total noise multiplier of the update and the clipped count together
(Andrew et al. 2021, Thm 1), so the same event describes a round.
T rounds are the T-fold self-composition.

DP-FTRL (train.cohort=sequential, each client in at most one of any floor(N / m) consecutive rounds),
under zero-out adjacency (REPLACE_SPECIAL: one client's data replaced by nothing):
  - dp_ftrl: one SingleEpochTreeAggregationDpEvent(z, L) per tree of L = floor(N / m) rounds (tree.py);
  - banded_mf: the whole run is one Gaussian of multiplier z / sqrt(k), k participations (banded.py).
"""
from __future__ import annotations

import contextlib
import logging
import math
import sys

import dp_accounting
from dp_accounting import pld, rdp
from dp_accounting.pld import privacy_loss_distribution

from ..errors import ConfigError

# absl (dp-accounting logs through it) builds a stream handler on import, bound to whatever sys.stderr is
# then: a redirected or captured stream that a logging.config call elsewhere (submitit's, at import)
# would later close as the handler's own. Bind it to the process's stderr, which no handler closes.
import absl.logging  # noqa: E402

absl.logging.get_absl_handler().python_handler.stream = sys.__stderr__


PLD_INTERVAL = 1e-4  # the PLDAccountant's default value_discretization_interval


@contextlib.contextmanager
def _quiet_absl():
    """dp-accounting logs (through absl) each RDP order it drops as unconverged; the bound uses the rest.
    Such a record would also make Python's logging install a root handler on whatever sys.stderr is then."""
    log = logging.getLogger("absl")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def round_event(noise_multiplier: float, cohort: str, num_clients: int, clients_per_round: int):
    """The DpEvent of one round."""
    if cohort == "poisson":
        return dp_accounting.PoissonSampledDpEvent(clients_per_round / num_clients,
                                                   dp_accounting.GaussianDpEvent(noise_multiplier))
    if cohort == "random":
        return dp_accounting.SampledWithoutReplacementDpEvent(num_clients, clients_per_round,
                                                              dp_accounting.GaussianDpEvent(noise_multiplier / 2))
    raise ValueError(f"no accountant bounds train.cohort={cohort}")


def run_event(noise_multiplier: float, rounds: int, cohort: str, num_clients: int, clients_per_round: int,
              mechanism: str = "gaussian"):
    """The DpEvent of `rounds` rounds. dp_ftrl: one tree per floor(N / m) rounds (the last one partial),
    each client in at most one round of each (tree.py); the trees compose."""
    if mechanism == "banded_mf":  # one Gaussian release of C x, sensitivity sqrt(k) C (banded.py)
        from .banded import participations

        k = participations(rounds, num_clients, clients_per_round)
        return dp_accounting.GaussianDpEvent(noise_multiplier / math.sqrt(k))
    if mechanism == "dp_ftrl":
        from .tree import rounds_per_tree

        per_tree = rounds_per_tree(num_clients, clients_per_round)
        full, rest = divmod(rounds, per_tree)
        events = [dp_accounting.SelfComposedDpEvent(
            dp_accounting.SingleEpochTreeAggregationDpEvent(noise_multiplier, per_tree), full)] if full else []
        events += [dp_accounting.SingleEpochTreeAggregationDpEvent(noise_multiplier, rest)] if rest else []
        return dp_accounting.ComposedDpEvent(events)
    return dp_accounting.SelfComposedDpEvent(round_event(noise_multiplier, cohort, num_clients, clients_per_round),
                                             rounds)


def make_accountant(kind: str, cohort: str, mechanism: str = "gaussian"):
    """dp_ftrl: zero-out adjacency (REPLACE_SPECIAL: one client's data replaced by a client that adds
    nothing), the relation tree aggregation is analysed under; the population size is public."""
    relation = (dp_accounting.NeighboringRelation.REPLACE_SPECIAL if mechanism in ("dp_ftrl", "banded_mf")
                else dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE if cohort == "poisson"
                else dp_accounting.NeighboringRelation.REPLACE_ONE)
    if kind == "rdp":
        return rdp.RdpAccountant(neighboring_relation=relation)
    if kind == "pld":
        return pld.PLDAccountant(neighboring_relation=relation, value_discretization_interval=PLD_INTERVAL)
    raise ValueError(kind)


def epsilon(noise_multiplier: float, rounds: int, delta: float, cohort: str, num_clients: int,
            clients_per_round: int, accountant: str = "rdp", mechanism: str = "gaussian") -> float:
    """Epsilon at `delta` after `rounds` rounds (inf without noise, 0 before the first round)."""
    if rounds == 0:
        return 0.0
    if noise_multiplier <= 0:
        return math.inf
    acc = make_accountant(accountant, cohort, mechanism)
    with _quiet_absl():
        acc.compose(run_event(noise_multiplier, rounds, cohort, num_clients, clients_per_round, mechanism))
        return float(acc.get_epsilon(delta))


class Ledger:
    """Epsilon after each round of one run, on rank 0, equal to a fresh accountant composed with the
    round's event `rounds` times, at a fraction of its cost. RDP: the one-round RDP curve, kept, times
    the rounds (~1 ms). PLD: the one-round privacy loss distribution the PLDAccountant builds, kept,
    and self-composed t times for round t (an FFT power; ~0.1-0.5 s on a CPU)."""

    def record_round(self, reduced) -> None:
        """A round summed: central noise is fixed in advance, so nothing of the sums changes the ledger."""

    def __init__(self, noise_multiplier, delta, cohort, num_clients, clients_per_round, accountant,
                 mechanism="gaussian"):
        self.delta, self.kind, self.cohort = delta, accountant, cohort
        # dp_ftrl: the RDP of the trees so far, in closed form (no one-round curve to keep).
        self.tree_args = ((noise_multiplier, delta, cohort, num_clients, clients_per_round, accountant, mechanism)
                          if mechanism in ("dp_ftrl", "banded_mf") else None)
        self.event = (round_event(noise_multiplier, cohort, num_clients, clients_per_round)
                      if noise_multiplier > 0 and self.tree_args is None else None)
        self.one_round = None

    @classmethod
    def of(cls, cfg, noise_multiplier: float, num_clients: int) -> "Ledger":
        """The ledger of a run with this config, population size and (resolved) noise multiplier."""
        p = cfg.privacy
        return cls(noise_multiplier, p.delta, cfg.train.cohort, num_clients, cfg.train.clients_per_round, p.accountant,
                   p.mechanism)

    def epsilon_after(self, rounds: int) -> float:
        if self.tree_args is not None:
            z, delta, *rest = self.tree_args
            return epsilon(z, rounds, delta, *rest)
        if self.event is None:
            return math.inf
        if rounds == 0:
            return 0.0
        with _quiet_absl():
            return self._epsilon_after(rounds)

    def _epsilon_after(self, rounds: int) -> float:
        if self.kind == "pld":  # what PLDAccountant.compose(SelfComposedDpEvent(event, rounds)) computes
            if self.one_round is None:
                self.one_round = privacy_loss_distribution.from_gaussian_mechanism(
                    standard_deviation=self.event.event.noise_multiplier, value_discretization_interval=PLD_INTERVAL,
                    sampling_prob=self.event.sampling_probability,
                    neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
            composed = privacy_loss_distribution.identity(value_discretization_interval=PLD_INTERVAL).compose(
                self.one_round.self_compose(rounds))
            return float(composed.get_epsilon_for_delta(self.delta))
        if self.one_round is None:  # what RdpAccountant.compose(SelfComposedDpEvent(event, rounds)) computes
            acc = make_accountant(self.kind, self.cohort)
            acc.compose(self.event)
            self.orders, self.one_round = acc.orders, acc.rdp
        return float(rdp.rdp_privacy_accountant.compute_epsilon(self.orders, rounds * self.one_round, self.delta)[0])


def calibrate(target_epsilon: float, rounds: int, delta: float, cohort: str, num_clients: int,
              clients_per_round: int, accountant: str = "rdp", mechanism: str = "gaussian") -> float:
    """The smallest noise multiplier (to 1e-4 relative) whose `rounds` rounds spend at most
    `target_epsilon` at `delta`; the value returned is checked to land at or below the target."""
    def make_event(z):
        return run_event(z, rounds, cohort, num_clients, clients_per_round, mechanism)

    # PLD is slow at tiny multipliers and never looser than RDP: bracket its search by RDP's answer.
    bracket = dp_accounting.LowerEndpointAndGuess(1e-2, 1.0)
    if accountant == "pld":
        upper = calibrate(target_epsilon, rounds, delta, cohort, num_clients, clients_per_round, "rdp")
        bracket = dp_accounting.ExplicitBracketInterval(upper / 2, upper)
    try:
        with _quiet_absl():
            z = dp_accounting.calibrate_dp_mechanism(
                lambda: make_accountant(accountant, cohort, mechanism), make_event, target_epsilon, delta, bracket,
                tol=1e-4)
    except (ValueError, dp_accounting.mechanism_calibration.NoBracketIntervalFoundError) as exc:
        raise ConfigError(f"privacy.target_epsilon={target_epsilon}: the accountant finds no noise multiplier "
                          f"reaching it at delta={delta} over {rounds} rounds ({exc})") from None
    # brentq returns a point within tol of the root, on either side: step up until the target holds.
    while epsilon(z, rounds, delta, cohort, num_clients, clients_per_round, accountant, mechanism) > target_epsilon:
        z *= 1 + 1e-4
    return float(z)


def resolve_noise_multiplier(cfg) -> float | None:
    """The run's noise multiplier z: privacy.noise_multiplier, or calibrated from privacy.target_epsilon."""
    p = cfg.privacy
    if p.mechanism == "none":
        return None
    if p.target_epsilon > 0:
        return calibrate(p.target_epsilon, cfg.train.rounds, p.delta, cfg.train.cohort, cfg.partition.num_clients,
                         cfg.train.clients_per_round, p.accountant, p.mechanism)
    return float(p.noise_multiplier)


def describe(cfg, noise_multiplier: float, update_multiplier: float) -> str:
    """The run's privacy set-up, one line (printed at start)."""
    p, t = cfg.privacy, cfg.train
    q = t.clients_per_round / cfg.partition.num_clients
    planned = epsilon(noise_multiplier, t.rounds, p.delta, t.cohort, cfg.partition.num_clients,
                      t.clients_per_round, p.accountant, p.mechanism)
    origin = (f"calibrated by {p.accountant} to target_epsilon={p.target_epsilon:g}" if p.target_epsilon > 0
              else "privacy.noise_multiplier")
    if p.adaptive_clip:
        from .adaptive import count_noise_std

        split = (f"; split as {update_multiplier:.4g} on the update and std "
                 f"{count_noise_std(p.count_noise_multiplier, t.clients_per_round):g} on the clipped count")
    else:
        split = ""
    clip = f"clip {p.clip_norm:g}" + (" (adaptive, quantile " f"{p.target_quantile:g})" if p.adaptive_clip else "")
    if p.mechanism == "dp_ftrl":
        from .tree import rounds_per_tree

        name, sampling = "DP-FTRL (tree aggregation)", (
            f"sequential cohorts, a new tree every {rounds_per_tree(cfg.partition.num_clients, t.clients_per_round)} "
            "rounds (each client at most once per tree)")
    elif p.mechanism == "banded_mf":
        from .banded import bands

        name, sampling = f"DP-FTRL (banded matrix factorisation, {bands(cfg)} bands)", "sequential cohorts"
    else:
        name, sampling = "DP-FedAvg", f"{t.cohort} cohorts at rate {q:.4g}"
    return (f"privacy: user-level {name}, {clip}, noise multiplier {noise_multiplier:.4g} ({origin}"
            f"{split}), {sampling}; {t.rounds} rounds give epsilon "
            f"{planned:.4g} at delta {p.delta:g} ({p.accountant}); {noise_mode(p.secure_noise)}")


def guarantee(privacy: dict) -> str:
    """A private run's guarantee from its summary.json `privacy` entry, one line (the run's last); keyed
    noise says it is a simulation."""
    from .secret import SIMULATION

    eps = privacy["epsilon"]
    text = f"epsilon {eps:.4g}" if eps is not None else "no finite epsilon (noise_multiplier 0)"
    return (f"privacy: user-level (epsilon, delta)-DP with {text} at delta {privacy['delta']:g} after "
            f"{privacy['rounds']} rounds ({privacy['accountant']} accountant, "
            + (f"DP-FTRL, a tree every {privacy['rounds_per_tree']} rounds" if privacy.get("rounds_per_tree") else
               f"DP-FTRL, banded matrix factorisation of {privacy['bands']} bands" if privacy.get("bands") else
               f"{privacy['cohort']} cohorts at rate {privacy['sampling_rate']:.4g}")
            + f", noise multiplier {privacy['noise_multiplier']:.4g})"
            f"{'; ' + SIMULATION if privacy.get('noise', 'keyed') == 'keyed' else '; noise secret'}"
            + ("; test metrics not covered (the test split is the clients' own samples)"
               if privacy.get("test_metrics_covered") is False else ""))


def noise_mode(secure: bool) -> str:
    """How the noise was drawn, beside every printed epsilon."""
    from .secret import SIMULATION

    return "noise secret (a key from the OS's secure source, kept in the checkpoints only)" if secure else SIMULATION

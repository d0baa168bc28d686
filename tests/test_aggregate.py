"""The fixed-point sums behind "1 rank equals N ranks": exact, order-free, and precise."""
import math

import pytest
import torch

from distfl import dist
from distfl.federation.aggregate import FRAC_BITS, Segment, StatBuffer, Unrepresentable

CTX = dist.DistContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend=None)


def _sum(groups, weights):
    """Sum client contributions grouped as if on several ranks: each group is one rank's buffer."""
    total = None
    for group in groups:
        stats = StatBuffer([Segment("x", 1000)], torch.device("cpu"), max_terms=20)
        for i in group:
            stats.add("x", contributions[i], weights[i])
        total = stats.buffer.clone() if total is None else total + stats.buffer
    return total


torch.manual_seed(0)
contributions = [torch.randn(1000) * 10.0 ** torch.randint(-6, 2, (1000,)) for _ in range(20)]


def test_sum_does_not_depend_on_grouping_or_order():
    weights = [float(w) for w in torch.rand(20)]
    one_rank = _sum([list(range(20))], weights)
    two_ranks = _sum([list(range(0, 20, 2)), list(range(1, 20, 2))], weights)
    shuffled = _sum([[7, 3, 19, 0, 11], [5, 2, 18, 1], [4, 6, 8, 9, 10, 12, 13, 14, 15, 16, 17]], weights)
    assert torch.equal(one_rank, two_ranks) and torch.equal(one_rank, shuffled)
    # The float64 sum, by contrast, does depend on the order (this is what the fixed point fixes).
    forward = sum(c.double() * w for c, w in zip(contributions, weights))
    backward = sum(c.double() * w for c, w in reversed(list(zip(contributions, weights))))
    assert not torch.equal(forward, backward)


def test_sum_is_precise_to_the_fixed_point_resolution():
    weights = [1.0 / 20] * 20
    stats = StatBuffer([Segment("x", 1000)], torch.device("cpu"), max_terms=20)
    for c, w in zip(contributions, weights):
        stats.add("x", c, w)
    exact = sum(c.double() * w for c, w in zip(contributions, weights))
    got = stats.reduce(CTX)["x"]
    assert (got - exact).abs().max() <= 20 * 2.0 ** (-FRAC_BITS)


def test_integer_segments_are_exact_and_reduce_is_one_collective():
    dist.reset_counters()
    stats = StatBuffer([Segment("n", 3, kind="int"), Segment("x", 2)], torch.device("cpu"), max_terms=5)
    for _ in range(5):
        stats.add("n", torch.tensor([2**40, 1, -3]))
        stats.add("x", torch.tensor([0.5, -0.25]))
    reduced = stats.reduce(CTX)
    assert reduced["n"].tolist() == [5 * 2**40, 5, -15]
    assert reduced["x"].tolist() == [2.5, -1.25]
    assert dist.COLLECTIVE_CALLS["round_stats"] == 1
    assert stats.nbytes == 8 * 5


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 2.0**22])
def test_unrepresentable_values_are_refused_not_wrapped(bad):
    stats = StatBuffer([Segment("x", 3)], torch.device("cpu"), max_terms=10)
    with pytest.raises(Unrepresentable):
        stats.add("x", torch.tensor([1.0, bad, 0.0]))
    assert int(stats.buffer.abs().sum()) == 0  # nothing half-added


def test_a_segment_with_a_bound_gets_the_unit_of_its_bound_not_the_update_bound():
    """loss_sum of a large client (|value| 5.5e4, past the 2^22/100 update bound of a 100-client cohort)
    is summed exactly in a unit fitted to its own bound; past the bound it is refused, naming it."""
    from distfl.federation.aggregate import LOSS_BOUND, round_segments

    segments = round_segments([Segment("delta", 2)], max_samples_trained=3000 * 8)
    bound = LOSS_BOUND * 3000 * 8
    stats = StatBuffer(segments, torch.device("cpu"), max_terms=100)
    assert stats.limits["loss_sum"] == bound and stats.limits["delta"] == 2.0**22 / 100
    assert stats.bits["loss_sum"] == math.floor(62 - math.log2(100 * bound)) and stats.bits["delta"] == FRAC_BITS
    for _ in range(100):  # the largest sum 100 terms within the bound can make still fits int64
        stats.add("loss_sum", torch.tensor([bound], dtype=torch.float64))
    assert stats.reduce(CTX).scalar("loss_sum") == 100 * bound
    stats = StatBuffer(segments, torch.device("cpu"), max_terms=100)
    stats.add("loss_sum", torch.tensor([2.3 * 3000 * 8], dtype=torch.float64))
    assert stats.reduce(CTX).scalar("loss_sum") == pytest.approx(2.3 * 3000 * 8, abs=2.0 ** -stats.bits["loss_sum"])
    with pytest.raises(Unrepresentable) as err:
        stats.add("loss_sum", torch.tensor([bound * 1.001], dtype=torch.float64))
    assert err.value.segment == "loss_sum"
    with pytest.raises(Unrepresentable) as err:
        stats.add("delta", torch.tensor([0.0, 2.0**22 / 100 * 1.001]))
    assert err.value.segment == "delta"

"""The fixed-point sums behind "1 rank equals N ranks": exact, order-free, and precise."""
import math

import pytest
import torch

from distfl import dist
from distfl.federation.aggregate import EXACT_UNITS, FRAC_BITS, Segment, StatBuffer

CTX = dist.DistContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend=None)


def _sum(groups, weights):
    """Sum client contributions grouped as if on several ranks: each group is one rank's buffer."""
    total = None
    for group in groups:
        stats = StatBuffer([Segment("x", 1000)], torch.device("cpu"), max_terms=20)
        for i in group:
            stats.add("x", contributions[i], weights[i])
        stats.reduce(CTX)
        total = stats.view("x").clone() if total is None else total + stats.view("x")
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
    assert stats.nbytes == 8 * (5 + 2)  # and, per fixed segment, two internal counts


def test_each_term_is_rounded_to_the_grid_as_an_integer_sum_would():
    """The float64 sum of grid values is the integer sum of round(value * weight * 2^40), recomputed
    independently term by term in Python integers."""
    weights = [float(w) for w in torch.rand(20)]
    stats = StatBuffer([Segment("x", 1000)], torch.device("cpu"), max_terms=20)
    for c, w in zip(contributions, weights):
        stats.add("x", c, w)
    reduced = stats.reduce(CTX)
    assert not reduced.problems()
    expected = [sum(round(float(c[j]) * w * 2**FRAC_BITS) for c, w in zip(contributions, weights)) for j in range(1000)]
    assert stats.view("x").tolist() == expected


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_nan_and_inf_are_found_at_reduce_naming_the_segment(bad):
    stats = StatBuffer([Segment("x", 3), Segment("y", 2)], torch.device("cpu"), max_terms=10)
    stats.add("y", torch.tensor([1.0, 2.0]))
    stats.add("x", torch.tensor([1.0, bad, 0.0]))
    stats.add("x", torch.tensor([1.0, 1.0, 1.0]))
    reduced = stats.reduce(CTX)
    assert list(reduced.problems()) == ["x"] and "NaN/inf in 1 term" in reduced.problems()["x"]
    assert reduced["y"].tolist() == [1.0, 2.0]


def test_python_numbers_are_summed_on_the_host_exactly_and_checked():
    stats = StatBuffer([Segment("n", 1, kind="int"), Segment("x", 1)], torch.device("cpu"), max_terms=10)
    for _ in range(10):
        stats.add("n", 3)
        stats.add("x", 0.1, 0.5)
    stats.add("x", torch.tensor([0.25]))  # tensors and numbers mix in one segment
    reduced = stats.reduce(CTX)
    assert reduced["n"].tolist() == [30] and not reduced.problems()
    assert stats.view("x").tolist() == [10 * round(0.1 * 0.5 * 2**FRAC_BITS) + 2**38]
    stats = StatBuffer([Segment("x", 1)], torch.device("cpu"), max_terms=10)
    stats.add("x", float("nan"))
    assert "NaN/inf in 1 term" in stats.reduce(CTX).problems()["x"]


def test_the_exact_range_is_the_float64_one_checked_on_the_sum_of_terms():
    """Terms whose summed |weight| * max|value| stays within 2^53 units sum exactly (to the last unit);
    one unit more on the same rank and the round is refused, naming the segment, whatever the number of
    clients: the check follows the mass, not a per-client cap."""
    unit = 2.0**-FRAC_BITS
    half = 2.0**52 * unit
    assert EXACT_UNITS == 2.0**53 - 2.0**33
    stats = StatBuffer([Segment("x", 2)], torch.device("cpu"), max_terms=1000)
    stats.add("x", torch.tensor([half, -half], dtype=torch.float64))
    stats.add("x", torch.tensor([half - (2**33 + 1) * unit, 3 * unit], dtype=torch.float64))
    reduced = stats.reduce(CTX)
    assert not reduced.problems()
    assert stats.view("x").tolist() == [2**53 - 2**33 - 1, -(2**52) + 3]
    stats = StatBuffer([Segment("x", 2)], torch.device("cpu"), max_terms=1000)
    stats.add("x", torch.tensor([half, 0.0], dtype=torch.float64))
    stats.add("x", torch.tensor([0.0, half], dtype=torch.float64), 1.0)
    assert "above 8.19e+03 on 1 rank" in stats.reduce(CTX).problems()["x"]


def test_two_ranks_each_within_range_sum_exactly_in_int64():
    """Each rank's float64 sum is exact; their int64 sum over ranks carries past 2^53."""
    unit = 2.0**-FRAC_BITS
    ranks = []
    for _ in range(2):
        stats = StatBuffer([Segment("x", 1)], torch.device("cpu"), max_terms=4)
        stats.add("x", torch.tensor([EXACT_UNITS * unit], dtype=torch.float64))
        assert not stats.reduce(CTX).problems()
        ranks.append(int(stats.view("x")[0]))
    assert sum(ranks) == 2 * (2**53 - 2**33)


def test_adding_never_waits_for_the_device():
    """No per-client sync: add() issues no operation that copies a value to the host (what .item(),
    float() and bool() of a tensor do; on a GPU each waits for the queue)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Reads(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._local_scalar_dense.default:
                Reads.count += 1
            return func(*args, **(kwargs or {}))

    stats = StatBuffer([Segment("x", 1000), Segment("n", 1, kind="int"), Segment("loss", 1, bound=1e6)],
                       torch.device("cpu"), max_terms=20)
    with Reads():
        for c in contributions:
            stats.add("x", c, 0.05)
            stats.add("n", torch.tensor([1]))
            stats.add("loss", torch.tensor([2.5], dtype=torch.float64), 1.0)
    assert Reads.count == 0


def test_a_segment_with_a_bound_gets_the_unit_of_its_bound_not_the_update_bound():
    """loss_sum of a large client (|value| 5.5e4) is summed exactly in a unit fitted to its own bound:
    100 terms at the bound fit; the model update keeps 2^-40."""
    from distfl.federation.aggregate import LOSS_BOUND, round_segments

    segments = round_segments([Segment("delta", 2)], max_samples_trained=3000 * 8)
    bound = LOSS_BOUND * 3000 * 8
    stats = StatBuffer(segments, torch.device("cpu"), max_terms=100)
    assert stats.bits["loss_sum"] == math.floor(math.log2(EXACT_UNITS / (100 * bound))) and stats.bits["delta"] == FRAC_BITS
    for _ in range(100):  # the largest sum 100 terms within the bound can make is still exact
        stats.add("loss_sum", torch.tensor([bound], dtype=torch.float64))
    reduced = stats.reduce(CTX)
    assert not reduced.problems() and reduced.scalar("loss_sum") == 100 * bound
    stats = StatBuffer(segments, torch.device("cpu"), max_terms=100)
    stats.add("loss_sum", torch.tensor([2.3 * 3000 * 8], dtype=torch.float64))
    assert stats.reduce(CTX).scalar("loss_sum") == pytest.approx(2.3 * 3000 * 8, abs=2.0 ** -stats.bits["loss_sum"])
    stats = StatBuffer(segments, torch.device("cpu"), max_terms=100)
    capacity = EXACT_UNITS * 2.0 ** -stats.bits["loss_sum"] / bound  # terms at the bound: 100 to 200
    for _ in range(math.floor(capacity) + 1):
        stats.add("loss_sum", torch.tensor([bound], dtype=torch.float64))
    assert list(stats.reduce(CTX).problems()) == ["loss_sum"]


def test_int64_accumulation_keeps_the_full_range_exactly():
    """A segment that needs a finer unit than float64's 2^53-unit range allows (SphereFed's Z^T Z)
    accumulates each term as int64: sums far past 2^53 units stay exact, and the check follows 2^62."""
    big = 2.0**60 * 2.0**-FRAC_BITS  # 2^60 units a term
    stats = StatBuffer([Segment("z", 2, accumulate="int64")], torch.device("cpu"), max_terms=3)
    for _ in range(3):
        stats.add("z", torch.tensor([big, 1.0 * 2.0**-FRAC_BITS], dtype=torch.float64))
    assert not stats.reduce(CTX).problems()
    assert stats.view("z").tolist() == [3 * 2**60, 3]
    stats = StatBuffer([Segment("z", 1, accumulate="int64")], torch.device("cpu"), max_terms=5)
    for _ in range(5):
        stats.add("z", torch.tensor([big], dtype=torch.float64))
    assert "above" in stats.reduce(CTX).problems()["z"]  # 5 x 2^60 > 2^62: would overflow int64

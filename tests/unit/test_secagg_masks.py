"""Secure aggregation's pairwise and self masks (distfl/secagg/masks.py): the unmasked modular sum equals
the plain modular sum bit for bit, with any client order and with dropouts recovered; and the bytes of
the protocols' messages (distfl/secagg/cost.py)."""
import itertools

import pytest
import torch
from scipy import stats

from distfl.secagg import cost
from distfl.secagg.masks import MaskedRound, neighbours


def inputs(clients, numel, bits, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {c: torch.randint(0, 2**bits, (numel,), generator=g, dtype=torch.int64) for c in clients}


@pytest.mark.parametrize("degree", [None, 4], ids=["secagg", "secagg+"])
@pytest.mark.parametrize("dropped", [set(), {3}, {0, 5, 7}], ids=["none", "one", "three"])
def test_unmasked_sum_equals_the_plain_modular_sum(degree, dropped):
    clients, numel, bits = list(range(10)), 257, 16
    x = inputs(clients, numel, bits)
    masking = MaskedRound(clients, numel, bits, secret=1234, round_idx=5, degree=degree)
    senders = set(clients) - dropped
    sent = {c: masking.masked(c, x[c]) for c in senders}
    plain = torch.remainder(sum(x[c] for c in senders), 2**bits)
    for order in (sorted(senders), sorted(senders, reverse=True)):
        total = torch.remainder(sum(sent[c] for c in order), 2**bits)
        assert torch.equal(masking.unmask(total, senders), plain)
    # without the recovery the masks do not cancel
    assert not torch.equal(torch.remainder(sum(sent.values()), 2**bits), plain)


def test_a_masked_input_looks_nothing_like_the_input():
    clients, numel, bits = list(range(5)), 10_000, 8
    x = {c: torch.zeros(numel, dtype=torch.int64) for c in clients}
    y = MaskedRound(clients, numel, bits, secret=7, round_idx=0).masked(2, x[2])
    counts = torch.bincount(y, minlength=256).numpy()
    assert stats.chisquare(counts).pvalue > 1e-3  # uniform over the 256 values, whatever the input


def test_secagg_plus_graph_is_regular_and_keyed():
    clients = list(range(20))
    graph = neighbours(clients, 6, secret=3, round_idx=1)
    assert all(len(graph[c]) == 6 for c in clients)
    assert all(c in graph[o] for c in clients for o in graph[c])
    assert graph == neighbours(clients, 6, secret=3, round_idx=1)
    assert graph != neighbours(clients, 6, secret=3, round_idx=2)
    assert neighbours(clients, None, 3, 1)[0] == set(range(1, 20))


def test_revealed_secrets_count_the_senders_and_the_dropped_neighbours():
    masking = MaskedRound(list(range(8)), 4, 8, secret=1, round_idx=0)
    assert masking.revealed(set(range(8))) == 8
    assert masking.revealed(set(range(6))) == 6 + 2


@pytest.mark.parametrize("numel,bits,n", [(1000, 16, 9), (2**20, 20, 99), (7, 32, 3)])
def test_message_bytes_follow_the_protocol(numel, bits, n):
    up = 2 * 32 + n * (2 * 32 + 16) + -(-numel * bits // 8) + n * 32
    assert cost.upload_bytes(numel, bits, n) == up
    assert cost.download_bytes(n) == n * 64 + n * 80
    # SecAgg+ with k = 2 log2(n)-ish neighbours costs less than the complete graph once n is large
    assert cost.upload_bytes(numel, bits, 14) < cost.upload_bytes(numel, bits, 999)

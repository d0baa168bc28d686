"""The distributed-DP pipeline (distfl/privacy/distributed.py): without noise and with room in the bits,
the decoded modular sum returns the plain sum to within the rounding bound; too few bits wrap and the
sum is lost; the noise has the variance the accountant assumes."""
import math

import pytest
import torch

from distfl.compression import keyed_generator
from distfl.compression.rotation import Rotation
from distfl.privacy.distributed import DistributedDP
from distfl.secagg.modular import modular_sum, wraps


def run(pipeline, updates, round_key=(0, 1)):
    rotation = Rotation(updates[0].numel(), keyed_generator(*round_key))
    encoded = [pipeline.encode(x, rotation, keyed_generator(*round_key, i)) for i, x in enumerate(updates)]
    return pipeline.decode(modular_sum(encoded, *pipeline.bounds), rotation), encoded


def client_updates(n=10, d=1000, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(d, generator=g) * 0.01 for _ in range(n)]


@pytest.mark.parametrize("mechanism", ["ddgauss", "skellam"])
def test_without_noise_the_decoded_sum_is_the_plain_sum_to_the_rounding_bound(mechanism):
    updates = client_updates()
    pipeline = DistributedDP(mechanism, l2_clip=10.0, bits=32, scale=2**16, local_sigma=0.0)
    decoded, _ = run(pipeline, updates)
    plain = torch.stack(updates).double().sum(0)
    # each client's rounding moves each rotated coordinate by less than 1 grid unit: ||error|| <= n sqrt(d) / s
    bound = len(updates) * math.sqrt(1024) / pipeline.scale
    assert float((decoded - plain).norm()) <= bound
    assert float((decoded - plain).norm()) < 1e-3 * float(plain.norm())


def test_clipping_applies_before_the_sum():
    updates = [torch.full((64,), 1.0), torch.full((64,), -0.5)]
    pipeline = DistributedDP("ddgauss", l2_clip=1.0, bits=32, scale=2**20, local_sigma=0.0)
    decoded, _ = run(pipeline, updates)
    # both clip to norm 1: +1/8 and -1/8 a coordinate, which cancel (unclipped they would sum to +0.5)
    assert torch.allclose(decoded, torch.zeros(64, dtype=torch.float64), atol=1e-4)


def test_too_few_bits_wrap_and_lose_the_sum():
    updates = client_updates(n=20)
    pipeline = DistributedDP("ddgauss", l2_clip=10.0, bits=8, scale=2**12, local_sigma=0.0)
    rotation = Rotation(1000, keyed_generator(0, 1))
    unwrapped = sum(torch.round(rotation.forward(x.double() * pipeline.scale)) for x in updates)
    assert wraps(unwrapped, *pipeline.bounds) > 0
    decoded, _ = run(pipeline, updates)
    plain = torch.stack(updates).double().sum(0)
    assert float((decoded - plain).norm()) > float(plain.norm())


@pytest.mark.parametrize("mechanism", ["ddgauss", "skellam"])
def test_noise_of_the_survivors_has_the_accounted_variance(mechanism):
    n, d, sigma = 20, 4096, 0.05
    updates = [torch.zeros(d) for _ in range(n)]
    pipeline = DistributedDP(mechanism, l2_clip=1.0, bits=32, scale=100.0, local_sigma=sigma)
    decoded, _ = run(pipeline, updates)
    # the rotation is orthonormal, so the summed noise has variance n sigma^2 per coordinate
    variance = float(decoded[:d].var())
    assert variance == pytest.approx(n * sigma**2, rel=4 * math.sqrt(2 / d))


def test_encoding_is_keyed():
    updates = client_updates(n=3)
    pipeline = DistributedDP("skellam", l2_clip=1.0, bits=16, scale=2**8, local_sigma=0.01)
    a, encoded_a = run(pipeline, updates)
    b, encoded_b = run(pipeline, updates)
    assert torch.equal(a, b) and all(torch.equal(x, y) for x, y in zip(encoded_a, encoded_b))
    c, _ = run(pipeline, updates, round_key=(0, 2))
    assert not torch.equal(a, c)
    with pytest.raises(ValueError, match="mechanism"):
        DistributedDP("laplace", 1.0, 16, 1.0, 0.0)

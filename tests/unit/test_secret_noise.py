"""Secret mode's generator (distfl/privacy/csprng.py): AES-128-CTR under the run's whole key, its streams,
its Gaussians and its cohorts."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from scipy import stats

from distfl.federation.population import Population
from distfl.privacy import csprng, mechanism, secret

KEY = 0x5EC2E7_0123456789ABCDEF_0123456789
CPU = torch.device("cpu")


def _aes_blocks(key: int, first: int, count: int) -> bytes:
    """AES-128 of the counter blocks first, first + 1, ... one by one (ECB): the CTR keystream by definition."""
    encryptor = Cipher(algorithms.AES(key.to_bytes(16, "big")), modes.ECB()).encryptor()
    return b"".join(encryptor.update((first + i).to_bytes(16, "big")) for i in range(count))


def test_the_keystream_is_aes_128_ctr_of_nist_sp_800_38a():
    """NIST SP 800-38A, F.5.1 (CTR-AES128.Encrypt): key, initial counter block, first two plaintext and
    ciphertext blocks; the keystream is their XOR."""
    key, counter = 0x2B7E151628AED2A6ABF7158809CF4F3C, 0xF0F1F2F3F4F5F6F7F8F9FAFBFCFDFEFF
    plain = bytes.fromhex("6bc1bee22e409f96e93d7e117393172a" "ae2d8a571e03ac9c9eb76fac45af8e51")
    cipher = bytes.fromhex("874d6191b620e3261bef6864990db6ce" "9806f66b7970fdff8617187bb9fffdff")
    stream = csprng.keystream(key, counter, 32).tobytes()
    assert bytes(a ^ b for a, b in zip(stream, plain)) == cipher
    assert stream == _aes_blocks(key, counter, 2)


def test_streams_are_laid_out_as_documented():
    """Stream (domain, index, round) starts at the counter block domain | index | round | 0, and a long
    draw runs on through the counter (past the chunk OpenSSL is called with)."""
    assert csprng.counter_block(0x11, 0x02, 0x030405060708) == 0x11_02_030405060708_0000000000000000
    block = csprng.counter_block(11, 1, 7)
    blocks = csprng._CHUNK // 16 + 3
    assert csprng.keystream(KEY, block, 16 * blocks).tobytes() == _aes_blocks(KEY, block, blocks)
    for bad in ((256, 0, 1), (0, -1, 1), (0, 0, 1 << 48)):
        with pytest.raises(ValueError, match="out of range"):
            csprng.counter_block(*bad)


def test_gaussians_are_box_muller_of_53_bit_uniforms():
    """Each pair of outputs from a pair of keystream words, by the documented transform, recomputed here in
    Python's float64 arithmetic (math.log/cos/sin may differ from torch's by an ulp)."""
    n = 9  # odd: the last pair's sine is dropped
    z = csprng.normal(KEY, 11, 0, 3, n, CPU)
    assert z.dtype == torch.float64 and z.shape == (n,)
    raw = _aes_blocks(KEY, csprng.counter_block(11, 0, 3), 5)
    w = [int.from_bytes(raw[8 * i : 8 * i + 8], "little") >> 11 for i in range(10)]
    expected = []
    for k1, k2 in zip(w[::2], w[1::2]):
        radius = math.sqrt(-2 * math.log((k1 + 1) * 2.0 ** -53))
        expected += [radius * math.cos(2 * math.pi * k2 * 2.0 ** -53), radius * math.sin(2 * math.pi * k2 * 2.0 ** -53)]
    assert z.tolist() == pytest.approx(expected[:n], rel=1e-13, abs=1e-15)
    # A draw is a pure function of (key, stream): the same again, a prefix of a longer draw.
    assert torch.equal(z, csprng.normal(KEY, 11, 0, 3, n, CPU))
    assert torch.equal(z, csprng.normal(KEY, 11, 0, 3, 1000, CPU)[:n])


def test_gaussians_have_the_moments_and_the_distribution_of_n_0_1():
    """10^6 draws: mean and variance within 5 standard errors, the two outputs of a pair uncorrelated, and
    a Kolmogorov-Smirnov test against N(0, 1) that a correct sampler fails with probability 1e-4."""
    n = 1_000_000
    z = csprng.normal(KEY, 11, 0, 1, n, CPU).numpy()
    assert abs(z.mean()) < 5 / math.sqrt(n)
    assert abs(z.var() - 1) < 5 * math.sqrt(2 / n)
    assert abs(np.corrcoef(z[0::2], z[1::2])[0, 1]) < 5 / math.sqrt(n / 2)
    assert stats.kstest(z, "norm").pvalue > 1e-4
    # The tail: P(|z| > 3) = 0.0027, within 5 binomial standard errors.
    p = 2 * stats.norm.sf(3)
    assert abs(np.mean(np.abs(z) > 3) - p) < 5 * math.sqrt(p * (1 - p) / n)
    # Another round is another, independent stream.
    other = csprng.normal(KEY, 11, 0, 2, n, CPU).numpy()
    assert abs(np.corrcoef(z, other)[0, 1]) < 5 / math.sqrt(n)


def test_secret_noise_depends_on_the_top_bits_of_the_key(small_config):
    """Two keys that differ only in their top 32 bits. Drawn from torch's CPU generator seeded by a 64-bit
    digest of the key, their round-1 noise was the same: that generator keeps only the low 32 bits of its
    seed, so the noise had 2^32 possible values (these two keys were found by a birthday search)."""
    from distfl.config import load_config
    from distfl.federation.aggregate import Segment

    cfg = load_config(str(small_config), ["privacy.mechanism=gaussian", "privacy.delta=1e-3",
                                          "algorithm.weighting=uniform", "privacy.noise_multiplier=1"])
    noises = []
    for key in (0x000198540123456789ABCDEF01234567, 0x0001D4ED0123456789ABCDEF01234567):
        mech = mechanism.GaussianMechanism(cfg, [Segment("delta", 1000)], 1.0, CPU)
        mech.key = secret.NoiseKey(True, key)
        noises.append(mech.privatize({"delta": torch.zeros(1000, dtype=torch.float64)}, 1)["delta"])
    assert not torch.equal(*noises)
    assert abs(float(noises[0] @ noises[1])) / float(noises[0].norm() * noises[1].norm()) < 0.2


def test_secret_and_keyed_streams_are_apart():
    """Secret mode draws from the CSPRNG under the key; keyed mode keeps torch's generator seeded by the
    seed, as before (its runs reproduce)."""
    secret_key, keyed = secret.NoiseKey(True, 7), secret.NoiseKey(False, 7)
    assert torch.equal(mechanism.standard_normal(secret_key, 2, 0, 50, CPU), csprng.normal(7, 11, 0, 2, 50, CPU))
    assert torch.equal(mechanism.standard_normal(keyed, 2, 0, 50, CPU), secret.keyed_normal([7, 11, 2, 0], 50, CPU))


def _secret_mechanism(key: int):
    mech = mechanism.GaussianMechanism.__new__(mechanism.GaussianMechanism)
    mech.key = secret.NoiseKey(True, key)
    return mech


def test_secret_poisson_cohorts_are_the_csprng_s_uniforms_below_q():
    pop = Population([np.arange(i, i + 1) for i in range(200)])
    mech = _secret_mechanism(KEY)
    cohort = mech.cohort(pop, 4, 10, "poisson")
    raw = _aes_blocks(KEY, csprng.counter_block(3, 0, 4), 100)
    u = [(int.from_bytes(raw[8 * c : 8 * c + 8], "little") >> 11) * 2.0 ** -53 for c in range(200)]
    assert cohort == [c for c in range(200) if u[c] < 10 / 200]
    assert cohort != pop.cohort(KEY, 4, 10, "poisson")  # not numpy's generator


def test_secret_poisson_cohorts_include_each_client_with_probability_q():
    """2,000 rounds of 200 clients, q = 0.05: the inclusion rate over all 400,000 (client, round) pairs is
    within 4 standard errors of q, every client's own within 5, and the sizes vary as Binomial(200, q)."""
    n, m, rounds = 200, 10, 2000
    q = m / n
    pop, mech = Population([np.arange(i, i + 1) for i in range(n)]), _secret_mechanism(KEY)
    counts, sizes = np.zeros(n), []
    for t in range(1, rounds + 1):
        cohort = mech.cohort(pop, t, m, "poisson")
        counts[cohort] += 1
        sizes.append(len(cohort))
    assert abs(counts.sum() / (n * rounds) - q) < 4 * math.sqrt(q * (1 - q) / (n * rounds))
    assert np.max(np.abs(counts / rounds - q)) < 5 * math.sqrt(q * (1 - q) / rounds)
    assert np.var(sizes) == pytest.approx(n * q * (1 - q), rel=0.15)
    assert min(sizes) < 4 and max(sizes) > 16


def test_secret_random_cohorts_are_uniform_samples_of_the_size():
    n, m, rounds = 50, 5, 2000
    pop, mech = Population([np.arange(i, i + 1) for i in range(n)]), _secret_mechanism(KEY)
    counts = np.zeros(n)
    for t in range(1, rounds + 1):
        cohort = mech.cohort(pop, t, m, "random")
        assert len(set(cohort)) == m and cohort == sorted(cohort)
        counts[cohort] += 1
    q = m / n
    assert np.max(np.abs(counts / rounds - q)) < 5 * math.sqrt(q * (1 - q) / rounds)
    # The m smallest of the clients' keystream words.
    w = np.frombuffer(_aes_blocks(KEY, csprng.counter_block(1, 0, 9), n // 2), dtype="<u8")
    assert mech.cohort(pop, 9, m, "random") == sorted(np.argsort(w, kind="stable")[:m].tolist())
    assert mech.cohort(pop, 9, n + 1, "random") == list(range(n))
    assert mech.cohort(pop, 9, m, "sequential") == pop.cohort(KEY, 9, m, "sequential")

"""Compressors of a client's update (distfl/compression): identities, exact sizes, unbiasedness over
keyed draws, the vNMSE their papers state, and error feedback's telescoping sum."""
import math

import pytest
import torch
from scipy import integrate, stats

from distfl.compression import (Drive, Eden, ErrorFeedback, HalfPrecision, QSGD, RandK, ScaledSign, TopK, build,
                                keyed_generator)
from distfl.compression.eden import normal_centroids
from distfl.compression.rotation import Rotation, hadamard


def vnmse(decoded, x):
    return float((decoded.double() - x.double()).square().sum() / x.double().square().sum())


def test_identities_return_the_input_bit_for_bit():
    x = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    assert torch.equal(TopK(density=1.0).compress(x).decoded, x)
    assert torch.equal(RandK(k=1000).compress(x, keyed_generator(0, 1, 2)).decoded, x)
    representable = x.to(torch.bfloat16).float()
    assert torch.equal(HalfPrecision("bf16").compress(representable).decoded, representable)


def test_topk_keeps_the_largest_magnitudes_and_randk_rescales():
    x = torch.tensor([0.5, -3.0, 0.1, 2.0, -0.2, 1.0])
    assert TopK(k=2).compress(x).decoded.tolist() == [0.0, -3.0, 0.0, 2.0, 0.0, 0.0]
    kept = RandK(k=3).compress(x, keyed_generator(7)).decoded
    nonzero = kept != 0
    assert int(nonzero.sum()) == 3 and torch.allclose(kept[nonzero], x[nonzero] * 2)
    assert torch.equal(RandK(k=3, rescale=False).compress(x, keyed_generator(7)).decoded[nonzero], x[nonzero])


@pytest.mark.parametrize("d", [1, 7, 1000, 4096, 100_000])
def test_encoded_sizes_follow_their_closed_forms(d):
    n = 1 << math.ceil(math.log2(d)) if d > 1 else 1
    k10 = math.ceil(0.1 * d)
    assert TopK(density=0.1).bits(d) == 32 * k10 + min(32 * k10, d)
    assert RandK(density=0.1).bits(d) == 32 * k10
    assert QSGD(bits=4).bits(d) == 32 + 4 * d
    assert ScaledSign().bits(d) == d + 32
    assert Drive().bits(d) == n + 32
    assert Eden(bits=3).bits(d) == 3 * n + 32
    assert Drive(rotation="uniform").bits(d) == d + 32
    assert HalfPrecision("fp16").bits(d) == 16 * d
    x = torch.randn(d)
    for compressor in (TopK(density=0.1), QSGD(bits=4), ScaledSign(), Eden(bits=3), HalfPrecision("fp16")):
        assert compressor.compress(x, keyed_generator(0)).bits == compressor.bits(d)


def test_topk_size_agrees_with_flsims_bitmask_rule_where_the_bitmap_is_smaller():
    # FLSim's SparseMaskChannel, bitmask measurement, per parameter: numel / 8 bytes of mask plus 4 bytes
    # per kept value, nse = numel - int(proportion_of_zero_weights * numel).
    for numel, zero_share in [(4096, 0.9), (80_000, 0.95), (1024, 0.5)]:
        nse = numel - int(zero_share * numel)
        flsim_bytes = numel * 0.125 + 4 * nse
        assert 32 * nse > numel and TopK(k=nse).bits(numel) / 8 == flsim_bytes
    # sparser than 1 in 32, int32 indices are smaller than the bitmap and are what is counted
    assert TopK(k=800).bits(80_000) / 8 == 8 * 800 < 80_000 * 0.125 + 4 * 800


def test_keyed_draws_repeat_for_a_key_and_differ_across_keys():
    x = torch.randn(512, generator=torch.Generator().manual_seed(1))
    for compressor in (RandK(density=0.2), QSGD(bits=3), Drive(), Eden(bits=2)):
        a = compressor.compress(x, keyed_generator(5, 3, 11, 0)).decoded
        assert torch.equal(a, compressor.compress(x, keyed_generator(5, 3, 11, 0)).decoded)
        assert not torch.equal(a, compressor.compress(x, keyed_generator(5, 3, 12, 0)).decoded)
    with pytest.raises(ValueError, match="keyed generator"):
        QSGD(bits=4).compress(x)


@pytest.mark.parametrize("compressor", [RandK(density=0.25), QSGD(bits=2), QSGD(bits=4), Drive(rotation="uniform"),
                                        Eden(bits=1, rotation="uniform"), Eden(bits=3, rotation="uniform")],
                         ids=["randk", "qsgd2", "qsgd4", "drive", "eden1", "eden3"])
def test_unbiased_compressors_average_to_the_input_within_four_standard_errors(compressor):
    assert compressor.unbiased
    x = torch.randn(64, generator=torch.Generator().manual_seed(2)) * torch.linspace(0.1, 2, 64)
    draws = torch.stack([compressor.compress(x, keyed_generator(9, i)).decoded.double() for i in range(4000)])
    standard_error = draws.std(dim=0) / math.sqrt(len(draws))
    z = (draws.mean(dim=0) - x.double()).abs() / standard_error
    assert float(z.max()) < 4.0


def test_the_hadamard_rotation_is_close_to_unbiased_but_not_exactly():
    # what rotation.py states: DRIVE's unbiased scale over the Hadamard rotation, 16,000 draws, d = 64
    x = torch.randn(64, generator=torch.Generator().manual_seed(2)) * torch.linspace(0.1, 2, 64)
    mean = torch.stack([Drive().compress(x, keyed_generator(9, i)).decoded.double() for i in range(16000)]).mean(0)
    assert float((mean - x.double()).norm() / x.double().norm()) == pytest.approx(0.019, abs=0.001)


def test_biased_forms_are_declared_biased():
    assert not TopK(density=0.1).unbiased and not ScaledSign().unbiased
    assert not RandK(density=0.1, rescale=False).unbiased and not Drive(unbiased=False).unbiased


def lloyd_max_distortion(bits):
    """E[(Z - Q(Z))^2] for Z ~ N(0, 1) and the centroids, by numerical integration (independent of the
    compressor's own arithmetic)."""
    c = normal_centroids(bits)
    bounds = [-math.inf] + [(a + b) / 2 for a, b in zip(c, c[1:])] + [math.inf]
    return sum(integrate.quad(lambda t, m=m: (t - m) ** 2 * stats.norm.pdf(t), lo, hi)[0]
               for m, lo, hi in zip(c, bounds, bounds[1:]))


def test_lloyd_max_centroids_are_the_known_ones():
    assert normal_centroids(1)[1] == pytest.approx(math.sqrt(2 / math.pi), abs=1e-12)
    # Max (1960), Table I, 4 levels: +-0.4528, +-1.510; distortion 0.1175
    assert normal_centroids(2)[2:] == pytest.approx((0.4528, 1.510), abs=1e-3)
    assert lloyd_max_distortion(2) == pytest.approx(0.1175, abs=1e-4)


def test_drive_and_eden_vnmse_at_large_dimension_match_their_papers():
    x = torch.randn(1 << 20, generator=torch.Generator().manual_seed(3)) ** 3  # far from Gaussian
    # DRIVE (NeurIPS 2021): vNMSE -> 1 - 2/pi (biased scale), pi/2 - 1 (unbiased scale) as d grows
    assert vnmse(Drive(unbiased=False).compress(x, keyed_generator(1)).decoded, x) == pytest.approx(
        1 - 2 / math.pi, abs=0.005)
    assert vnmse(Drive().compress(x, keyed_generator(1)).decoded, x) == pytest.approx(math.pi / 2 - 1, abs=0.01)
    # EDEN (ICML 2022), unbiased scale: D_b / (1 - D_b) with D_b the Lloyd-Max distortion of N(0, 1)
    for bits in (1, 2, 4):
        distortion = lloyd_max_distortion(bits)
        measured = vnmse(Eden(bits=bits).compress(x, keyed_generator(bits)).decoded, x)
        assert measured == pytest.approx(distortion / (1 - distortion), rel=0.03)


def test_rotation_is_orthonormal_and_inverts():
    x = torch.randn(1000, dtype=torch.float64)
    rotation = Rotation(1000, keyed_generator(4))
    y = rotation.forward(x)
    assert y.numel() == 1024 and float(y.norm()) == pytest.approx(float(x.norm()), rel=1e-12)
    assert torch.allclose(rotation.inverse(y), x, atol=1e-12, rtol=0)
    n = 16
    h = torch.tensor([[(-1) ** bin(i & j).count("1") for j in range(n)] for i in range(n)], dtype=torch.float64)
    assert torch.equal(hadamard(torch.eye(n, dtype=torch.float64)), h)  # Sylvester's matrix, row by row


def test_error_feedback_telescopes_exactly_for_topk_on_exact_arithmetic():
    g = torch.Generator().manual_seed(5)
    updates = [torch.randint(-64, 65, (300,), generator=g).float() / 1024 for _ in range(20)]
    feedback, residual, sent_sum = ErrorFeedback(TopK(density=0.05)), None, torch.zeros(300)
    for x in updates:
        sent, residual = feedback.compress(x, residual)
        sent_sum += sent.decoded
    assert torch.equal(sent_sum + residual, torch.stack(updates).sum(dim=0))


def test_error_feedback_telescopes_to_float_rounding_for_a_random_compressor():
    g = torch.Generator().manual_seed(6)
    updates = [torch.randn(500, generator=g) for _ in range(30)]
    feedback, residual = ErrorFeedback(RandK(density=0.1, rescale=False)), None
    sent_sum = torch.zeros(500, dtype=torch.float64)
    for t, x in enumerate(updates):
        sent, residual = feedback.compress(x, residual, keyed_generator(0, t, 1))
        sent_sum += sent.decoded.double()
    raw = torch.stack(updates).double().sum(dim=0)
    assert torch.allclose(sent_sum + residual.double(), raw, atol=1e-5, rtol=0)


def test_build_names_the_valid_compressors():
    assert isinstance(build("eden", bits=2), Eden) and build("fp16").dtype == "fp16"
    with pytest.raises(ValueError, match="valid: bf16, drive, eden, fp16, qsgd, randk, signsgd, topk"):
        build("zip")
    with pytest.raises(ValueError, match="exactly one of density"):
        TopK()


def test_powersgd_is_exact_at_full_rank_and_low_rank_otherwise():
    from distfl.compression import PowerSGD
    g = torch.Generator().manual_seed(8)
    weight = torch.randn(16, 3, 3, 3, generator=g)  # a conv weight: 16 x 27
    full, q = PowerSGD(rank=16).compress_matrix(weight, None, keyed_generator(1))
    assert full.bits == 16 * 27 * 32 and torch.allclose(full.decoded, weight, atol=1e-5)  # factors cost more: sent as is
    low, q = PowerSGD(rank=2).compress_matrix(weight, None, keyed_generator(1))
    assert low.bits == 32 * 2 * (16 + 27) and q.shape == (27, 2)
    assert torch.linalg.matrix_rank(low.decoded.reshape(16, 27).double(), atol=1e-4) == 2
    # warm start: repeated compression of a matrix converges to its best rank-2 approximation (a spectrum
    # with a gap, so that subspace iteration converges in a few steps)
    u, _, vh = torch.linalg.svd(weight.reshape(16, 27).double(), full_matrices=False)
    spectrum = torch.tensor([10.0, 5.0] + [0.5] * 14, dtype=torch.float64)
    weight = ((u * spectrum) @ vh).float().reshape(16, 3, 3, 3)
    for _ in range(30):
        low, q = PowerSGD(rank=2).compress_matrix(weight, q)
    u, s, vh = torch.linalg.svd(weight.reshape(16, 27).double())
    best = (u[:, :2] * s[:2]) @ vh[:2]
    assert torch.allclose(low.decoded.reshape(16, 27).double(), best, atol=1e-4)
    bias, state = PowerSGD(rank=2).compress_matrix(torch.ones(16), None)
    assert state is None and bias.bits == 16 * 32 and torch.equal(bias.decoded, torch.ones(16))


def test_count_sketch_is_linear_and_recovers_heavy_hitters():
    from distfl.compression import CountSketch
    d = 10_000
    sketch = CountSketch(d, rows=5, columns=500, generator=keyed_generator(3))
    assert sketch.bits() == 5 * 500 * 32
    g = torch.Generator().manual_seed(9)
    a = torch.randint(-8, 9, (d,), generator=g).double()
    b = torch.randint(-8, 9, (d,), generator=g).double()
    assert torch.equal(sketch.sketch(a) + sketch.sketch(b), sketch.sketch(a + b))  # exact on integers
    heavy = torch.zeros(d, dtype=torch.float64)
    heavy[torch.tensor([5, 77, 4000, 9999])] = torch.tensor([100.0, -80.0, 60.0, 120.0], dtype=torch.float64)
    noisy = heavy + torch.randn(d, generator=g, dtype=torch.float64) * 0.01
    recovered = sketch.unsketch(sketch.sketch(noisy), k=4)
    assert set(recovered.nonzero().flatten().tolist()) == {5, 77, 4000, 9999}
    assert torch.allclose(recovered[heavy != 0], heavy[heavy != 0], atol=1.0)

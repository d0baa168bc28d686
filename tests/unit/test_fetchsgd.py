"""FetchSGD's server (compression/fetchsgd.py) and the compressed model download (compression/download.py)
on vectors: the sketch is linear exactly, a wide sketch makes FetchSGD's update the top-k, the server's
error keeps what was not applied, and the download's sizes and keyed rounding."""

import torch

from distfl.compression import QSGD, CountSketch, TopK, keyed_generator
from distfl.compression.download import ModelDownload
from distfl.compression.fetchsgd import FetchSGDServer


def dyadic(generator, d):
    """Values on a grid of 2^-10 below 2^10: every sum of a few of them is exact in float64."""
    return torch.randint(-2**20, 2**20, (d,), generator=generator).to(torch.float64) / 2**10


def test_the_sum_of_sketches_is_the_sketch_of_the_sum_exactly():
    g = keyed_generator(11)
    sketch = CountSketch(1000, rows=5, columns=64, generator=keyed_generator(7))
    updates = [dyadic(g, 1000) for _ in range(6)]
    assert torch.equal(sum(sketch.sketch(x) for x in updates), sketch.sketch(sum(updates)))


def test_one_client_with_a_wide_sketch_gets_the_top_k_and_the_server_keeps_the_rest():
    """rows 5, columns >> d: every coordinate sits alone in most rows, so the median reads it back exactly;
    with lr 1 and no momentum the first update is the top-k of the client's update, and the error sketch
    holds the rest, which the next round (no new update) applies."""
    d, k = 300, 30
    x = torch.randn(d, generator=keyed_generator(5), dtype=torch.float64)
    server = FetchSGDServer(d, rows=5, columns=1 << 16, k=k, seed=3)
    first = server.step(server.client_sketch(x), lr=1.0, rho=0.0)
    top = TopK(k=k).compress(x).decoded
    assert torch.equal(first, top)
    second = server.step(torch.zeros(server.size, dtype=torch.float64), lr=1.0, rho=0.0)
    assert torch.equal(second, TopK(k=k).compress(x - top).decoded)


def test_the_server_sketches_resume_exactly():
    server = FetchSGDServer(200, rows=3, columns=50, k=10, seed=1)
    sketches = [server.client_sketch(torch.randn(200, generator=keyed_generator(t))) for t in range(4)]
    for s in sketches[:2]:
        server.step(s, lr=0.5, rho=0.9)
    resumed = FetchSGDServer(200, rows=3, columns=50, k=10, seed=1)
    resumed.load_state_dict(server.state_dict())
    for s in sketches[2:]:
        assert torch.equal(server.step(s, lr=0.5, rho=0.9), resumed.step(s, lr=0.5, rho=0.9))


def test_download_sizes_follow_their_formulas_and_the_rounding_is_keyed():
    slices = [slice(0, 640), slice(640, 650)]
    params = torch.randn(650, generator=keyed_generator(2))
    assert ModelDownload("fp16", 8, slices, 0).bits(650) == 16 * 650
    assert ModelDownload("none", 8, slices, 0).bits(650) == 32 * 650
    qsgd = ModelDownload("qsgd", 4, slices, seed=9)
    assert qsgd.bits(650) == (32 + 4 * 640) + (32 + 4 * 10) == QSGD(4).bits(640) + QSGD(4).bits(10)
    assert torch.equal(qsgd.decode(params, 3), qsgd.decode(params, 3))
    assert not torch.equal(qsgd.decode(params, 3), qsgd.decode(params, 4))
    # each tensor on its own: its norm times levels of 1/7
    levels = qsgd.decode(params, 3)[:640] / torch.linalg.vector_norm(params[:640].double()).float() * 7
    assert torch.allclose(levels, levels.round(), atol=1e-4)
    assert torch.equal(ModelDownload("bf16", 8, slices, 0).decode(params, 1), params.bfloat16().float())


def test_packs_compress_every_row_as_one_at_a_time():
    """compress_rows over a [pack, d] tensor gives each row what compress gives it alone, bit for bit."""
    from distfl.compression import HalfPrecision, RandK

    rows = torch.randn(4, 500, generator=keyed_generator(8))
    rows[2] = 0.0  # a client whose update is zero
    for compressor in (TopK(density=0.05), QSGD(bits=4), HalfPrecision("bf16"), RandK(density=0.1)):
        keys = [(1, 2, client) for client in range(4)]
        alone = torch.stack([compressor.compress(row, keyed_generator(*key)).decoded for row, key in zip(rows, keys)])
        assert torch.equal(compressor.compress_rows(rows, [keyed_generator(*key) for key in keys]), alone), compressor

"""TCT eNTK features (distfl/tct/features.py): the vectorised extraction against Algorithm 3's loop."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from distfl.models import build_model
from distfl.config.schema import ModelConfig
from distfl.tct import features as features_module
from distfl.tct.features import (
    coordinate_index,
    entk_features,
    entk_features_loop,
    feature_method,
    feature_parameters,
    reinit_head,
)


def num_params(model, which="all"):
    return sum(p.numel() for _, p in feature_parameters(model, which))


def rel_max(a, b):
    return float((a - b).abs().max() / b.abs().max())


def _fmnist_model(name: str, seed: int):
    """An FMNIST-shaped `name` model with TCT's re-initialised head (head seed 7)."""
    torch.manual_seed(seed)
    model = build_model(ModelConfig(name=name), (1, 28, 28), 10)
    reinit_head(model, 7)
    return model


@pytest.fixture(scope="module")
def simplecnn():
    return _fmnist_model("simplecnn", 0)


@pytest.fixture(scope="module")
def resnet20():
    torch.manual_seed(1)
    model = build_model(ModelConfig(name="resnet20"), (3, 16, 16), 10)
    # Non-trivial running statistics, so eval mode visibly differs from batch statistics.
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
    reinit_head(model, 7)
    return model


@pytest.mark.parametrize("which", ["all", "extractor"])
@pytest.mark.parametrize("p", [4000, None])  # None: p = P
def test_vectorised_matches_loop_simplecnn(simplecnn, which, p):
    P = num_params(simplecnn, which)
    p = P if p is None else p
    index = coordinate_index(P, p, 123)
    x = torch.randn(12, 1, 28, 28)
    fast = entk_features(simplecnn, x, index, which=which, chunk_size=5)
    ref = entk_features_loop(simplecnn, x, index, which=which)
    assert fast.shape == (12, p) and fast.dtype == torch.float32
    assert rel_max(fast, ref) < 1e-5


@pytest.mark.parametrize("which", ["all", "extractor"])
def test_vectorised_matches_loop_batchnorm(resnet20, which):
    resnet20.train()
    buffers = {k: v.clone() for k, v in resnet20.named_buffers()}
    params = {k: v.clone() for k, v in resnet20.named_parameters()}
    P = num_params(resnet20, which)
    index = coordinate_index(P, 3000, 123)
    x = torch.randn(5, 3, 16, 16)
    fast = entk_features(resnet20, x, index, which=which, chunk_size=3)
    assert resnet20.training  # mode restored
    ref = entk_features_loop(resnet20, x, index, which=which)
    assert rel_max(fast, ref) < 1e-5
    # Eval mode: running statistics neither used from the batch nor updated.
    for k, v in resnet20.named_buffers():
        assert torch.equal(v, buffers[k]), k
    for k, v in resnet20.named_parameters():
        assert torch.equal(v, params[k]), k


def test_feature_parameters(simplecnn):
    all_params = feature_parameters(simplecnn, "all")
    assert [p for _, p in all_params] == list(simplecnn.parameters())
    assert num_params(simplecnn, "all") == 44426
    extractor = feature_parameters(simplecnn, "extractor")
    assert all(not name.startswith("head.") for name, _ in extractor)
    assert num_params(simplecnn, "extractor") == 44426 - (84 * 10 + 10)
    with pytest.raises(ValueError):
        feature_parameters(simplecnn, "head")


def test_head_rows_beyond_logit0_give_zero_features(simplecnn):
    # Only row 0 of the C-output head (and bias 0) reaches logit 0 (documented in reinit_head).
    P = num_params(simplecnn, "all")
    head_start = P - (84 * 10 + 10)
    index = torch.arange(head_start, P)
    z = entk_features(simplecnn, torch.randn(4, 1, 28, 28), index)
    weight, bias = z[:, :840].reshape(4, 10, 84), z[:, 840:]
    assert torch.all(weight[:, 1:] == 0) and torch.all(bias[:, 1:] == 0)
    assert torch.all(bias[:, 0] == 1)  # d logit_0 / d b_0
    assert weight[:, 0].abs().sum() > 0


def test_coordinate_index_is_algorithm3_mask():
    a, b = coordinate_index(44426, 1000, 123), coordinate_index(44426, 1000, 123)
    assert a.dtype == torch.long and a.shape == (1000,)
    assert torch.equal(a, b)
    assert not torch.equal(a, coordinate_index(44426, 1000, 124))
    with torch.random.fork_rng():
        torch.manual_seed(123)
        paper = torch.randperm(44426)[:1000]
    assert torch.equal(a, paper)
    assert len(set(a.tolist())) == 1000


def test_coordinate_index_in_parameter_order_is_the_same_coordinates_sorted():
    drawn = coordinate_index(44426, 1000, 123)
    assert torch.equal(coordinate_index(44426, 1000, 123, order="parameter"), drawn.sort().values)
    assert torch.equal(coordinate_index(500, 100_000, 123, "parameter"), torch.arange(500))
    with pytest.raises(ValueError, match="order"):
        coordinate_index(500, 10, 123, "sorted")


def test_coordinate_index_p_larger_than_P():
    idx = coordinate_index(500, 100_000, 123)
    assert idx.shape == (500,)
    assert torch.equal(idx.sort().values, torch.arange(500))
    assert not torch.equal(idx, torch.arange(500))  # permuted, as randperm(P)[:p]
    with pytest.raises(ValueError):
        coordinate_index(0, 10, 1)


def test_chunk_size_does_not_change_result(simplecnn):
    index = coordinate_index(num_params(simplecnn), 3000, 5)
    x = torch.randn(10, 1, 28, 28)
    ref = entk_features(simplecnn, x, index, chunk_size=10)
    for chunk in (1, 3, 64):
        assert rel_max(entk_features(simplecnn, x, index, chunk_size=chunk), ref) < 1e-6


def test_reinit_head_is_seeded_default_linear_init():
    torch.manual_seed(0)
    m1 = build_model(ModelConfig(name="simplecnn"), (1, 28, 28), 10)
    m2 = build_model(ModelConfig(name="simplecnn"), (1, 28, 28), 10)
    state = torch.random.get_rng_state()
    reinit_head(m1, 42)
    reinit_head(m2, 42)
    assert torch.equal(torch.random.get_rng_state(), state)  # global RNG untouched
    assert torch.equal(m1.head.weight, m2.head.weight) and torch.equal(m1.head.bias, m2.head.bias)
    with torch.random.fork_rng():
        torch.manual_seed(42)
        default = nn.Linear(84, 10)
    assert torch.equal(m1.head.weight, default.weight) and torch.equal(m1.head.bias, default.bias)
    reinit_head(m2, 43)
    assert not torch.equal(m1.head.weight, m2.head.weight)


@pytest.mark.parametrize("p", [2000, None])  # None: p = P in parameter order, every layer written directly
def test_fp16_output_and_out_argument(simplecnn, p):
    P = num_params(simplecnn)
    index = coordinate_index(P, P if p is None else p, 9, "drawn" if p else "parameter")
    p = index.numel()
    x = torch.randn(7, 1, 28, 28)
    fp32 = entk_features(simplecnn, x, index, chunk_size=4)
    fp16 = entk_features(simplecnn, x, index, chunk_size=4, out_dtype=torch.float16)
    assert fp16.dtype == torch.float16
    assert torch.equal(fp16, fp32.to(torch.float16))
    out = torch.full((7, p), float("nan"), dtype=torch.float16)
    assert entk_features(simplecnn, x, index, chunk_size=4, out_dtype=torch.float16, out=out) is out
    assert torch.equal(out, fp16)
    with pytest.raises(ValueError, match="dtype"):
        entk_features(simplecnn, x, index, out=out)  # out is fp16, out_dtype defaults to fp32
    with pytest.raises(ValueError, match="shape"):
        entk_features(simplecnn, x, index, out=torch.empty(6, p))


@pytest.mark.parametrize("order", ["drawn", "parameter"])  # gathered / written directly
def test_fp16_overflow_raises(simplecnn, order):
    index = coordinate_index(num_params(simplecnn), num_params(simplecnn), 0, order)
    with pytest.raises(ValueError, match="float16"):
        entk_features(simplecnn, 1e6 * torch.rand(2, 1, 28, 28), index, out_dtype=torch.float16)


def test_feature_method(simplecnn, resnet20):
    """Models of Linear and Conv2d layers take the layer-wise path; ResNet-20 (BatchNorm) torch.func."""
    assert feature_method(simplecnn, "all") == feature_method(simplecnn, "extractor") == "layer-wise"
    assert feature_method(build_model(ModelConfig(name="tct_cnn"), (1, 28, 28), 10)) == "layer-wise"
    assert feature_method(resnet20) == "vmap"


@pytest.fixture(scope="module")
def tct_cnn():
    return _fmnist_model("tct_cnn", 2)


def _whole_and_partial_layers(model, which: str) -> torch.Tensor:
    """A sorted index holding every coordinate of some parameters (written directly) and a random
    fifth of the others' (gathered, in several runs of output columns)."""
    sizes = [p.numel() for _, p in feature_parameters(model, which)]
    gen = torch.Generator().manual_seed(2)
    parts, start = [], 0
    for t, size in enumerate(sizes):
        whole = t in (0, 1, len(sizes) - 1)  # conv1 weight and bias, the last bias
        parts.append(start + (torch.arange(size) if whole else torch.randperm(size, generator=gen)[:size // 5]))
        start += size
    return torch.cat(parts)


def test_a_whole_parameter_interleaved_with_another_is_gathered_not_written_as_a_block():
    """Every coordinate of the first bias is in the index and its local positions 0, 1, ... look
    consecutive, but another parameter's coordinates sit between them: the columns must still be each
    coordinate's own."""
    torch.manual_seed(5)
    model = nn.Sequential()
    model.features, model.head = nn.Linear(3, 2), nn.Linear(2, 2)
    model.forward = lambda x: model.head(torch.tanh(model.features(x)))
    # features.weight: 0-5, features.bias: 6-7, head.weight: 8-11, head.bias: 12-13
    index = torch.tensor([6, 9, 7, 8, 0, 1, 2, 3, 4, 5, 10, 11, 12, 13])
    x = torch.randn(4, 3)
    assert rel_max(entk_features(model, x, index), entk_features_loop(model, x, index)) < 1e-6


@pytest.mark.parametrize("which", ["all", "extractor"])
@pytest.mark.parametrize("p,order", [(40, "drawn"), (20_000, "drawn"), (20_000, "parameter"), (None, "drawn"),
                                     (None, "parameter"), ("whole and partial layers", "parameter")])
def test_layer_wise_matches_loop_conv_and_linear(tct_cnn, which, p, order):
    """tct_cnn (1- and 32-channel padded Conv2d layers, Linear layers) against Algorithm 3's loop. At
    p = 40 most layers have no chosen coordinate, and 19 samples in chunks of 18 leave a chunk of one
    and partial groups of samples inside the per-sample convolution and the gather. p = P (None) in
    parameter order writes every layer directly; in drawn order it gathers every coordinate; the
    mixed index does both in one chunk."""
    assert feature_method(tct_cnn, which) == "layer-wise"
    P = num_params(tct_cnn, which)
    if p == "whole and partial layers":
        index = _whole_and_partial_layers(tct_cnn, which)
    else:
        index = coordinate_index(P, P if p is None else p, 11, order)
    x = torch.randn(19, 1, 28, 28)
    fast = entk_features(tct_cnn, x, index, which=which, chunk_size=18)
    ref = entk_features_loop(tct_cnn, x, index, which=which)
    assert fast.shape == ref.shape == (19, index.numel())
    assert rel_max(fast, ref) < 1e-5


@pytest.mark.parametrize("case", ["layer used twice", "Linear on 3-D input"])
def test_unsupported_forward_falls_back_to_vmap(case):
    """What the layer-wise path cannot handle is seen only when running; the result is still Algorithm 3's."""
    torch.manual_seed(4)
    model = nn.Sequential()
    model.features, model.head = nn.Linear(6, 6), nn.Linear(6, 3)
    if case == "layer used twice":
        model.forward = lambda x: model.head(torch.tanh(model.features(torch.tanh(model.features(x)))))
        x = torch.randn(5, 6)
    else:
        model.forward = lambda x: model.head(torch.tanh(model.features(x)).mean(1))
        x = torch.randn(5, 4, 6)
    assert feature_method(model) == "layer-wise"
    index = coordinate_index(num_params(model), 50, 1)
    assert rel_max(entk_features(model, x, index, chunk_size=2), entk_features_loop(model, x, index)) < 1e-5


@pytest.mark.parametrize("order", ["drawn", "parameter"])  # conv weights gathered / written directly
@pytest.mark.parametrize("in_channels", [1, 2])
@pytest.mark.parametrize("stride,padding,dilation", [(1, 0, 1), (2, 1, 1), (3, 2, 2), ((2, 1), (0, 2), (1, 2))])
def test_layer_wise_conv_matches_loop_for_stride_padding_dilation(in_channels, stride, padding, dilation, order,
                                                                  monkeypatch):
    """Both forms of the per-sample Conv2d weight gradient (1 input channel, more) cover every geometry
    the layer-wise path accepts (stride 3 on 13 pixels leaves input rows unused), against Algorithm 3."""
    torch.manual_seed(3)
    conv = nn.Conv2d(in_channels, 3, (3, 2), stride=stride, padding=padding, dilation=dilation)
    features = nn.Sequential(conv, nn.ReLU(), nn.Flatten())
    width = features(torch.zeros(1, in_channels, 13, 11)).shape[1]
    model = nn.Sequential()
    model.features, model.head = features, nn.Linear(width, 4)
    model.forward = lambda x: model.head(model.features(x))
    assert feature_method(model) == "layer-wise"
    P = num_params(model)
    index = coordinate_index(P, P, 5, order)
    x = torch.randn(21, in_channels, 13, 11)
    # Groups of 8 samples per per-sample convolution: chunks of 20 leave a partial group.
    per_sample = (x[0].numel() + conv(x[:1]).numel()) * 4
    monkeypatch.setattr(features_module, "CONV_GRAD_BYTES", 8 * per_sample + 1)
    assert rel_max(entk_features(model, x, index, chunk_size=20), entk_features_loop(model, x, index)) < 1e-5

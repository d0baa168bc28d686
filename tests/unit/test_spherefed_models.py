"""Tests for SphereFed's CIFAR models (vgg13, senet18, mobilenetv2): shapes, the features/head split,
parameter counts, BN and GN, the sphere head, and input-size / gn_groups errors."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from distfl.errors import ConfigError
from distfl.models import build_model
from distfl.models.heads import FixedHead, orthonormality_error
from distfl.config.schema import ModelConfig

# name -> (feature_dim, params at 3x32x32 with 100 classes, with 10 classes), as in the module docstrings
SPECS = {
    "vgg13": (512, 9_462_180, 9_416_010),
    "senet18": (512, 11_309_212, 11_263_042),
    "mobilenetv2": (1280, 2_353_060, 2_237_770),
}
SHAPE = (3, 32, 32)


def build(name: str, num_classes: int = 100, shape=SHAPE, **kw) -> nn.Module:
    torch.manual_seed(0)
    return build_model(ModelConfig(name=name, **kw), shape, num_classes)


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_selectable_from_a_config_with_group_norm():
    """A user's `model.name=X model.norm=gn model.gn_groups=2` is accepted without a warning."""
    import warnings

    from distfl.config import load_config

    for name in SPECS:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            cfg = load_config(None, [f"model.name={name}", "model.norm=gn", "model.gn_groups=2"])
        assert (cfg.model.name, cfg.model.norm, cfg.model.gn_groups) == (name, "gn", 2)


@pytest.mark.parametrize("name", SPECS)
def test_shapes_split_and_param_count(name):
    dim, p100, p10 = SPECS[name]
    model = build(name, norm="gn").eval()
    assert model.feature_dim == dim and model.head.in_features == dim and model.head.out_features == 100
    assert n_params(model) == p100
    x = torch.randn(2, *SHAPE, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        feats = model.features(x)
        out = model(x)
    assert feats.shape == (2, dim) and out.shape == (2, 100)
    assert torch.equal(out, model.head(feats))
    assert n_params(build(name, 10)) == p10
    for m in model.modules():
        assert not isinstance(m, nn.modules.dropout._DropoutNd)
        assert not getattr(m, "inplace", False), f"{type(m).__name__} is in-place"


@pytest.mark.parametrize("norm", ["bn", "gn"])
@pytest.mark.parametrize("name", SPECS)
def test_norm_variants_backward(name, norm):
    model = build(name, norm=norm, gn_groups=2).train()
    kinds = {type(m) for m in model.modules()}
    assert (nn.BatchNorm2d in kinds) == (norm == "bn") and (nn.GroupNorm in kinds) == (norm == "gn")
    x, y = torch.randn(2, *SHAPE), torch.tensor([3, 97])
    model.loss(model(x), y).backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert model.features[0].weight.grad.abs().sum() > 0


@pytest.mark.parametrize("name", SPECS)
def test_sphere_head(name):
    dim = SPECS[name][0]
    model = build(name, head="sphere", norm="gn").eval()
    assert isinstance(model.head, FixedHead) and model.head.weight.shape == (100, dim)
    assert orthonormality_error(model.head.weight) < 1e-6
    with torch.no_grad():
        assert model(torch.randn(2, *SHAPE)).shape == (2, 100)


def test_vgg13_too_small_input():
    with pytest.raises(ConfigError, match=r"model.name=vgg13 needs inputs of at least 32x32 \(got 28x28\)"):
        build("vgg13", 10, (1, 28, 28))
    with pytest.raises(ConfigError, match=r"got 32x31"):
        build("vgg13", 10, (3, 32, 31))
    model = build("vgg13", 10, (3, 64, 64)).eval()  # larger inputs: the global pool keeps d = 512
    with torch.no_grad():
        assert model.features(torch.randn(2, 3, 64, 64)).shape == (2, 512)


@pytest.mark.parametrize("name", ["senet18", "mobilenetv2"])
def test_adaptive_pool_models_accept_any_size(name):
    # every strided conv is 3x3 with padding 1 and the final pool is adaptive: no input is too small
    for shape in [(1, 1, 1), (3, 7, 5)]:
        model = build(name, 10, shape).eval()
        with torch.no_grad():
            assert model.features(torch.randn(2, *shape)).shape == (2, SPECS[name][0])


def test_gn_groups_errors():
    assert build("mobilenetv2", 10, norm="gn", gn_groups=8).features.bn1.num_groups == 8
    with pytest.raises(ConfigError, match="MobileNetV2 width.*1, 2, 4, 8 \\(got 16\\)"):
        build("mobilenetv2", 10, norm="gn", gn_groups=16)
    with pytest.raises(ConfigError, match="model.gn_groups"):
        build("vgg13", 10, norm="gn", gn_groups=3)
    with pytest.raises(ConfigError, match="model.gn_groups"):
        build("senet18", 10, norm="gn", gn_groups=0)
    with pytest.raises(ConfigError, match="model.norm"):
        build("senet18", 10, norm="ln")


def test_senet_se_scales_residual_branch():
    block = build("senet18", 10).features.layer1[0].eval()
    x = torch.randn(2, 64, 8, 8)
    with torch.no_grad():
        r = block.bn2(block.conv2(block.relu(block.bn1(block.conv1(x)))))
        gate = block.se(r)
        assert gate.shape == (2, 64, 1, 1) and ((gate > 0) & (gate < 1)).all()
        torch.testing.assert_close(block(x), torch.relu(r * gate + x))
    assert block.se.fc1.out_features == 64 // 16


def test_mobilenetv2_residuals():
    stages = build("mobilenetv2", 10).features
    assert not stages.stage1[0].use_residual  # 32 -> 16
    assert [b.use_residual for b in stages.stage4] == [False, True, True, True]  # 32 -> 64 stride 2, then 64 -> 64
    with torch.no_grad():  # linear bottleneck: no activation after the projection
        assert (stages.stage1.eval()(torch.randn(2, 32, 4, 4)) < 0).any()


@pytest.mark.parametrize("name", ["senet18", "mobilenetv2"])
def test_torch_func_grad_matches_backward(name):
    model = build(name, 10, (3, 8, 8), norm="gn").eval()
    params = {k: v.detach() for k, v in model.named_parameters()}
    buffers = dict(model.named_buffers())
    x, y = torch.randn(2, 3, 8, 8), torch.tensor([1, 7])

    def loss(p):
        return nn.functional.cross_entropy(torch.func.functional_call(model, (p, buffers), (x,)), y)

    grads = torch.func.grad(loss)(params)
    nn.functional.cross_entropy(model(x), y).backward()
    for k, p in model.named_parameters():
        torch.testing.assert_close(grads[k], p.grad)

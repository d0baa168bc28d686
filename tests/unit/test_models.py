"""Tests for distfl.models: shapes, the features/head split, parameter counts, seeding, GN, errors."""
from __future__ import annotations

import hashlib

import pytest
import torch
from torch import nn

from distfl.config import load_config
from distfl.errors import ConfigError
from distfl.models import build_model
from distfl.models.heads import FixedHead
from distfl.config.schema import ModelConfig

NAMES = ["simplecnn", "tct_cnn", "lenet5", "cifar_cnn", "resnet18", "resnet20", "mlp", "pfl_cnn"]
COMBOS = [((1, 28, 28), 10), ((3, 32, 32), 10), ((3, 32, 32), 100)]


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def build(name: str, shape, num_classes: int, seed: int = 0, **kw) -> nn.Module:
    torch.manual_seed(seed)
    return build_model(ModelConfig(name=name, **kw), shape, num_classes)


@pytest.mark.parametrize("shape,num_classes", COMBOS)
@pytest.mark.parametrize("name", NAMES)
def test_shapes_and_feature_head_split(name, shape, num_classes):
    model = build(name, shape, num_classes).eval()
    assert isinstance(model.head, nn.Linear)
    assert model.head.bias is not None
    assert model.head.in_features == model.feature_dim
    assert model.head.out_features == num_classes
    x = torch.randn(3, *shape, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        feats = model.features(x)
        out = model(x)
        assert feats.shape == (3, model.feature_dim)
        assert out.shape == (3, num_classes)
        assert torch.equal(out, model.head(model.features(x)))


@pytest.mark.parametrize("name", NAMES)
def test_no_dropout_and_no_inplace(name):
    model = build(name, (3, 32, 32), 10)
    for m in model.modules():
        assert not isinstance(m, nn.modules.dropout._DropoutNd)
        assert not getattr(m, "inplace", False), f"{type(m).__name__} is in-place"


@pytest.mark.parametrize("name,shape,num_classes,expected", [
    ("simplecnn", (1, 28, 28), 10, 44_426),
    ("simplecnn", (3, 32, 32), 10, 62_006),  # flat = 400
    ("tct_cnn", (1, 28, 28), 10, 454_922),  # > p = 100,000 (TCT keeps 100,000 eNTK coordinates)
    ("tct_cnn", (1, 28, 28), 1, 453_761),  # the 1-output head of TCT's eNTK
    ("lenet5", (1, 28, 28), 10, 61_706),  # padded to the classic 32x32 geometry, flat = 400
    ("lenet5", (3, 32, 32), 10, 62_006),
    ("cifar_cnn", (3, 32, 32), 10, 1_156_202),
    ("resnet18", (3, 32, 32), 10, 11_173_962),
    ("resnet18", (3, 32, 32), 100, 11_220_132),
    # Option-A (parameter-free) shortcuts. The brief's 272,474 is the option-B (1x1 conv + BN) count.
    ("resnet20", (3, 32, 32), 10, 269_722),
    ("mlp", (1, 8, 8), 10, 8_970),
    ("pfl_cnn", (3, 32, 32), 10, 1_626_442),  # 896 + 18,496 + 12,544 * 128 + 128 + 1,290
])
def test_parameter_counts(name, shape, num_classes, expected):
    assert n_params(build(name, shape, num_classes)) == expected


def test_flat_widths():
    assert build("simplecnn", (1, 28, 28), 10).features.fc1.in_features == 256
    assert build("simplecnn", (3, 32, 32), 10).features.fc1.in_features == 400
    assert build("lenet5", (1, 28, 28), 10).features.fc1.in_features == 400
    assert build("lenet5", (1, 28, 28), 10).features.conv1.padding == (2, 2)
    assert build("lenet5", (3, 32, 32), 10).features.conv1.padding == (0, 0)


def test_feature_dims():
    dims = {"simplecnn": 84, "tct_cnn": 128, "lenet5": 84, "cifar_cnn": 64, "resnet18": 512, "resnet20": 64, "mlp": 64}
    for name, d in dims.items():
        assert build(name, (3, 32, 32), 10).feature_dim == d
    assert build("mlp", (1, 8, 8), 10, mlp_hidden=17).feature_dim == 17


@pytest.mark.parametrize("name", NAMES)
def test_same_seed_same_parameters(name):
    a = build(name, (3, 32, 32), 10, seed=3).state_dict()
    b = build(name, (3, 32, 32), 10, seed=3).state_dict()
    c = build(name, (3, 32, 32), 10, seed=4).state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a if a[k].is_floating_point())


def test_resnet18_groupnorm():
    model = build("resnet18", (3, 32, 32), 10, norm="gn", gn_groups=2)
    mods = list(model.modules())
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in mods)
    gns = [m for m in mods if isinstance(m, nn.GroupNorm)]
    assert len(gns) == 20  # stem + 2 per block x 8 blocks + 3 projection shortcuts
    assert all(m.num_groups == 2 for m in gns)
    assert n_params(model) == 11_173_962
    assert build("resnet18", (3, 32, 32), 10, norm="gn", gn_groups=32).features.bn1.num_groups == 32
    # BN variant really is BN, with the same number of norm layers
    bns = [m for m in build("resnet18", (3, 32, 32), 10).modules() if isinstance(m, nn.BatchNorm2d)]
    assert len(bns) == 20


def test_resnet18_gn_forward_batch_of_one():
    model = build("resnet18", (3, 16, 16), 10, norm="gn").train()
    assert model(torch.randn(1, 3, 16, 16)).shape == (1, 10)


def test_bad_gn_groups():
    with pytest.raises(ConfigError, match="model.gn_groups"):
        build("resnet18", (3, 32, 32), 10, norm="gn", gn_groups=3)
    with pytest.raises(ConfigError, match="model.norm"):
        build("resnet18", (3, 32, 32), 10, norm="ln")


@pytest.mark.parametrize("name", ["simplecnn", "lenet5"])
def test_too_small_input(name):
    with pytest.raises(ConfigError, match=rf"model.name={name} needs inputs of at least 16x16 \(got 8x8\)"):
        build(name, (1, 8, 8), 10)
    with pytest.raises(ConfigError, match=r"got 15x32"):
        build(name, (1, 15, 32), 10)
    assert build(name, (1, 16, 16), 10)(torch.randn(2, 1, 16, 16)).shape == (2, 10)


def test_cifar_cnn_minimum_input():
    with pytest.raises(ConfigError, match=r"model.name=cifar_cnn needs inputs of at least 4x4 \(got 3x3\)"):
        build("cifar_cnn", (1, 3, 3), 10)
    assert build("cifar_cnn", (1, 8, 8), 10)(torch.randn(2, 1, 8, 8)).shape == (2, 10)


@pytest.mark.parametrize("name", ["resnet18", "resnet20", "mlp"])
def test_small_synthetic_inputs_work(name):
    model = build(name, (1, 8, 8), 5).eval()
    with torch.no_grad():
        assert model(torch.randn(2, 1, 8, 8)).shape == (2, 5)


def test_unknown_name_and_bad_arguments():
    with pytest.raises(ConfigError, match="simplecnn, tct_cnn, lenet5, cifar_cnn, resnet18, resnet20, mlp"):
        build_model(ModelConfig(name="vgg"), (3, 32, 32), 10)
    with pytest.raises(ConfigError, match="input shape"):
        build_model(ModelConfig(name="mlp"), (32, 32), 10)
    with pytest.raises(ConfigError, match="classes"):
        build_model(ModelConfig(name="mlp"), (1, 8, 8), 0)
    with pytest.raises(ConfigError, match="model.mlp_hidden"):
        build_model(ModelConfig(name="mlp", mlp_hidden=0), (1, 8, 8), 10)


def test_resnet20_option_a_shortcut():
    model = build("resnet20", (3, 32, 32), 10)
    first = model.features.layer2[0]
    assert not any(p.numel() for p in first.shortcut.parameters())
    x = torch.randn(2, 16, 8, 8)
    y = first.shortcut(x)
    assert y.shape == (2, 32, 4, 4)
    assert torch.equal(y[:, 8:24], x[:, :, ::2, ::2])
    assert not y[:, :8].any() and not y[:, 24:].any()


@pytest.mark.parametrize("name", ["simplecnn", "resnet20"])
def test_torch_func_grad(name):
    model = build(name, (3, 32, 32), 10).eval()
    params = {k: v.detach() for k, v in model.named_parameters()}
    buffers = {k: v for k, v in model.named_buffers()}
    x, y = torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,))

    def loss(p):
        out = torch.func.functional_call(model, (p, buffers), (x,))
        return nn.functional.cross_entropy(out, y)

    grads = torch.func.grad(loss)(params)
    model.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    for k, p in model.named_parameters():
        torch.testing.assert_close(grads[k], p.grad)


# Modules whose CUDA backward has no deterministic kernel (torch.use_deterministic_algorithms' list):
# under runtime.deterministic=true a model holding one stops on CUDA, so built-in models avoid them.
NONDETERMINISTIC_ON_CUDA = (nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d, nn.FractionalMaxPool2d, nn.MaxPool3d,
                            nn.ReflectionPad2d, nn.ReplicationPad2d, nn.Upsample, nn.EmbeddingBag, nn.CTCLoss)


@pytest.mark.parametrize("name", NAMES + ["vgg13", "senet18", "mobilenetv2"])
def test_builtin_models_run_under_strict_cuda_determinism(name):
    model = build(name, (3, 32, 32), 10)
    bad = [n for n, m in model.named_modules() if isinstance(m, NONDETERMINISTIC_ON_CUDA)]
    assert not bad, f"{name}: {bad} have no deterministic CUDA backward"


def test_global_avg_pool_equals_adaptive_avg_pool():
    from distfl.models.base import GlobalAvgPool

    x = torch.randn(4, 8, 5, 7, dtype=torch.float64)
    expected = nn.Flatten()(nn.AdaptiveAvgPool2d(1)(x))
    assert torch.allclose(GlobalAvgPool()(x), expected, rtol=0, atol=1e-15)


# --- model.feature_dim (simplecnn) ------------------------------------------------------------------

def state_hash(model: nn.Module) -> str:
    digest = hashlib.sha256()
    for key, tensor in model.state_dict().items():
        digest.update(key.encode())
        digest.update(tensor.detach().contiguous().numpy().tobytes())
    return digest.hexdigest()


# sha256 of the initial state_dict of simplecnn (1x28x28, 10 classes, torch.manual_seed(0)), taken from
# the code before model.feature_dim existed (main at 437d20e, torch 2.15): the default must not move.
MAIN_HASHES = {"linear": "5872a3d6b69133c310419ee520cf131898c98a55ef76b9fedb63b9b368917790",
               "sphere": "d13e8eb340b3f727c24ad13a3f166b5aa69660a72d1907492eabcb3e78458d61"}


@pytest.mark.parametrize("head", ["linear", "sphere"])
def test_simplecnn_default_width_is_unchanged(head):
    default = build("simplecnn", (1, 28, 28), 10, head=head)
    assert default.feature_dim == 84
    assert n_params(default) == (44_426 if head == "linear" else 44_426 - 850)  # the sphere head is a buffer
    assert state_hash(default) == MAIN_HASHES[head]
    assert state_hash(build("simplecnn", (1, 28, 28), 10, head=head, feature_dim=84)) == MAIN_HASHES[head]


def test_simplecnn_feature_dim_sets_the_feature_layer_and_head():
    cfg = load_config(None, ["model.feature_dim=256", "model.head=sphere"])
    torch.manual_seed(0)
    model = build_model(cfg.model, (1, 28, 28), 10).eval()
    assert model.feature_dim == 256
    assert (model.features.fc1.in_features, model.features.fc1.out_features) == (256, 256)
    assert (model.features.fc2.in_features, model.features.fc2.out_features) == (256, 256)
    assert isinstance(model.head, FixedHead) and model.head.weight.shape == (10, 256)
    w = model.head.weight.double()
    assert torch.allclose(w @ w.T, torch.eye(10, dtype=torch.float64), atol=1e-6)
    x = torch.randn(5, 1, 28, 28, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert model.features(x).shape == (5, 256)
        z = model.represent(x)
        assert torch.allclose(z.norm(dim=1), torch.ones(5), atol=1e-6)
        assert torch.allclose(model(x), z @ model.head.weight.T, atol=1e-6)
    # conv 156 + 2,416; fc1 256 * 256 + 256; fc2 the same; the sphere head holds no parameters
    assert n_params(model) == 156 + 2_416 + 2 * 65_792

    narrow = build("simplecnn", (1, 28, 28), 10, feature_dim=100)  # the FC before it keeps 120 units
    assert (narrow.features.fc1.out_features, narrow.features.fc2.out_features) == (120, 100)
    assert (narrow.head.out_features, narrow.head.in_features) == (10, 100)


def test_feature_dim_refused_for_models_with_a_fixed_width():
    with pytest.raises(ConfigError, match=r"model\.feature_dim=256 .*model\.name=lenet5"):
        load_config(None, ["model.name=lenet5", "model.feature_dim=256"])
    with pytest.raises(ConfigError, match=r"model\.feature_dim=256 .*model\.name=resnet20"):
        build("resnet20", (3, 32, 32), 10, feature_dim=256)
    with pytest.raises(ConfigError, match=r"model\.feature_dim"):
        load_config(None, ["model.feature_dim=-1"])
    assert load_config(None, ["model.name=lenet5", "model.feature_dim=0"]).model.feature_dim == 0

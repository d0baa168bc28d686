"""The model zoo: `build_model(cfg.model, input_shape, num_classes)`.

Every model is a `Classifier` (see `base.py`): `model.features` maps B x C x H x W to B x
`model.feature_dim` (the penultimate activations), `model.head` is `nn.Linear(feature_dim,
num_classes)`, and `forward(x) == head(features(x))`. Construction draws only from the global torch
RNG, so `torch.manual_seed(seed)` before `build_model` makes the initial parameters reproducible.
No model contains dropout or in-place activations.

| name        | source                                            | params, 10 classes (default input) | params, 100 classes  |
|-------------|---------------------------------------------------|------------------------------------|----------------------|
| simplecnn   | NIID-Bench SimpleCNNMNIST (TCT, FMNIST)           | 44,426 (1x28x28)                   |                      |
| (d = 256)   | simplecnn with model.feature_dim=256 (SphereFed)  | 136,726 (1x28x28)                  |                      |
| tct_cnn     | TCT paper's FMNIST net: 2 conv+pool, 2 FC         | 454,922 (1x28x28)                  |                      |
| lenet5      | classic LeNet-5, ReLU + max-pool (GMA)            | 61,706 (1x28x28)                   |                      |
| cifar_cnn   | FedADC 4 conv + 4 FC, widths our choice           | 1,156,202 (3x32x32)                |                      |
| resnet18    | CIFAR-stem ResNet-18, BN or GN (TCT, FedADC)      | 11,173,962 (3x32x32)               | 11,220,132 (3x32x32) |
| resnet20    | He et al. CIFAR ResNet-20, option A (FedFOR)      | 269,722 (3x32x32)                  |                      |
| mlp         | 2 hidden layers of model.mlp_hidden (tests)       | 8,970 (1x8x8, h = 64)              |                      |
| vgg13       | kuangliu VGG13, 5 max-pools, BN or GN (SphereFed) | 9,416,010 (3x32x32)                | 9,462,180 (3x32x32)  |
| senet18     | ResNet-18 + SE (ratio 16), BN or GN (SphereFed)   | 11,263,042 (3x32x32)               | 11,309,212 (3x32x32) |
| mobilenetv2 | CIFAR MobileNetV2, d = 1280, BN or GN (SphereFed) | 2,237,770 (3x32x32)                | 2,353,060 (3x32x32)  |
| pfl_cnn     | pfl-research's CIFAR-10 simple CNN (bench)        | 1,626,442 (3x32x32)                |                      |
| mclr        | FedProx's multinomial logistic regression         | 610 (1x1x60)                       |                      |
| femnist_cnn | LEAF's FEMNIST CNN, 62 classes                    | 6,603,710 (1x28x28)                |                      |
| char_lstm   | LEAF's Shakespeare LSTM, 80 characters            | 817,872 (80 character indices)     |                      |
| sent140_lstm | LEAF's Sent140 LSTM, 2 classes (model.embedding) | 253,986 + the table (GloVe 300-d)  |                      |
| reddit_lstm | LEAF's Reddit LSTM, a word a position             | 6,180,624 (10,000 words)           |                      |
| shakespeare_lstm | TFF's Shakespeare LSTM, a character a position | 820,522 (90 tokens: TFF's Shakespeare) |                 |
| stackoverflow_lstm | Reddi et al.'s StackOverflow next-word LSTM   | 4,050,748 (10,004 tokens)          |                      |
| token_transformer | small causal transformer (2 blocks of 128)    | 2,970,388 (10,004 tokens, L = 20)  |                      |

`model.name: package.module:build` (or a name registered in the entry-point group `distfl.models`) calls
the user's `build(input_shape, num_classes)`; see `as_classifier` for what it may return. A model that
embeds with data's word vectors (EMBEDDING_MODELS) gets them as `embeddings` (Dataset.embeddings).
"""
from __future__ import annotations

from typing import Callable

from torch import nn

from distfl.config.validate import check_feature_dim
from distfl.errors import ConfigError
from distfl.models.base import Classifier
from distfl.models.cifar_cnn import build_cifar_cnn
from distfl.models.char_lstm import build_char_lstm
from distfl.models.femnist_cnn import build_femnist_cnn
from distfl.models.lenet import build_lenet5
from distfl.models.mclr import build_mclr
from distfl.models.mlp import build_mlp
from distfl.models.mobilenetv2 import build_mobilenetv2
from distfl.models.pfl_cnn import build_pfl_cnn
from distfl.models.reddit_lstm import build_reddit_lstm
from distfl.models.resnet import build_resnet18
from distfl.models.resnet_cifar import build_resnet20
from distfl.models.senet import build_senet18
from distfl.models.sent140_lstm import build_sent140_lstm
from distfl.models.simplecnn import build_simplecnn
from distfl.models.tct_cnn import build_tct_cnn
from distfl.models.token_lstm import build_shakespeare_lstm, build_stackoverflow_lstm
from distfl.models.token_transformer import build_token_transformer
from distfl.models.vgg import build_vgg13
from distfl.config.schema import ModelConfig

__all__ = ["Classifier", "MODELS", "TOKEN_MODELS", "build_model"]

# name -> builder(cfg, input_shape, num_classes)
MODELS: dict[str, Callable[[ModelConfig, tuple[int, int, int], int], Classifier]] = {
    "simplecnn": lambda cfg, shape, k: build_simplecnn(shape, k, cfg.feature_dim),
    "tct_cnn": lambda cfg, shape, k: build_tct_cnn(shape, k),
    "lenet5": lambda cfg, shape, k: build_lenet5(shape, k),
    "cifar_cnn": lambda cfg, shape, k: build_cifar_cnn(shape, k),
    "resnet18": lambda cfg, shape, k: build_resnet18(shape, k, cfg.norm, cfg.gn_groups),
    "resnet20": lambda cfg, shape, k: build_resnet20(shape, k),
    "mlp": lambda cfg, shape, k: build_mlp(shape, k, cfg.mlp_hidden),
    "vgg13": lambda cfg, shape, k: build_vgg13(shape, k, cfg.norm, cfg.gn_groups),
    "senet18": lambda cfg, shape, k: build_senet18(shape, k, cfg.norm, cfg.gn_groups),
    "mobilenetv2": lambda cfg, shape, k: build_mobilenetv2(shape, k, cfg.norm, cfg.gn_groups),
    "pfl_cnn": lambda cfg, shape, k: build_pfl_cnn(shape, k),
    "mclr": lambda cfg, shape, k: build_mclr(shape, k),
    "femnist_cnn": lambda cfg, shape, k: build_femnist_cnn(shape, k),
    "char_lstm": lambda cfg, shape, k: build_char_lstm(shape, k),
    "sent140_lstm": lambda cfg, shape, k, table=None: build_sent140_lstm(shape, k, table, cfg.embedding),
    "shakespeare_lstm": lambda cfg, shape, k: build_shakespeare_lstm(shape, k),
    "stackoverflow_lstm": lambda cfg, shape, k: build_stackoverflow_lstm(shape, k),
    "reddit_lstm": lambda cfg, shape, k: build_reddit_lstm(shape, k),
    "token_transformer": lambda cfg, shape, k: build_token_transformer(shape, k),
}

# Next-token models (TokenClassifier: a prediction at every position; data/tokens.py).
TOKEN_MODELS = ("shakespeare_lstm", "stackoverflow_lstm", "reddit_lstm", "token_transformer")
# Models whose inputs are token sequences (int64, B x L) rather than images C x H x W.
SEQUENCE_MODELS = ("char_lstm", "sent140_lstm") + TOKEN_MODELS
# Models that embed the token ids with the data's word vectors (Dataset.embeddings), passed to their builder.
EMBEDDING_MODELS = ("sent140_lstm",)


# Models whose local training step is faster on the CPU with channels_last batches (runtime.channels_last:
# auto), measured at 1 thread (docs/performance.md): pfl_cnn 0.93x the NCHW step's time, cifar_cnn 0.88x,
# resnet20 0.84x, mobilenetv2 0.71x. Not here: the 1-channel models (simplecnn, lenet5, tct_cnn: 1.00x),
# resnet18 (1.04x), senet18 (1.03x), vgg13 (1.12x) and mlp.
CHANNELS_LAST_ON_CPU = ("pfl_cnn", "cifar_cnn", "resnet20", "mobilenetv2")


def uses_channels_last(setting: str, model_name: str, device) -> bool:
    """runtime.channels_last: on, off, or auto: on CPU, for the zoo's models that train faster with it
    (CHANNELS_LAST_ON_CPU; a plugin model may `.view` its activations, which channels_last refuses)."""
    if setting != "auto":
        return setting == "on"
    return device.type == "cpu" and model_name in CHANNELS_LAST_ON_CPU


def build_model(cfg: ModelConfig, input_shape: tuple[int, int, int], num_classes: int,
                embeddings=None) -> nn.Module:
    """Build the model `cfg.name` for inputs of shape (C, H, W) and `num_classes` outputs (`embeddings`: the
    data's word vectors, V x D, for EMBEDDING_MODELS).

    Raises ConfigError for an unknown name, a bad shape or class count, or an input too small for
    the model's conv stack, or a model.feature_dim the model does not support.
    """
    check_feature_dim(cfg.name, cfg.feature_dim)
    if cfg.name not in MODELS:
        from distfl.plugins import load_plugin

        try:
            builder = load_plugin("model.name", cfg.name)
        except KeyError:
            raise ConfigError(f"model.name must be one of {', '.join(MODELS)} or an import path "
                              f"package.module:build (got {cfg.name!r})") from None
    else:
        builder = None
    try:
        shape = tuple(int(s) for s in input_shape)
    except (TypeError, ValueError):
        raise ConfigError(f"input shape must be (channels, height, width) (got {input_shape!r})") from None
    if cfg.name in SEQUENCE_MODELS:
        if len(shape) != 1 or shape[0] < 1:
            raise ConfigError(f"model.name={cfg.name} reads token sequences (length L), but the data's inputs have "
                              f"shape {input_shape!r}: use it with token data (data.dataset=leaf: Shakespeare, Sent140, Reddit)")
    elif len(shape) != 3 or min(shape) < 1:
        raise ConfigError(f"input shape must be (channels, height, width) with positive sizes (got {input_shape!r})")
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise ConfigError(f"the number of classes must be a positive integer (got {num_classes!r})")
    if cfg.name in TOKEN_MODELS and (cfg.head != "linear" or cfg.projection_dim > 0 or cfg.feature_norm == "on"
                                     or cfg.loss == "mse"):
        raise ConfigError(f"model.name={cfg.name} predicts a token at every position with cross-entropy: it takes "
                          "model.head=linear, model.projection_dim=0, model.feature_norm=auto|off, model.loss=auto|ce")
    if builder is None:
        extra = (embeddings,) if cfg.name in EMBEDDING_MODELS else ()
        model = MODELS[cfg.name](cfg, shape, num_classes, *extra)  # type: ignore[arg-type]
    else:
        model = as_classifier(builder(shape, num_classes), cfg.name, num_classes)
    model.set_projection(cfg.projection_dim)
    model.set_head(cfg.head, cfg.head_seed, cfg.loss, cfg.feature_norm, cfg.mse_reduction)
    from distfl.models.adapters import adapt

    return adapt(model, cfg)


def as_classifier(module: nn.Module, name: str, num_classes: int) -> Classifier:
    """A plugin model as a `Classifier`, so that `model.head` (sphere, fixed_random) and FedBN apply.

    A `Classifier` is used as it is; an `nn.Sequential` ending in `nn.Linear` becomes `features` (all
    but the last layer) and `head` (that layer, with its initial weights).
    """
    if isinstance(module, Classifier):
        return module
    if isinstance(module, nn.Sequential) and len(module) > 1 and isinstance(module[-1], nn.Linear):
        head = module[-1]
        if head.out_features != num_classes or head.bias is None:
            raise ConfigError(f"model.name={name}: the last layer must be nn.Linear(d, {num_classes}) with a bias, "
                              f"got {head}")
        model = Classifier(module[:-1], head.in_features, num_classes)
        model.head = head
        return model
    raise ConfigError(f"model.name={name} returned {type(module).__name__}; return a distfl.Classifier("
                      "features, feature_dim, num_classes) or an nn.Sequential whose last layer is the "
                      "nn.Linear classifier (docs/extending.md)")

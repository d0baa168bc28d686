"""The config schema: every key a run accepts, declared once, with everything distfl knows about it.

These names are distfl's public interface (YAML files, `key=value` overrides, sweeps). A key is a field
of a section dataclass; its trailing comment is its documentation (docs/config.md is generated from
it), and `key(default, ...)` declares its rules, read by validation, resume and the docs alike:

- `choices=[...]`: the valid values of a string key, or of each name of a list key (listed at most once;
  `plugin=True`: or a plugin's import path / entry point); `methods="flag"`: the choices are the built-in
  methods whose class declares `flag = True` (distfl/algorithms/), so the method's file alone says it;
- `range=">= 0"` (or "> x", "[0, 1)", "[0, 1]", "(0, 1]", "(0, 1)"): the valid values of a number;
- `limit=N`: the largest int a run can compute with, when tighter than 2^31 - 1; `seed_max=N`: the
  largest seed its consumer accepts (numpy's RandomState 32 bits, torch's generators 64);
- `applies=(controller, [choices])`: the key is only read when `controller` is one of the choices (a
  non-default value otherwise is a warning, since sweeps vary the controller);
- `resumable=True`: the key may change when a run resumes (it does not alter the finished model);
  `resumable="phase"`: it may, until the phase after training it belongs to has started;
- `previous=value`: the default changed after the key was added; a saved run without the key ran with this.

A method's own keys are not here: they are its `Options` (algorithm.options, distfl/algorithms/).
"""
from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field


def key(default, *, choices=None, methods=None, plugin=False, range=None, limit=None, seed_max=None, applies=None,
        resumable=False, previous=None):
    """A config key's default and its rules (see the module's docstring), as dataclass field metadata."""
    rules = {"choices": choices, "methods": methods, "plugin": plugin, "range": range, "limit": limit,
             "seed_max": seed_max, "applies": applies, "resumable": resumable, "previous": previous}
    metadata = {k: v for k, v in rules.items() if v is not None and not (k in ("plugin", "resumable") and v is False)}
    if isinstance(default, list):  # a list of names: each instance its own copy
        return field(default_factory=lambda: list(default), metadata=metadata)
    return field(default=default, metadata=metadata)


TRACKERS = ["tensorboard", "mlflow", "wandb"]  # output.trackers: the names it may list


@dataclass
class DataConfig:
    dataset: str = key("fmnist", choices=["fmnist", "cifar10", "cifar100", "synthetic", "files", "fedprox_synthetic", "leaf", "tff", "prepared"])  # fmnist | cifar10 | cifar100 | synthetic | files (your own data at data.path) | fedprox_synthetic (FedProx's Synthetic(alpha, beta) / Synthetic-IID federation: 30 devices, 60 features, 10 classes, generated from the data seed; partition.scheme=natural, docs/datasets.md) | leaf (LEAF's JSON files at data.path: FEMNIST, Shakespeare, vectors; docs/datasets.md) | tff (TFF's HDF5 files at data.path: fed_emnist, fed_emnist_digitsonly, fed_cifar100) | prepared (the memory-mapped folder `distfl data prepare` wrote, at data.path)
    root: str = "./data"  # where to look for (and download) the dataset files
    path: str = key("", applies=("data.dataset", ["files", "leaf", "tff", "prepared"]))  # leaf: a LEAF dataset's data/ folder (train/ and test/, or all_data/). tff: the folder with PREFIX_train.h5 and PREFIX_test.h5. prepared: the folder `distfl data prepare` wrote. files: an .npz with x_train, y_train, x_test, y_test (images N x C x H x W, or vectors N x D), or a folder with train/ and test/ ImageFolder trees (docs/extending.md)
    download: bool = True  # allow a torchvision download when no local copy is found
    augment: str = key("auto", choices=["auto", "none", "crop_flip"])  # auto (crop+flip for CIFAR, none otherwise) | none | crop_flip
    normalize: str = key("auto", choices=["auto", "none", "mean_std"])  # input scaling after pixels / 255: auto (CIFAR: (x - mean) / std with the fixed per-channel stats in distfl/data/datasets.py CIFAR_STATS; fmnist, synthetic, files: none) | none (the [0, 1] pixels; files and synthetic: as read or generated) | mean_std ((x - mean) / std per channel, both splits, with the mean and population std of the training split computed in float64; FMNIST: 0.2860 / 0.3530)
    synthetic_train: int = key(2000, range=">= 1", limit=10**8)  # synthetic: training samples
    synthetic_test: int = key(500, range=">= 1", limit=10**8)  # synthetic: test samples
    synthetic_classes: int = key(10, range=">= 2", limit=10**6)  # synthetic: number of classes
    synthetic_image_size: int = key(8, range=">= 1", limit=4096)  # synthetic: images are channels x size x size
    synthetic_channels: int = key(1, range=">= 1", limit=1024)  # synthetic: image channels
    synthetic_alpha: float = key(0.0, range=">= 0", applies=("data.dataset", ["fedprox_synthetic"]))  # fedprox_synthetic: alpha, the spread of the devices' models (u_k ~ N(0, alpha); paper: 0, 0.5, 1)
    synthetic_beta: float = key(0.0, range=">= 0", applies=("data.dataset", ["fedprox_synthetic"]))  # fedprox_synthetic: beta, the spread of the devices' feature means (B_k ~ N(0, beta); paper: 0, 0.5, 1)
    leaf_split: str = key("sample", choices=["sample", "user"], applies=("data.dataset", ["leaf"]))  # leaf, when data.path holds only all_data/: split it as LEAF's split_data.py does, 90% to training, keyed by the data seed: sample (each user's samples) | user (whole users; the test users form the test split only)
    synthetic_iid: bool = key(False, applies=("data.dataset", ["fedprox_synthetic"]))  # fedprox_synthetic: Synthetic-IID instead (one model and zero-mean features for all devices; alpha and beta unused)
    embeddings: str = key("", applies=("data.dataset", ["leaf"]))  # leaf, Sent140: LEAF's embs.json (models/sent140/get_embs.py: {"vocab": words, "emba": one vector a word + the zero vector of the unknown id}, from GloVe); its vocabulary gives the token ids, its vectors model.name=sent140_lstm's embedding; hashed and checked on resume. Other LEAF datasets ignore it
    vocabulary: str = key("", applies=("data.dataset", ["leaf"]))  # leaf, Reddit: LEAF's reddit_vocab.pck (data/reddit/build_vocab.py; read with an unpickler that builds plain data only) or its JSON conversion (python -m distfl.data.leaf_text convert); hashed and checked on resume. Other LEAF datasets ignore it
    sequence_length: int = key(0, range=">= 0", limit=10**6, applies=("data.dataset", ["tff", "prepared"]))  # TFF's Shakespeare and StackOverflow: L, the input tokens of a sample (its targets: the L that follow); 0 = TFF's default, 80 characters (Shakespeare), 20 words (StackOverflow). prepared: 0 = the folder's; another value than the one it was prepared with (`distfl data prepare --sequence-length`) is refused
    oov_buckets: int = key(0, range=">= 0", limit=10**6, applies=("data.dataset", ["tff", "prepared"]))  # TFF's StackOverflow: out-of-vocabulary buckets B, a word outside the vocabulary -> token 10,001 + Fingerprint64(word) mod B, beginning 10,001 + B, end 10,002 + B (TFF's StaticVocabularyTable); 0 = 1, TFF's default (Reddi et al.). prepared: 0 = the folder's; another value than the one it was prepared with (`distfl data prepare --oov-buckets`) is refused


@dataclass
class PartitionConfig:
    scheme: str = key("dirichlet", choices=["iid", "dirichlet", "n_classes", "shards", "quantity", "longtail", "file", "natural"])  # iid | dirichlet | n_classes | shards | quantity | longtail | file (the split in partition.path) | natural (the clients the dataset comes with, each with its own training samples; data.dataset=fedprox_synthetic, leaf, tff or prepared; num_clients must equal their count)
    num_clients: int = key(100, range=">= 1", limit=10**7)  # total clients in the population
    path: str = key("", applies=("partition.scheme", ["file"]))  # file: an .npz with one int64 array of training-set indices per client, client_0 .. client_{num_clients-1} (what `distfl partition --out` writes)
    alpha: float = key(0.5, range="> 0", applies=("partition.scheme", ["dirichlet", "quantity"]))  # Dirichlet concentration: label proportions (dirichlet) or client sizes (quantity)
    classes_per_client: int = key(2, range=">= 1", limit=10**6, applies=("partition.scheme", ["n_classes"]))  # n_classes: distinct labels per client (NIID-Bench #C; its draws, so its client sets)
    shards_per_client: int = key(2, range=">= 1", limit=10**6, applies=("partition.scheme", ["shards"]))  # shards: label-sorted shards per client (McMahan et al.)
    min_size: int = key(10, range=">= 0")  # dirichlet, quantity: resample until every client has this many samples
    max_attempts: int = key(0, range=">= 0")  # dirichlet, quantity: redraws before giving up with an error; 0 = the scheme's default (dirichlet 1000, quantity 2000000: NIID-Bench's 100 clients at alpha 0.5 need ~70,000)
    imbalance_ratio: float = key(0.01, range="(0, 1]", applies=("partition.scheme", ["longtail"]))  # longtail: smallest / largest class count of a client (Cao et al. 2019)
    subsample: float = key(0.1, range="(0, 1]", applies=("partition.scheme", ["longtail"]))  # longtail: each client first draws this fraction of the training set
    seed: int = key(-1, range=">= -1", seed_max=2**32 - 1)  # seed of the data: the client split, what is drawn from it (eval.client_split holdout, the clients' test sets) and a synthetic dataset; -1: the run's `seed`. Set it to train several seeds (model init, batches, cohorts) on one split


@dataclass
class ModelConfig:
    name: str = key("simplecnn", choices=["simplecnn", "tct_cnn", "lenet5", "cifar_cnn", "resnet18", "resnet20", "mlp", "vgg13", "senet18", "mobilenetv2", "pfl_cnn", "mclr", "femnist_cnn", "char_lstm", "sent140_lstm", "shakespeare_lstm", "stackoverflow_lstm", "reddit_lstm", "token_transformer"], plugin=True)  # simplecnn | tct_cnn (TCT's FMNIST net: 2 conv + max-pool, 2 FC, 454,922 params) | lenet5 | cifar_cnn | resnet18 | resnet20 | mlp | vgg13 | senet18 | mobilenetv2 | pfl_cnn (pfl-research's CIFAR-10 CNN, the cross-device bench) | mclr (multinomial logistic regression, FedProx's synthetic model) | femnist_cnn (LEAF's FEMNIST CNN) | char_lstm (LEAF's Shakespeare LSTM: 8-d embedding, 2 LSTM layers of 256) | sent140_lstm (LEAF's Sent140 LSTM: the word vectors of data.embeddings, 2 LSTM layers of 100, Dense 128, 2 classes) | shakespeare_lstm (TFF's Shakespeare LSTM, 8-d embedding, 2 x 256, a character at every position) | stackoverflow_lstm (Reddi et al.'s next-word LSTM: 96-d embedding, 670 units, projection 96) | reddit_lstm (LEAF's Reddit LSTM: 256-d embedding, 2 LSTM layers of 256, a word at every position) | token_transformer (a small causal transformer for next-token data: 2 blocks of width 128, 4 heads), or your own: package.module:build, a function (input_shape, num_classes) -> nn.Module (docs/extending.md)
    norm: str = key("bn", choices=["bn", "gn"], applies=("model.name", ["resnet18", "vgg13", "senet18", "mobilenetv2"]))  # resnet18, vgg13, senet18, mobilenetv2: bn | gn
    gn_groups: int = key(2, range=">= 1", limit=64, applies=("model.name", ["resnet18", "vgg13", "senet18", "mobilenetv2"]))  # resnet18, vgg13, senet18, mobilenetv2 with norm=gn: groups per GroupNorm layer (a divisor of 64; of 8 for mobilenetv2)
    mlp_hidden: int = key(64, range=">= 1", limit=8192, applies=("model.name", ["mlp"]))  # mlp: hidden width (two hidden layers)
    feature_dim: int = key(0, range=">= 0", limit=8192)  # simplecnn: width d of the feature layer (the head's input: C x d for head=sphere); 0 = the model's own (84). When set, the last hidden FC has d units and the FC before it max(120, d). Other models refuse a non-zero value
    projection_dim: int = key(0, range=">= 0")  # a projection head after the features (MOON's: Linear(d, d), ReLU, Linear(d, projection_dim)), read by the head (and by head=sphere's normalisation); 0 = none. algorithm.name=moon needs it (paper: 256); give the methods you compare with the same value
    head: str = key("linear", choices=["linear", "sphere", "fixed_random"])  # linear (learnable, with bias) | sphere (SphereFed: fixed C x d head with orthonormal rows by QR, normalised features, MSE) | fixed_random (fixed He-initialised head, FedBABU-like)
    head_seed: int = key(0, range=">= 0", seed_max=2**64 - 1, applies=("model.head", ["sphere", "fixed_random"]))  # sphere, fixed_random: seed of the fixed head matrix (its own generator, independent of `seed`); identical on every rank
    loss: str = key("auto", choices=["auto", "ce", "mse"])  # auto (mse for head=sphere, else ce) | ce (cross-entropy) | mse (squared error to one-hot targets)
    feature_norm: str = key("auto", choices=["auto", "on", "off"])  # auto (on for head=sphere) | on | off: L2-normalise the features before the head
    mse_reduction: str = key("mean", choices=["mean", "sum"])  # loss=mse: mean over classes (torch.nn.MSELoss) | sum over classes (||Wz - y||^2)
    embedding: str = key("frozen", choices=["frozen", "trained", "learned"], applies=("model.name", ["sent140_lstm"]))  # sent140_lstm: frozen (the vectors of data.embeddings, never trained, kept out of aggregation and checkpoints: FedProx's Sent140 model) | trained (those vectors as the start, trained and aggregated) | learned (LEAF's stacked_lstm.py as it runs: a (words + 1) x 100 table drawn at random and trained; the file gives only the vocabulary)
    init_from: str = ""  # start from saved weights instead of the seeded initialisation: a finished distfl run directory (its final model), a PyTorch state dict file (read with torch.load(weights_only=True)) or a .safetensors file; names and shapes must match the model (buffers the file lacks keep their seeded values); its SHA-256 is in summary.json's data_files and checked on resume (docs/foundation.md)
    freeze: list = key([])  # parameters to freeze (never trained, summed, sent or stored per client: linear probing, partial fine-tuning), as fnmatch patterns on their names (`features.*`, `*.bias`; names as in model.named_parameters()); a pattern that matches no parameter is refused (docs/foundation.md)
    lora_rank: int = key(0, range=">= 0", limit=65536)  # LoRA: rank r of the adapters (also written model.lora.rank); 0 = off. On: every parameter of the model is frozen and each targeted Linear / Conv2d trains B A (r x d_in and d_out x r, B = 0 at the start), injected by PEFT (docs/foundation.md)
    lora_alpha: float = key(8.0, range="> 0")  # LoRA (also model.lora.alpha): the update is (alpha / r) B A (PEFT's scaling)
    lora_dropout: float = key(0.0, range="[0, 1)")  # LoRA (also model.lora.dropout): dropout on the adapters' input; only 0 (a dropout draw would not be keyed by the client and round)
    lora_targets: list = key([])  # LoRA (also model.lora.targets): fnmatch patterns on module names (model.named_modules(): `features.*`, `head`) of the Linear and Conv2d layers that get adapters; [] = every Linear and Conv2d. A pattern that matches none of them is refused
    lora_aggregate: str = key("fedit", choices=["fedit", "ffa", "stack"])  # LoRA (also model.lora.aggregate): fedit (A and B trained and averaged separately, FedIT, Zhang et al. 2024) | ffa (A drawn once from the seed and frozen, shared by every client and never sent; only B trained, so the average of the B_i is exactly the average of the products B_i A: FFA-LoRA, Sun et al., ICLR 2024 | stack (A and B trained from B = 0 each round; the exact weighted sum of the products B_i A_i, as stacking the factors gives it, merged into the base each round and the adapters drawn afresh: FLoRA, Wang et al., NeurIPS 2024)


@dataclass
class AlgorithmConfig:
    name: str = "fedavg"  # a built-in method (docs/algorithms/NAME.md; tct: stage 1 by tct.stage1, then TCT's stages; personalised methods are scored by eval.clients), or your own: package.module:ClassName (a distfl.Algorithm) or a name registered in the entry-point group distfl.algorithms (docs/extending.md)
    options: dict = field(default_factory=dict)  # the method's own options, declared by its Options dataclass (algorithm.options.KEY=VALUE overrides, sweepable; the table below lists the built-in methods')
    weighting: str = key("samples", choices=["samples", "uniform", "tokens"])  # how client updates are averaged: samples (n_k / n) | uniform (1 / |cohort|) | tokens (t_k / t, a client's non-padding target tokens: next-token data only, TFF's StackOverflow baseline)
    features: list = key([])  # more features around the method, besides the built-in ones their own keys turn on (aggregation.fedbn, aggregation.mask, compression.up, privacy.mechanism): your own, as import paths package.module:ClassName (a distfl.Feature subclass) or names registered in the entry-point group distfl.features; each wraps the method in its declared order (docs/extending.md, Write a feature)
    feature_options: dict = field(default_factory=dict)  # the options of your own features (algorithm.features), each declared by its feature's Options dataclass, under its feature_name: algorithm.feature_options.NAME.KEY=VALUE overrides (docs/extending.md, Write a feature); a feature that is not on takes none


@dataclass
class AggregationConfig:
    mask: str = key("none", choices=["none", "gma"])  # none | gma (gradient masked averaging, Tenison et al.)
    tau: float = key(0.4, range="[0, 1]", applies=("aggregation.mask", ["gma"]))  # gma: sign-agreement threshold in [0, 1]; coordinates below it are scaled by their agreement
    mask_applies_to: str = key("step", choices=["step", "update"], applies=("aggregation.mask", ["gma"]))  # gma: step (mask the server optimizer's final step) | update (mask the averaged update before it)
    fedbn: bool = False  # FedBN: BatchNorm parameters and statistics stay with each client (needs a BatchNorm model)
    aggregator: str = key("exact", choices=["exact"], plugin=True)  # how every sum of a round is made: exact (each term rounded to a 64-bit fixed-point integer and summed as integers: the same sum on any number of ranks, federation/aggregate.py) | your own: package.module:ClassName (a subclass of distfl.federation.aggregate.Aggregator, e.g. integer sums modulo 2^b for secure aggregation; docs/extending.md, An aggregator)


@dataclass
class CalibrationConfig:
    method: str = key("none", choices=["none", "ffc", "ccvr"], resumable="phase")  # none | ffc (SphereFed's fast federated calibration: least-squares head after training) | ccvr (CCVR, Luo et al. 2021: a Gaussian per class fitted from the clients' feature means and covariances, and the linear head retrained on features sampled from it; docs/algorithms/ccvr.md)
    ridge: float = key(0.0, range=">= 0", applies=("calibration.method", ["ffc"]), resumable="phase")  # ffc: the paper's lambda in W^T = (sum Z^T Z + lambda I)^-1 sum Z^T Y (paper: 0)
    clients: str = key("all", choices=["all", "last_cohort"], applies=("calibration.method", ["ffc", "ccvr"]), resumable="phase")  # ffc, ccvr: all (every client of the population, the papers' "each client") | last_cohort (only the last round's cohort)
    batch_size: int = key(1000, range=">= 1", applies=("calibration.method", ["ffc", "ccvr"]), resumable="phase")  # ffc, ccvr: feature-extraction batch size (memory; changes the result only by float32 round-off, ~1e-8 relative)
    virtual_samples: int = key(100, range=">= 1", limit=10**7, applies=("calibration.method", ["ccvr"]), resumable="phase")  # ccvr: M, the virtual features drawn per class (the paper's M_c; with virtual_allocation=proportional, the mean per class)
    virtual_allocation: str = key("equal", choices=["equal", "proportional"], applies=("calibration.method", ["ccvr"]), resumable="phase")  # ccvr: equal (M_c = M for every class seen in training) | proportional (M_c = round(C M N_c / N): the training set's class frequencies, the paper's alternative)
    retrain_epochs: int = key(10, range=">= 1", limit=10**5, applies=("calibration.method", ["ccvr"]), resumable="phase")  # ccvr: passes of SGD over the virtual features when the head is retrained (cross-entropy, from the trained head)
    retrain_lr: float = key(0.01, range="> 0", applies=("calibration.method", ["ccvr"]), resumable="phase")  # ccvr: the head's SGD learning rate
    retrain_momentum: float = key(0.9, range="[0, 1)", applies=("calibration.method", ["ccvr"]), resumable="phase")  # ccvr: the head's SGD momentum
    retrain_batch_size: int = key(64, range=">= 1", applies=("calibration.method", ["ccvr"]), resumable="phase")  # ccvr: mini-batch of virtual features, in an order drawn from (seed) each pass


@dataclass
class TCTConfig:
    stage1: str = key("fedavg", methods="tct_stage1", applies=("algorithm.name", ["tct"]), resumable="phase")  # the stage-1 algorithm (train.rounds rounds of it; its options are algorithm.options): a method that declares tct_stage1 = True
    p: int = key(100000, range=">= 1", applies=("algorithm.name", ["tct"]), resumable="phase")  # eNTK feature dimension: random coordinates of each per-sample gradient (paper: 100,000); all of them if the model has fewer
    coordinate_seed: int = key(123, range=">= 0", seed_max=2**64 - 1, applies=("algorithm.name", ["tct"]), resumable="phase")  # seed of the coordinate subset (Algorithm 3: 123)
    coordinate_order: str = key("parameter", choices=["parameter", "drawn"], applies=("algorithm.name", ["tct"]), resumable="phase", previous="drawn")  # parameter (Algorithm 3's coordinates stored in parameter order: whole layers are written directly, faster) | drawn (in randperm's order, as the released code); stage 2 is the same up to float round-off (docs/algorithms/tct.md)
    head_seed: int = key(0, range=">= 0", seed_max=2**64 - 1, applies=("algorithm.name", ["tct"]), resumable="phase")  # seed of the re-initialised last layer
    gradient_of: str = key("all", choices=["all", "extractor"], applies=("algorithm.name", ["tct"]), resumable="phase")  # all (Algorithm 3 and the released code: every parameter) | extractor (Algorithm 2: without the head)
    feature_dtype: str = key("float32", choices=["float32", "float16"], applies=("algorithm.name", ["tct"]), resumable="phase")  # float32 | float16 (what the released code stores; half the memory)
    feature_store: str = key("memory", choices=["memory", "disk"], applies=("algorithm.name", ["tct"]), resumable="phase")  # memory (recomputed on resume) | disk (memory-mapped files under RUN_DIR/tct, reused on resume, also from stage 1 with new stage-2 keys, with their statistics and each client's decomposition)
    normalize: bool = key(True, applies=("algorithm.name", ["tct"]), resumable="phase")  # z-score every coordinate with statistics over all clients (off: the paper's "TCT (woN)")
    rounds: int = key(100, range=">= 1", applies=("algorithm.name", ["tct"]), resumable="phase")  # stage-2 rounds T2
    local_steps: int = key(500, range=">= 1", limit=10**7, applies=("algorithm.name", ["tct"]), resumable="phase")  # stage-2 local full-batch gradient steps M
    lr: float = key(5.0e-5, range="> 0", applies=("algorithm.name", ["tct"]), resumable="phase")  # stage-2 local learning rate eta
    solver: str = key("scaffold", choices=["scaffold", "fedavg", "gd"], applies=("algorithm.name", ["tct"]), resumable="phase")  # stage 2: scaffold (Algorithm 1) | fedavg (the TCT-FedAvg ablation) | gd (one global full-batch gradient step a round, TCT-GD)
    local_solver: str = key("closed_form", choices=["closed_form", "iterative"], applies=("algorithm.name", ["tct"]), resumable="phase")  # closed_form (exact M steps at a cost independent of M) | iterative (M literal steps)
    compute_dtype: str = key("float64", choices=["float64", "float32"], applies=("algorithm.name", ["tct"]), resumable="phase")  # dtype of the products with the features in stage 2 (float32: faster, ~1e-6 relative)
    chunk_size: int = key(128, range=">= 1", applies=("algorithm.name", ["tct"]), resumable="phase")  # samples per batched per-sample-gradient chunk: bounds memory; changes features only by float round-off (CPU, tct_cnn: 128 ~10% faster than 256)
    threads: int = key(0, range=">= 0", limit=1024, resumable="phase")  # intra-op CPU threads while TCT extracts features and eigendecomposes (0: runtime.threads); stage 2's result is bit-identical for equal values, for any number of ranks
    memory_limit_gb: float = key(0.0, range=">= 0", applies=("algorithm.name", ["tct"]), resumable="phase")  # refuse to start stage 2 if its memory on one node would exceed this (0: 80% of the memory available now)
    check_invariant: bool = key(False, applies=("algorithm.name", ["tct"]), resumable="phase")  # scaffold: also reduce sum_k p_k h_k each round and log its size (doubles the bytes; for tests)


@dataclass
class ServerConfig:
    optimizer: str = key("sgd", choices=["sgd", "adam", "yogi", "adagrad"])  # sgd (FedAvgM with momentum > 0) | adam | yogi | adagrad (FedOpt, Reddi et al. 2021)
    lr: float = key(1.0, range="> 0")  # server learning rate applied to the averaged update
    lr_schedule: str = key("constant", choices=["constant", "cosine", "step"])  # server lr by round: constant | cosine (from lr to lr_min over the rounds after warm-up) | step (times lr_gamma every lr_step_every rounds)
    lr_warmup_rounds: int = key(0, range=">= 0")  # server lr: linear warm-up over the first this many rounds (lr * t / W in round t <= W), then the schedule
    lr_min: float = key(0.0, range=">= 0", applies=("server.lr_schedule", ["cosine"]))  # server lr, cosine: the lr the cosine reaches after the last round
    lr_step_every: int = key(10, range=">= 1", applies=("server.lr_schedule", ["step"]))  # server lr, step: rounds between decays
    lr_gamma: float = key(0.1, range="> 0", applies=("server.lr_schedule", ["step"]))  # server lr, step: factor applied at each decay
    momentum: float = key(0.0, range="[0, 1)", applies=("server.optimizer", ["sgd"]))  # sgd: server momentum (FedAvgM)
    beta1: float = key(0.9, range="[0, 1)", applies=("server.optimizer", ["adam", "yogi", "adagrad"]))  # adam, yogi, adagrad: first-moment decay (Reddi et al. use momentum in all three)
    beta2: float = key(0.99, range="[0, 1)", applies=("server.optimizer", ["adam", "yogi"]))  # adam, yogi: second-moment decay
    eps: float = key(1e-3, range="> 0")  # adam, yogi, adagrad: adaptivity tau; second moments start at eps^2


@dataclass
class TrainConfig:
    rounds: int = key(30, range=">= 1", resumable=True)  # communication rounds
    clients_per_round: int = key(10, range=">= 1")  # cohort size, sampled without replacement each round
    cohort: str = key("random", choices=["random", "sequential", "poisson"])  # random (seeded sample each round) | sequential (round t takes the next clients_per_round ids: fresh clients every round) | poisson (each client joins independently with probability clients_per_round / num_clients, from (seed, round): the cohort size varies, 0 included; what privacy accountants assume)
    local_epochs: int = key(1, range=">= 1", limit=10**4)  # passes over the client's data per round
    local_steps: int = key(0, range=">= 0", limit=10**7)  # 0: local_epochs passes per round; > 0: exactly this many local SGD steps per round (FedADC's H), in fresh random orders of the client's data, a new one each time a pass runs out (needs local_epochs 1)
    batch_size: int = key(32, range=">= 1")  # local mini-batch size (the last partial batch of an epoch is kept)
    lr: float = key(0.05, range="> 0")  # local SGD learning rate
    lr_schedule: str = key("constant", choices=["constant", "cosine", "step"])  # local lr by round: constant | cosine (from lr to lr_min over the rounds after warm-up) | step (times lr_gamma every lr_step_every rounds)
    lr_warmup_rounds: int = key(0, range=">= 0")  # local lr: linear warm-up over the first this many rounds (lr * t / W in round t <= W), then the schedule
    lr_min: float = key(0.0, range=">= 0", applies=("train.lr_schedule", ["cosine"]))  # local lr, cosine: the lr the cosine reaches after the last round
    lr_step_every: int = key(10, range=">= 1", applies=("train.lr_schedule", ["step"]))  # local lr, step: rounds between decays
    lr_gamma: float = key(0.1, range="> 0", applies=("train.lr_schedule", ["step"]))  # local lr, step: factor applied at each decay
    weight_decay: float = key(0.0, range=">= 0")  # local SGD weight decay (L2, coupled as in torch.optim.SGD)
    momentum: float = key(0.0, range="[0, 1)")  # local SGD momentum, reset for every client and round
    virtual_time_s: float = key(0.0, range=">= 0", resumable=True)  # with a system model (system.*): stop at the first round (FedBuff, FedAsync: server step) that ends at or past this many simulated seconds, so synchronous and asynchronous runs compare at equal simulated time; train.rounds stays the most rounds run. The run counts as completed; summary.json's rounds and time_budget say where it stopped. 0: off


@dataclass
class EvalConfig:
    every: int = key(5, range=">= 1", resumable=True)  # evaluate the global model every this many rounds (and after the last)
    batch_size: int = key(1000, range=">= 1", resumable=True)  # evaluation batch size
    clients: bool = key(False, resumable=True)  # also score every client's own model (FedBN: with its own BatchNorm; tct: stage 2's linear model on eNTK features, in its stage-2 evaluations) on its local test set, drawn from the test split with the client's label distribution (seed, client); logs client_acc_mean, _std, _min, _p10 (each client counted once), client_acc_weighted_mean (every client's test samples pooled) and clients_never_sampled
    client_split: str = key("test", choices=["test", "holdout"])  # eval.clients: where each client's local test set comes from: test (drawn from the test split with the client's label distribution; with partition.scheme=natural, the client's own test samples from the source) | holdout (a stratified fraction eval.client_holdout of the client's own training data, drawn from (seed, client) and never trained on: sizes and weights count the rest). holdout needs eval.clients=true; neither key may change on resume
    client_test_size: int = key(0, range=">= 0", limit=10**7, resumable=True)  # eval.clients, client_split=test: samples in each client's local test set (0: its share of the test split, n_k * |test| / |train|, at least 1)
    finetune_epochs: int = key(0, range=">= 0", resumable=True)  # eval.clients: each client first fine-tunes the model it is scored with (the global model; FedBN: with its own BatchNorm) for this many epochs of plain local SGD on its own training data (train.batch_size, the optimizer of eval.finetune_optimizer; batches keyed by (seed, client)): "FedAvg + fine-tuning". The client_acc_* statistics are then the fine-tuned models' (summary.json: client_finetune_epochs); test_acc and the global model are unchanged. 0: off. Needs eval.clients=true; refused for personalised methods (fedbabu: algorithm.options.finetune_epochs) and tct (its clients are scored with stage 2's linear model)
    finetune_optimizer: str = key("own", choices=["own", "train"], resumable=True, previous="train")  # the optimizer of every fine-tuning before per-client scoring (eval.finetune_epochs, fedbabu's algorithm.options.finetune_epochs): own (SGD at eval.finetune_lr with eval.finetune_momentum, no weight decay: FedBABU's protocol) | train (the lr of the last round trained with train.momentum and train.weight_decay: the only behaviour before this key, kept to reproduce earlier runs; a saved config without the key resumes with it)
    finetune_lr: float = key(0.001, range="> 0", resumable=True)  # eval.finetune_optimizer=own: the fine-tuning's lr (FedBABU's paper: 1e-3)
    finetune_momentum: float = key(0.9, range="[0, 1)", resumable=True)  # eval.finetune_optimizer=own: the fine-tuning's momentum, restarted for each client (FedBABU's paper: 0.9)
    finetune_from: str = key("last", choices=["last", "best"])  # eval.clients with a fine-tuning before scoring (eval.finetune_epochs; a personalised method that keeps nothing per client: fedbabu, perfedavg): the global model each client starts from: last (the evaluated round's) | best (the best so far by test_acc, the global model's accuracy on the whole test set, FedBABU's protocol: after the last round, the best round's model). Kept in the checkpoints; metrics.jsonl's client_model_round says which round's model the clients were scored from. Cannot change on resume
    train_metrics: bool = key(False, resumable=True)  # also score the global model on the whole training split at each evaluation: global_train_loss and global_train_acc (FedProx's "training loss": the global model's loss on every client's training data, weighted by samples)
    test_samples: int = key(0, range=">= 0", resumable=True)  # score test_acc and test_loss on a fixed sample of this many test samples (sequences of a next-token dataset), drawn once from the data seed: the same rows in every evaluation, on every rank and after a resume (TFF's StackOverflow baseline: 10,000 of 16.6 M test sentences). 0, or at least the test split's size: the whole test split. Per-client evaluation (eval.clients) is not sampled. The start line and summary.json (eval_samples) say what was scored; a resume with the same value scores the same rows; refused with tct (its stage 2 scores the whole test split)
    train_samples: int = key(0, range=">= 0", resumable=True)  # eval.train_metrics: score global_train_loss and global_train_acc on a fixed sample of this many training samples, drawn as eval.test_samples draws its sample (another stream of the data seed). 0, or at least the training split's size: every training sample
    client_holdout: float = key(0.1, range="(0, 1)", applies=("eval.client_split", ["holdout"]))  # eval.client_split=holdout: fraction of each client's training samples held out, round(f * n_k) but at least 1 and at most n_k - 1 (none for a client with fewer than 2)
    target_acc: float = key(0.0, range="[0, 1]")  # time to accuracy: summary.json's time_to_acc gives the round, the simulated time (with a system model) and the wall time of the first evaluation whose accuracy (client_acc_mean with eval.clients, else test_acc) reaches this fraction; None there if none did. 0: off


@dataclass
class OutputConfig:
    dir: str = "runs/example"  # run directory: config, metrics.jsonl, summary.json, TensorBoard, checkpoints
    tensorboard: bool = key(True, resumable=True)  # write TensorBoard event files (rank 0); false leaves tensorboard out of output.trackers
    progress: str = key("auto", choices=["auto", "bar", "log", "none"], resumable=True)  # auto (a bar on a terminal, a line per eval otherwise) | bar | log | none
    trackers: list = key(["tensorboard"], choices=TRACKERS, resumable=True)  # where rank 0 logs the round's scalars, the config and the final metrics, besides metrics.jsonl: any of tensorboard (RUN_DIR/tb), mlflow (pip install distfl[mlflow]; output.mlflow_uri), wandb (pip install distfl[wandb]; output.wandb_mode). A YAML list, or tensorboard,mlflow in an override; [] for none
    experiment: str = key("distfl", resumable=True)  # output.trackers: the MLflow experiment and the W&B project the run is logged under
    mlflow_uri: str = key("", resumable=True)  # output.trackers has mlflow: its tracking URI; "" = file:./mlruns (a local file store in the working directory; view it with `MLFLOW_ALLOW_FILE_STORE=true mlflow ui --backend-store-uri ./mlruns`, which needs the full package: pip install mlflow), or an MLflow server's http(s):// URI; a database URI (sqlite:///...) needs the full mlflow package. Checked before the run starts (docs/outputs.md)
    wandb_mode: str = key("offline", choices=["offline", "online"], resumable=True)  # output.trackers has wandb: offline (written to RUN_DIR/wandb, no network; upload later with `wandb sync`) | online (needs `wandb login`)


@dataclass
class CheckpointConfig:
    every: int = key(10, range=">= 0", resumable=True)  # write a checkpoint every this many rounds (0: never; the final round is always written)
    keep: int = key(2, range=">= 1", resumable=True)  # how many recent checkpoints to keep


@dataclass
class RuntimeConfig:
    device: str = key("auto", choices=["auto", "cpu", "cuda"], resumable=True)  # auto (cuda if available) | cpu | cuda
    threads: int = key(1, range=">= 1", limit=1024, resumable=True)  # intra-op CPU threads per process; results are bit-identical only for equal values
    deterministic: bool = key(True, resumable=True)  # require deterministic kernels (an op without one stops the run, naming it); false runs such ops with a warning and gives up bit-identity
    client_state: str = key("memory", choices=["memory", "disk"])  # where per-client state lives: memory | disk (under the run dir)
    placement: str = key("auto", choices=["auto", "balanced", "sticky"])  # clients -> ranks: auto (sticky for stateful methods in memory, else balanced) | balanced | sticky
    channels_last: str = key("auto", choices=["auto", "on", "off"], previous="off")  # memory format of image training batches: on (channels_last: the same values, faster CPU convolutions and max-pooling; float rounding differs from off) | off (contiguous NCHW) | auto (on CPU for the zoo models measured faster with it: pfl_cnn, cifar_cnn, resnet20, mobilenetv2; off for the others, for plugin models, which may .view their activations, and on CUDA until measured)
    pack_size: int = key(0, range=">= 0", resumable=True)  # clients trained at once as one vectorised model (torch.func), cut from the cohort in order and dealt to ranks whole; 0 = auto (CPU: 1, one at a time; CUDA: 50 where the run can pack, else 1; measured: bench/results/cross-device.md, bench/results/cross-device-cuda.md). Equals pack_size=1 up to float rounding; bit-identical on any number of ranks. Needs balanced placement (runtime.client_state=disk for stateful methods)
    cuda_graphs: str = key("auto", choices=["auto", "on", "off"], resumable=True)  # a pack's local step (runtime.pack_size > 1) captured once per batch shape as a CUDA graph and replayed: the same kernels with one launch, the same bits as off. auto: on where clients train in packs on a GPU; on: the same, refused on a CPU or with pack_size=1; off: eager. A capture that fails is said once and the run goes on eagerly (docs/gpu.md)
    tf32: bool = key(False)  # CUDA: let convolutions and matmuls round their inputs to TF32 (10 mantissa bits) and run on tensor cores, as torch's default does for convolutions: faster, still deterministic, other bits than float32 maths (off, the default). No effect on a CPU (docs/gpu.md)


@dataclass
class PrivacyConfig:
    mechanism: str = key("none", choices=["none", "gaussian", "dp_ftrl", "banded_mf", "ddgauss", "skellam"])  # none | gaussian: central user-level differential privacy (DP-FedAvg, McMahan et al. 2018): each sampled client's whole update clipped to clip_norm, Gaussian noise added once to the sum, a fixed denominator (docs/privacy.md) | dp_ftrl: DP-FTRL (Kairouz et al. 2021), the same clipping with tree-aggregated noise correlated across rounds, for train.cohort=sequential (each client once per floor(num_clients / clients_per_round) rounds; no sampling needed) | banded_mf: DP-FTRL with banded matrix factorisation noise (Choquette-Choo et al. 2023; the optimal banded Toeplitz factor), the same participation | ddgauss | skellam: distributed DP under secure aggregation (secagg.bits > 0; docs/secagg.md): each client clips its update to clip_norm, rotates, rounds and adds its own discrete Gaussian (Kairouz et al. 2021) or Skellam (Agarwal et al. 2021) noise of stddev noise_multiplier x clip_norm / sqrt(clients_per_round); the server sees only the noisy sum
    clip_norm: float = key(1.0, range="> 0", applies=("privacy.mechanism", ["gaussian", "dp_ftrl", "banded_mf", "ddgauss", "skellam"]))  # gaussian: L2 bound C on each client's update (every statistic it adds to the round's sum); with adaptive_clip, its value in round 1
    noise_multiplier: float = key(-1.0, range=">= -1", applies=("privacy.mechanism", ["gaussian", "dp_ftrl", "banded_mf", "ddgauss", "skellam"]))  # gaussian: z, the noise on the sum has std z * C (with adaptive_clip, z is the total the accountant sees, split between the update and the clipped count as Andrew et al. 2021, Thm 1); -1: not set, calibrated from target_epsilon
    target_epsilon: float = key(0.0, range=">= 0", applies=("privacy.mechanism", ["gaussian", "dp_ftrl", "banded_mf", "ddgauss", "skellam"]))  # gaussian: calibrate noise_multiplier with the accountant so that train.rounds rounds spend at most this epsilon at delta (printed at start); ddgauss | skellam: the same with the mechanism's own accounting, for the padded update's dimension and secagg.bits / scale_bits, with train.clients_per_round survivors a round (secagg.threshold under the system model or Poisson cohorts; docs/secagg.md); 0: not set, give noise_multiplier
    delta: float = key(0.0, range="[0, 1)", applies=("privacy.mechanism", ["gaussian", "dp_ftrl", "banded_mf", "ddgauss", "skellam"]))  # gaussian: delta of the (epsilon, delta) guarantee, required in (0, 1); common choice 1 / num_clients^1.1
    accountant: str = key("rdp", choices=["rdp", "pld"], applies=("privacy.mechanism", ["gaussian", "dp_ftrl", "banded_mf"]))  # gaussian: rdp (Renyi DP, dp-accounting's RdpAccountant) | pld (privacy loss distributions, tighter; train.cohort=poisson only)
    adaptive_clip: bool = key(False, applies=("privacy.mechanism", ["gaussian", "dp_ftrl", "banded_mf"]))  # gaussian: move clip_norm each round towards the target_quantile of the clients' update norms, from a noised count of unclipped clients (Andrew et al. 2021)
    target_quantile: float = key(0.5, range="(0, 1)")  # adaptive_clip: fraction gamma of clients whose update should fit within the clip
    clip_lr: float = key(0.2, range=">= 0")  # adaptive_clip: geometric learning rate eta_C of C <- C * exp(-eta_C (b - gamma)), b the noised unclipped fraction
    bands: int = key(0, range=">= 0", applies=("privacy.mechanism", ["banded_mf"]))  # banded_mf: b, the bands of the factor C (its noise is correlated over b rounds); at most floor(num_clients / clients_per_round), the rounds between a client's participations; 0: that many (capped at train.rounds)
    secure_noise: bool = key(True, applies=("privacy.mechanism", ["gaussian", "dp_ftrl", "banded_mf"]), previous=False)  # gaussian: true: the noise and the cohorts come from AES-128-CTR keyed by a 128-bit key drawn from the operating system's secure source at start, kept only in the checkpoints (owner-only noise_key file), so nobody with the config can regenerate and subtract the noise (for models you release) | false: from seed, reproducible from the config (simulation studies; the noise offers no protection against whoever has the config)
    count_noise_multiplier: float = key(0.0, range=">= 0")  # adaptive_clip: std sigma_b of the noise on the count of unclipped clients; 0: expected cohort / 20 (the paper's choice); must exceed noise_multiplier / 2
    release_timings: bool = key(False, applies=("privacy.mechanism", ["gaussian", "dp_ftrl", "banded_mf"]), resumable=True)  # false: a private run logs no wall-clock time (round_s and wall_s in metrics.jsonl, the trackers and summary.json; the progress line's s/round and eta): a round's time grows with its cohort's size and its clients' sample counts, which the guarantee covers only through the noised model | true: log them, for timing studies (outside the guarantee; docs/privacy.md)


@dataclass
class SystemConfig:
    speed: str = "constant:1"  # each client's compute time per training sample's forward pass in ms (FedScale's `computation`), keyed by (seed, client): constant:V | uniform:LO,HI | lognormal:MU,SIGMA (exp(MU + SIGMA N(0,1))) | list:V1,V2,... (each client one value, drawn uniformly). The whole system section is off (today's rounds, no virtual clock) while every key holds its default (docs/system.md)
    reference_flops: float = key(0.0, range=">= 0")  # > 0: system.speed (or the capacity file) was measured on a model of this many forward FLOPs per sample; every client's compute time is scaled by this model's FLOPs / this (counted on one sample at start by torch's FlopCounterMode). 0: no scaling
    compute_factor: float = key(3.0, range="> 0")  # a sample's training time is this many times its forward pass (FedScale's 3: the backward pass takes about 2x)
    bandwidth: str = "constant:inf"  # each client's download bandwidth in kbit/s (FedScale's `communication`; 1 kbit = 1024 bits), a spec as system.speed; inf: transfers take no time
    upload_bandwidth: str = "same"  # each client's upload bandwidth in kbit/s: same (its download bandwidth, FedScale's one figure) | a spec as system.speed, drawn independently
    capacity_file: str = ""  # FedScale's client_device_capacity (a pickle, or the JSON `python -m distfl.system.traces convert` writes): id -> {computation: ms per sample, communication: kbit/s}, client k taking the entry with key (k + 1) mod the file's length, as FedScale maps its 1-based ids; replaces system.speed and both bandwidths
    availability: str = key("always", choices=["always", "trace", "diurnal"])  # always | trace (FedScale's client_behave_trace in system.trace_file) | diurnal (each client online system.diurnal_online of every system.diurnal_period_s, from a phase keyed by (seed, client))
    trace_file: str = key("", applies=("system.availability", ["trace"]))  # availability=trace: FedScale's client_behave_trace (a pickle, or its JSON conversion): id -> {active: [s], inactive: [s], finish_time: s, ...}; client k takes the entry at position (k + 1) mod the file's length, as FedScale; online while active[i] <= (t mod finish_time) <= inactive[i] for some i
    diurnal_period_s: float = key(86400.0, range="> 0", applies=("system.availability", ["diurnal"]))  # availability=diurnal: the length of a day in virtual seconds
    diurnal_online: float = key(0.5, range="(0, 1]", applies=("system.availability", ["diurnal"]))  # availability=diurnal: the fraction of each period a client is online
    unavailable: str = key("skip", choices=["skip", "fail"])  # availability: skip (a round samples only clients online when it starts) | fail (it samples from all; an offline client fails, counted as dropped)
    dropout: float = key(0.0, range="[0, 1)")  # probability that a sampled client drops out (starts and never reports), keyed by (seed, round, client); also a client whose availability ends before it finishes is dropped
    round: str = key("wait_all", choices=["wait_all", "deadline", "overselect", "stragglers"])  # synchronous rounds: wait_all (the slowest reporting client sets the round's length) | deadline (clients not done by system.deadline_s are late and dropped, or send partial work with system.partial_work) | overselect (sample ceil(system.overselect x clients_per_round), keep the first clients_per_round to finish) | stragglers (FedProx's straggler model: a share system.stragglers of each round's sampled clients manages fewer local epochs; dropped, or sending that work with system.partial_work)
    deadline_s: float = key(0.0, range=">= 0", applies=("system.round", ["deadline"]))  # round=deadline: the round's length in virtual seconds (> 0)
    partial_work: bool = key(False, applies=("system.round", ["deadline", "stragglers"]))  # round=deadline: a late client sends the local steps it finished by the deadline (FedProx's variable local work) instead of being dropped; one with no finished step is dropped. round=stragglers: a straggler sends the epochs it managed instead of being dropped
    stragglers: float = key(0.0, range="[0, 1]", applies=("system.round", ["stragglers"]))  # round=stragglers: the share of each round's sampled clients that are stragglers (Li et al. 2020, Section 5.2; the authors' code: k - round(k (1 - share)) of the k sampled, keyed by (seed, round)); each manages a number of local epochs drawn uniformly from 1 to train.local_epochs - 1, keyed by (seed, round, client)
    overselect: float = key(1.3, range=">= 1")  # round=overselect: clients sampled per client kept (Bonawitz et al. 2019, FedScale: 1.3)
    async_mode: str = key("none", choices=["none", "fedbuff", "fedasync"])  # asynchronous aggregation, also spelled system.async (the same key; `async` is a Python keyword, so the field is async_mode): none | fedbuff (Nguyen et al. 2022) | fedasync (Xie et al. 2019). train.rounds counts server steps
    buffer_size: int = key(10, range=">= 1", applies=("system.async_mode", ["fedbuff"]))  # fedbuff: K, client updates per server step (at most system.concurrency: a buffered update holds its slot)
    concurrency: int = key(0, range=">= 0", applies=("system.async_mode", ["fedbuff", "fedasync"]))  # fedbuff, fedasync: C, clients training at once (0: train.clients_per_round)
    max_staleness: int = key(-1, range=">= -1", applies=("system.async_mode", ["fedbuff", "fedasync"]))  # fedbuff, fedasync: updates staler than this many server steps are discarded (-1: none)
    staleness: str = key("constant", choices=["constant", "polynomial", "hinge"], applies=("system.async_mode", ["fedbuff", "fedasync"]))  # fedbuff, fedasync: weight of an update s server steps stale: constant (1) | polynomial ((1 + s)^-a) | hinge (1 for s <= b, else 1 / (a (s - b) + 1))
    staleness_a: float = key(0.5, range=">= 0", applies=("system.staleness", ["polynomial", "hinge"]))  # staleness=polynomial, hinge: a
    staleness_b: float = key(4.0, range=">= 0", applies=("system.staleness", ["hinge"]))  # staleness=hinge: b
    async_alpha: float = key(0.6, range="(0, 1]", applies=("system.async_mode", ["fedasync"]))  # fedasync: mixing weight alpha, w <- (1 - alpha_t) w + alpha_t w_client with alpha_t = alpha x the staleness weight


@dataclass
class CompressionConfig:
    up: str = key("none", choices=["none", "topk", "randk", "qsgd", "signsgd", "drive", "eden", "powersgd", "sketch", "fp16", "bf16"])  # what each client uploads instead of its float32 update (docs/compression.md): none | topk (the largest magnitudes) | randk (keyed random coordinates, rescaled by d/k) | qsgd (Alistarh et al.: norm, signs and stochastic levels) | signsgd (signs times the mean magnitude, EF-signSGD's) | drive (1 bit a coordinate after a keyed Hadamard rotation) | eden (b bits a coordinate after the rotation) | powersgd (rank-r factors of each weight, warm-started) | sketch (FetchSGD: a count sketch of the update; the server keeps momentum and error in sketch space and applies the top-k; fedavg and fedprox) | fp16 | bf16 (half-precision transport). Applies to the update segments of fedavg, fedprox, feddyn and scaffold (both of its segments)
    density: float = key(0.01, range="(0, 1]", applies=("compression.up", ["topk", "randk", "sketch"]))  # topk, randk: share of each segment's coordinates sent, k = ceil(density x d) | sketch: share of the model's coordinates the FetchSGD server unsketches and applies each round, k = ceil(density x d)
    bits: int = key(8, range=">= 1", limit=32, applies=("compression.up", ["qsgd", "eden"]))  # qsgd: bits a coordinate, sign included (2-32; 2^(bits-1) - 1 levels) | eden: bits a coordinate (1-8)
    rank: int = key(4, range=">= 1", limit=4096, applies=("compression.up", ["powersgd"]))  # powersgd: r, the rank of each weight's factors (a weight whose factors would cost more, and every bias, travels uncompressed)
    rotation: str = key("hadamard", choices=["hadamard", "uniform"], applies=("compression.up", ["drive", "eden"]))  # drive, eden: hadamard (the keyed randomised Hadamard rotation, O(d log d), close to unbiased) | uniform (a Haar-random rotation, the papers' analysis; segments of at most 4,096 values)
    unbiased: bool = key(True, applies=("compression.up", ["randk", "drive", "eden"]))  # randk: rescale the kept values by d/k (off: the contractive form for error feedback) | drive, eden: the unbiased scale (off: the scale that minimises one vector's error)
    error_feedback: bool = key(False, applies=("compression.up", ["topk", "randk", "qsgd", "signsgd", "drive", "eden", "powersgd", "fp16", "bf16"]))  # keep what compression dropped in each client's state and add it to its next update (Stich et al. 2018; Karimireddy et al. 2019); checkpointed like SCAFFOLD's controls
    rows: int = key(3, range=">= 1", limit=1024, applies=("compression.up", ["sketch"]))  # sketch: rows of the count sketch (each row one bucket hash and one sign hash; a coordinate is read back as the median over rows)
    columns: int = key(10000, range=">= 1", limit=2**28, applies=("compression.up", ["sketch"]))  # sketch: columns of the count sketch; a client sends rows x columns float32 values. Several times k; docs/compression.md measures sizes
    down: str = key("none", choices=["none", "fp16", "bf16", "qsgd"])  # what the server sends each client instead of its float32 model parameters (Caldas et al. 2018): none | fp16 | bf16 (16-bit floats) | qsgd (each parameter tensor's norm, signs and stochastic levels at compression.down_bits, keyed by seed, round and tensor); the clients train from the decoded model, the server keeps its own. BatchNorm buffers and SCAFFOLD's control travel as float32. Counted in bytes_down
    down_bits: int = key(8, range=">= 2", limit=32, applies=("compression.down", ["qsgd"]))  # down=qsgd: bits a coordinate, sign included (2^(bits-1) - 1 levels)


@dataclass
class SecAggConfig:
    bits: int = key(0, range=">= 0", limit=56)  # secure aggregation (docs/secagg.md): each client's update travels as integers modulo 2^bits under pairwise and self masks that cancel in the sum (Bonawitz et al. 2017; SecAgg+ with secagg.neighbours); 0: off (the exact sum). 2-56 when on
    clip: float = key(1.0, range="> 0")  # secagg: each value a client adds to a secured segment (its weighted update) is clipped to [-clip, clip] before rounding (under privacy.mechanism=ddgauss|skellam, privacy.clip_norm bounds the whole update instead)
    scale_bits: int = key(16, range=">= 0", limit=52)  # secagg: values are scaled by 2^scale_bits and rounded stochastically (keyed by seed, round, client) to integers, so the sum's resolution is 2^-scale_bits
    threshold: int = key(1, range=">= 1")  # secagg: the fewest clients that must report (survive) for the masks to be removed; a round with fewer fails (secagg.on_failure)
    neighbours: int = key(0, range=">= 0")  # secagg: each client's neighbours in the masking graph: 0 (SecAgg's complete graph) | k (SecAgg+'s k-regular graph, k even, fewer messages)
    on_failure: str = key("skip", choices=["skip", "stop"])  # secagg: a round with fewer survivors than secagg.threshold: skip (the model stays as it was; the round is logged with secagg_failed=1) | stop (the run stops with an error)
    verify: bool = False  # secagg: also sum the clients' integers without masks and check that the unmasked modular sum equals it (for tests and checks)


@dataclass
class Config:
    seed: int = key(0, range=">= 0", seed_max=2**32 - 1)  # seeds partition, model init, cohorts and every client's local randomness
    data: DataConfig = field(default_factory=DataConfig)
    partition: PartitionConfig = field(default_factory=PartitionConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    aggregation: AggregationConfig = field(default_factory=AggregationConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    calibration: CalibrationConfig = field(default_factory=CalibrationConfig)
    tct: TCTConfig = field(default_factory=TCTConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    system: SystemConfig = field(default_factory=SystemConfig)
    compression: CompressionConfig = field(default_factory=CompressionConfig)
    secagg: SecAggConfig = field(default_factory=SecAggConfig)


# The models whose feature width model.feature_dim can set; any other model.name refuses a non-zero value.
FEATURE_DIM_MODELS = ["simplecnn"]

NUM_CLASSES = {"fmnist": 10, "cifar10": 10, "cifar100": 100, "fedprox_synthetic": 10}


@dataclass(frozen=True)
class Key:
    """One declared key: its dotted name, type, default and rules (the field's metadata)."""
    name: str
    type: type
    default: object
    rules: typing.Mapping

    def __getattr__(self, rule):  # key.choices, key.range, ...: None when not declared
        if rule.startswith("__"):
            raise AttributeError(rule)
        if rule == "choices" and "methods" in self.rules:
            from distfl.algorithms import ALGORITHMS

            return [name for name, cls in ALGORITHMS.items() if getattr(cls, self.rules["methods"])]
        return self.rules.get(rule)


def _declared() -> tuple[dict[str, type], dict[str, Key]]:
    hints = typing.get_type_hints(Config)
    sections, keys = {}, {}
    for f in dataclasses.fields(Config):
        typ = hints[f.name]
        if dataclasses.is_dataclass(typ):
            sections[f.name] = typ
            sub_hints = typing.get_type_hints(typ)
            for sf in dataclasses.fields(typ):
                default = sf.default if sf.default is not dataclasses.MISSING else sf.default_factory()
                keys[f"{f.name}.{sf.name}"] = Key(f"{f.name}.{sf.name}", sub_hints[sf.name], default, sf.metadata)
        else:
            keys[f.name] = Key(f.name, typ, f.default, f.metadata)
    return sections, keys


SECTIONS, KEYS = _declared()  # section name -> dataclass; dotted key -> Key, in schema order

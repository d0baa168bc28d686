"""The config schema: every key a run accepts, its type, default and meaning.

These names are distfl's public interface (YAML files, `key=value` overrides, sweeps). Loading,
overrides and validation live in `config.py`; this file only declares the shape.
Each field's comment is its documentation; `docs/config.md` is generated from them.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class DataConfig:
    dataset: str = "fmnist"  # fmnist | cifar10 | cifar100 | synthetic | files (your own data at data.path)
    root: str = "./data"  # where to look for (and download) the dataset files
    path: str = ""  # files: an .npz with x_train, y_train, x_test, y_test (images N x C x H x W, or vectors N x D), or a folder with train/ and test/ ImageFolder trees (docs/extending.md)
    download: bool = True  # allow a torchvision download when no local copy is found
    augment: str = "auto"  # auto (crop+flip for CIFAR, none otherwise) | none | crop_flip
    normalize: str = "auto"  # input scaling after pixels / 255: auto (CIFAR: (x - mean) / std with the fixed per-channel stats in distfl/data/datasets.py CIFAR_STATS; fmnist, synthetic, files: none) | none (the [0, 1] pixels; files and synthetic: as read or generated) | mean_std ((x - mean) / std per channel, both splits, with the mean and population std of the training split computed in float64; FMNIST: 0.2860 / 0.3530)
    synthetic_train: int = 2000  # synthetic: training samples
    synthetic_test: int = 500  # synthetic: test samples
    synthetic_classes: int = 10  # synthetic: number of classes
    synthetic_image_size: int = 8  # synthetic: images are channels x size x size
    synthetic_channels: int = 1  # synthetic: image channels


@dataclass
class PartitionConfig:
    scheme: str = "dirichlet"  # iid | dirichlet | n_classes | shards | quantity | longtail | file (the split in partition.path)
    num_clients: int = 100  # total clients in the population
    path: str = ""  # file: an .npz with one int64 array of training-set indices per client, client_0 .. client_{num_clients-1} (what `distfl partition --out` writes)
    alpha: float = 0.5  # Dirichlet concentration: label proportions (dirichlet) or client sizes (quantity)
    classes_per_client: int = 2  # n_classes: distinct labels per client (NIID-Bench #C; its draws, so its client sets)
    shards_per_client: int = 2  # shards: label-sorted shards per client (McMahan et al.)
    min_size: int = 10  # dirichlet, quantity: resample until every client has this many samples
    max_attempts: int = 0  # dirichlet, quantity: redraws before giving up with an error; 0 = the scheme's default (dirichlet 1000, quantity 2000000: NIID-Bench's 100 clients at alpha 0.5 need ~70,000)
    imbalance_ratio: float = 0.01  # longtail: smallest / largest class count of a client (Cao et al. 2019)
    subsample: float = 0.1  # longtail: each client first draws this fraction of the training set
    seed: int = -1  # seed of the data: the client split, what is drawn from it (eval.client_split holdout, the clients' test sets) and a synthetic dataset; -1: the run's `seed`. Set it to train several seeds (model init, batches, cohorts) on one split


@dataclass
class ModelConfig:
    name: str = "simplecnn"  # simplecnn | tct_cnn (TCT's FMNIST net: 2 conv + max-pool, 2 FC, 454,922 params) | lenet5 | cifar_cnn | resnet18 | resnet20 | mlp | vgg13 | senet18 | mobilenetv2 | pfl_cnn (pfl-research's CIFAR-10 CNN, the cross-device bench), or your own: package.module:build, a function (input_shape, num_classes) -> nn.Module (docs/extending.md)
    norm: str = "bn"  # resnet18, vgg13, senet18, mobilenetv2: bn | gn
    gn_groups: int = 2  # resnet18, vgg13, senet18, mobilenetv2 with norm=gn: groups per GroupNorm layer (a divisor of 64; of 8 for mobilenetv2)
    mlp_hidden: int = 64  # mlp: hidden width (two hidden layers)
    feature_dim: int = 0  # simplecnn: width d of the feature layer (the head's input: C x d for head=sphere); 0 = the model's own (84). When set, the last hidden FC has d units and the FC before it max(120, d). Other models refuse a non-zero value
    projection_dim: int = 0  # a projection head after the features (MOON's: Linear(d, d), ReLU, Linear(d, projection_dim)), read by the head (and by head=sphere's normalisation); 0 = none. algorithm.name=moon needs it (paper: 256); give the methods you compare with the same value
    head: str = "linear"  # linear (learnable, with bias) | sphere (SphereFed: fixed C x d head with orthonormal rows by QR, normalised features, MSE) | fixed_random (fixed He-initialised head, FedBABU-like)
    head_seed: int = 0  # sphere, fixed_random: seed of the fixed head matrix (its own generator, independent of `seed`); identical on every rank
    loss: str = "auto"  # auto (mse for head=sphere, else ce) | ce (cross-entropy) | mse (squared error to one-hot targets)
    feature_norm: str = "auto"  # auto (on for head=sphere) | on | off: L2-normalise the features before the head
    mse_reduction: str = "mean"  # loss=mse: mean over classes (torch.nn.MSELoss) | sum over classes (||Wz - y||^2)


@dataclass
class AlgorithmConfig:
    name: str = "fedavg"  # a built-in method (docs/algorithms/NAME.md; tct: stage 1 by tct.stage1, then TCT's stages; personalised methods are scored by eval.clients), or your own: package.module:ClassName (a distfl.Algorithm) or a name registered in the entry-point group distfl.algorithms (docs/extending.md)
    options: dict = field(default_factory=dict)  # the method's own options, declared by its Options dataclass (algorithm.options.KEY=VALUE overrides, sweepable; the table below lists the built-in methods')
    weighting: str = "samples"  # how client updates are averaged: samples (n_k / n) | uniform (1 / |cohort|)


@dataclass
class AggregationConfig:
    mask: str = "none"  # none | gma (gradient masked averaging, Tenison et al.)
    tau: float = 0.4  # gma: sign-agreement threshold in [0, 1]; coordinates below it are scaled by their agreement
    mask_applies_to: str = "step"  # gma: step (mask the server optimizer's final step) | update (mask the averaged update before it)
    fedbn: bool = False  # FedBN: BatchNorm parameters and statistics stay with each client (needs a BatchNorm model)


@dataclass
class CalibrationConfig:
    method: str = "none"  # none | ffc (SphereFed's fast federated calibration: least-squares head after training)
    ridge: float = 0.0  # ffc: the paper's lambda in W^T = (sum Z^T Z + lambda I)^-1 sum Z^T Y (paper: 0)
    clients: str = "all"  # ffc: all (every client of the population, the paper's "each client") | last_cohort (only the last round's cohort)
    batch_size: int = 1000  # ffc: feature-extraction batch size (memory; changes W* only by float32 round-off, ~1e-8 relative)


@dataclass
class TCTConfig:
    stage1: str = "fedavg"  # the stage-1 algorithm (train.rounds rounds of it; its options are algorithm.options)
    p: int = 100000  # eNTK feature dimension: random coordinates of each per-sample gradient (paper: 100,000); all of them if the model has fewer
    coordinate_seed: int = 123  # seed of the coordinate subset (Algorithm 3: 123)
    coordinate_order: str = "parameter"  # parameter (Algorithm 3's coordinates stored in parameter order: whole layers are written directly, faster) | drawn (in randperm's order, as the released code); stage 2 is the same up to float round-off (docs/algorithms/tct.md)
    head_seed: int = 0  # seed of the re-initialised last layer
    gradient_of: str = "all"  # all (Algorithm 3 and the released code: every parameter) | extractor (Algorithm 2: without the head)
    feature_dtype: str = "float32"  # float32 | float16 (what the released code stores; half the memory)
    feature_store: str = "memory"  # memory (recomputed on resume) | disk (memory-mapped files under RUN_DIR/tct, reused on resume, also from stage 1 with new stage-2 keys, with their statistics and each client's decomposition)
    normalize: bool = True  # z-score every coordinate with statistics over all clients (off: the paper's "TCT (woN)")
    rounds: int = 100  # stage-2 rounds T2
    local_steps: int = 500  # stage-2 local full-batch gradient steps M
    lr: float = 5.0e-5  # stage-2 local learning rate eta
    solver: str = "scaffold"  # stage 2: scaffold (Algorithm 1) | fedavg (the TCT-FedAvg ablation) | gd (one global full-batch gradient step a round, TCT-GD)
    local_solver: str = "closed_form"  # closed_form (exact M steps at a cost independent of M) | iterative (M literal steps)
    compute_dtype: str = "float64"  # dtype of the products with the features in stage 2 (float32: faster, ~1e-6 relative)
    chunk_size: int = 128  # samples per batched per-sample-gradient chunk: bounds memory; changes features only by float round-off (CPU, tct_cnn: 128 ~10% faster than 256)
    threads: int = 0  # intra-op CPU threads while TCT extracts features and eigendecomposes (0: runtime.threads); stage 2's result is bit-identical for equal values, for any number of ranks
    memory_limit_gb: float = 0.0  # refuse to start stage 2 if its memory on one node would exceed this (0: 80% of the memory available now)
    check_invariant: bool = False  # scaffold: also reduce sum_k p_k h_k each round and log its size (doubles the bytes; for tests)


@dataclass
class ServerConfig:
    optimizer: str = "sgd"  # sgd (FedAvgM with momentum > 0) | adam | yogi | adagrad (FedOpt, Reddi et al. 2021)
    lr: float = 1.0  # server learning rate applied to the averaged update
    lr_schedule: str = "constant"  # server lr by round: constant | cosine (from lr to lr_min over the rounds after warm-up) | step (times lr_gamma every lr_step_every rounds)
    lr_warmup_rounds: int = 0  # server lr: linear warm-up over the first this many rounds (lr * t / W in round t <= W), then the schedule
    lr_min: float = 0.0  # server lr, cosine: the lr the cosine reaches after the last round
    lr_step_every: int = 10  # server lr, step: rounds between decays
    lr_gamma: float = 0.1  # server lr, step: factor applied at each decay
    momentum: float = 0.0  # sgd: server momentum (FedAvgM)
    beta1: float = 0.9  # adam, yogi, adagrad: first-moment decay (Reddi et al. use momentum in all three)
    beta2: float = 0.99  # adam, yogi: second-moment decay
    eps: float = 1e-3  # adam, yogi, adagrad: adaptivity tau; second moments start at eps^2


@dataclass
class TrainConfig:
    rounds: int = 30  # communication rounds
    clients_per_round: int = 10  # cohort size, sampled without replacement each round
    cohort: str = "random"  # random (seeded sample each round) | sequential (round t takes the next clients_per_round ids: fresh clients every round) | poisson (each client joins independently with probability clients_per_round / num_clients, from (seed, round): the cohort size varies, 0 included; what privacy accountants assume)
    local_epochs: int = 1  # passes over the client's data per round
    local_steps: int = 0  # 0: local_epochs passes per round; > 0: exactly this many local SGD steps per round (FedADC's H), in fresh random orders of the client's data, a new one each time a pass runs out (needs local_epochs 1)
    batch_size: int = 32  # local mini-batch size (the last partial batch of an epoch is kept)
    lr: float = 0.05  # local SGD learning rate
    lr_schedule: str = "constant"  # local lr by round: constant | cosine (from lr to lr_min over the rounds after warm-up) | step (times lr_gamma every lr_step_every rounds)
    lr_warmup_rounds: int = 0  # local lr: linear warm-up over the first this many rounds (lr * t / W in round t <= W), then the schedule
    lr_min: float = 0.0  # local lr, cosine: the lr the cosine reaches after the last round
    lr_step_every: int = 10  # local lr, step: rounds between decays
    lr_gamma: float = 0.1  # local lr, step: factor applied at each decay
    weight_decay: float = 0.0  # local SGD weight decay (L2, coupled as in torch.optim.SGD)
    momentum: float = 0.0  # local SGD momentum, reset for every client and round


@dataclass
class EvalConfig:
    every: int = 5  # evaluate the global model every this many rounds (and after the last)
    batch_size: int = 1000  # evaluation batch size
    clients: bool = False  # also score every client's own model (FedBN: with its own BatchNorm; tct: stage 2's linear model on eNTK features, in its stage-2 evaluations) on its local test set, drawn from the test split with the client's label distribution (seed, client); logs client_acc_mean, _std, _min, _p10
    client_split: str = "test"  # eval.clients: where each client's local test set comes from: test (drawn from the test split with the client's label distribution) | holdout (a stratified fraction eval.client_holdout of the client's own training data, drawn from (seed, client) and never trained on: sizes and weights count the rest). holdout needs eval.clients=true; neither key may change on resume
    client_test_size: int = 0  # eval.clients, client_split=test: samples in each client's local test set (0: its share of the test split, n_k * |test| / |train|, at least 1)
    finetune_epochs: int = 0  # eval.clients: each client first fine-tunes the model it is scored with (the global model; FedBN: with its own BatchNorm) for this many epochs of plain local SGD on its own training data (train.batch_size, momentum, weight_decay, the lr of the last round; batches keyed by (seed, client)): "FedAvg + fine-tuning". The client_acc_* statistics are then the fine-tuned models' (summary.json: client_finetune_epochs); test_acc and the global model are unchanged. 0: off. Needs eval.clients=true; refused for personalised methods (fedbabu: algorithm.finetune_epochs) and tct (its clients are scored with stage 2's linear model)
    client_holdout: float = 0.1  # eval.client_split=holdout: fraction of each client's training samples held out, round(f * n_k) but at least 1 and at most n_k - 1 (none for a client with fewer than 2)


@dataclass
class OutputConfig:
    dir: str = "runs/example"  # run directory: config, metrics.jsonl, summary.json, TensorBoard, checkpoints
    tensorboard: bool = True  # write TensorBoard event files (rank 0)
    progress: str = "auto"  # auto (a bar on a terminal, a line per eval otherwise) | bar | log | none


@dataclass
class CheckpointConfig:
    every: int = 10  # write a checkpoint every this many rounds (0: never; the final round is always written)
    keep: int = 2  # how many recent checkpoints to keep


@dataclass
class RuntimeConfig:
    device: str = "auto"  # auto (cuda if available) | cpu | cuda
    threads: int = 1  # intra-op CPU threads per process; results are bit-identical only for equal values
    deterministic: bool = True  # require deterministic kernels (an op without one stops the run, naming it); false runs such ops with a warning and gives up bit-identity
    client_state: str = "memory"  # where per-client state lives: memory | disk (under the run dir)
    placement: str = "auto"  # clients -> ranks: auto (sticky for stateful methods in memory, else balanced) | balanced | sticky
    channels_last: str = "auto"  # memory format of image training batches: on (channels_last: the same values, faster CPU convolutions and max-pooling; float rounding differs from off) | off (contiguous NCHW) | auto (on CPU for the zoo models measured faster with it: pfl_cnn, cifar_cnn, resnet20, mobilenetv2; off for the others, for plugin models, which may .view their activations, and on CUDA until measured)
    pack_size: int = 0  # clients trained at once as one vectorised model (torch.func), cut from the cohort in order and dealt to ranks whole; 0 = auto (CPU: 1, one at a time; CUDA: 50 where the run can pack, else 1; measured: bench/cross-device.md, bench/cross-device-cuda.md). Equals pack_size=1 up to float rounding; bit-identical on any number of ranks. Needs balanced placement (runtime.client_state=disk for stateful methods)


@dataclass
class PrivacyConfig:
    mechanism: str = "none"  # none | gaussian: central user-level differential privacy (DP-FedAvg, McMahan et al. 2018): each sampled client's whole update clipped to clip_norm, Gaussian noise added once to the sum, a fixed denominator (docs/privacy.md)
    clip_norm: float = 1.0  # gaussian: L2 bound C on each client's update (every statistic it adds to the round's sum); with adaptive_clip, its value in round 1
    noise_multiplier: float = -1.0  # gaussian: z, the noise on the sum has std z * C (with adaptive_clip, z is the total the accountant sees, split between the update and the clipped count as Andrew et al. 2021, Thm 1); -1: not set, calibrated from target_epsilon
    target_epsilon: float = 0.0  # gaussian: calibrate noise_multiplier with the accountant so that train.rounds rounds spend at most this epsilon at delta (printed at start); 0: not set, give noise_multiplier
    delta: float = 0.0  # gaussian: delta of the (epsilon, delta) guarantee, required in (0, 1); common choice 1 / num_clients^1.1
    accountant: str = "rdp"  # gaussian: rdp (Renyi DP, dp-accounting's RdpAccountant) | pld (privacy loss distributions, tighter; train.cohort=poisson only)
    adaptive_clip: bool = False  # gaussian: move clip_norm each round towards the target_quantile of the clients' update norms, from a noised count of unclipped clients (Andrew et al. 2021)
    target_quantile: float = 0.5  # adaptive_clip: fraction gamma of clients whose update should fit within the clip
    clip_lr: float = 0.2  # adaptive_clip: geometric learning rate eta_C of C <- C * exp(-eta_C (b - gamma)), b the noised unclipped fraction
    count_noise_multiplier: float = 0.0  # adaptive_clip: std sigma_b of the noise on the count of unclipped clients; 0: expected cohort / 20 (the paper's choice); must exceed noise_multiplier / 2


@dataclass
class Config:
    seed: int = 0  # seeds partition, model init, cohorts and every client's local randomness
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


# Valid values of the string keys that name a choice. config.py validates against these and suggests
# the closest one for a typo; the modules that implement the choices check they cover them in tests.
# model.name also takes plugins (PLUGIN_KEYS): an import path or an entry-point name; algorithm.name is
# a method's name (a built-in one: distfl.algorithms.ALGORITHMS) or a plugin's.
CHOICES = {
    "data.dataset": ["fmnist", "cifar10", "cifar100", "synthetic", "files"],
    "data.augment": ["auto", "none", "crop_flip"],
    "data.normalize": ["auto", "none", "mean_std"],
    "partition.scheme": ["iid", "dirichlet", "n_classes", "shards", "quantity", "longtail", "file"],
    "train.cohort": ["random", "sequential", "poisson"],
    "privacy.mechanism": ["none", "gaussian"],
    "privacy.accountant": ["rdp", "pld"],
    "model.name": ["simplecnn", "tct_cnn", "lenet5", "cifar_cnn", "resnet18", "resnet20", "mlp", "vgg13", "senet18", "mobilenetv2", "pfl_cnn"],
    "model.norm": ["bn", "gn"],
    "model.head": ["linear", "sphere", "fixed_random"],
    "model.loss": ["auto", "ce", "mse"],
    "model.feature_norm": ["auto", "on", "off"],
    "model.mse_reduction": ["mean", "sum"],
    "calibration.method": ["none", "ffc"],
    "calibration.clients": ["all", "last_cohort"],
    "tct.stage1": ["fedavg", "fedprox", "scaffold", "feddyn", "fednova", "fedadc", "slowmo", "fedfor"],
    "tct.gradient_of": ["all", "extractor"],
    "tct.coordinate_order": ["parameter", "drawn"],
    "tct.feature_dtype": ["float32", "float16"],
    "tct.feature_store": ["memory", "disk"],
    "tct.solver": ["scaffold", "fedavg", "gd"],
    "tct.local_solver": ["closed_form", "iterative"],
    "tct.compute_dtype": ["float64", "float32"],
    "aggregation.mask": ["none", "gma"],
    "aggregation.mask_applies_to": ["step", "update"],
    "algorithm.weighting": ["samples", "uniform"],
    "server.optimizer": ["sgd", "adam", "yogi", "adagrad"],
    "server.lr_schedule": ["constant", "cosine", "step"],
    "train.lr_schedule": ["constant", "cosine", "step"],
    "output.progress": ["auto", "bar", "log", "none"],
    "runtime.device": ["auto", "cpu", "cuda"],
    "runtime.client_state": ["memory", "disk"],
    "runtime.placement": ["auto", "balanced", "sticky"],
    "runtime.channels_last": ["auto", "on", "off"],
    "eval.client_split": ["test", "holdout"],
}

# The models whose feature width model.feature_dim can set; any other model.name refuses a non-zero value.
FEATURE_DIM_MODELS = ["simplecnn"]

# Keys that only mean something for some choices of another key: setting one explicitly (to a
# non-default value) for a choice that ignores it gives a warning (sweeps vary the controlling key).
APPLIES_ONLY_TO = {
    "aggregation.tau": ("aggregation.mask", ["gma"]),
    "aggregation.mask_applies_to": ("aggregation.mask", ["gma"]),
    "partition.alpha": ("partition.scheme", ["dirichlet", "quantity"]),
    "partition.path": ("partition.scheme", ["file"]),
    "data.path": ("data.dataset", ["files"]),
    "partition.classes_per_client": ("partition.scheme", ["n_classes"]),
    "partition.shards_per_client": ("partition.scheme", ["shards"]),
    "partition.imbalance_ratio": ("partition.scheme", ["longtail"]),
    "partition.subsample": ("partition.scheme", ["longtail"]),
    "server.momentum": ("server.optimizer", ["sgd"]),
    "server.beta1": ("server.optimizer", ["adam", "yogi", "adagrad"]),
    "server.beta2": ("server.optimizer", ["adam", "yogi"]),
    "model.norm": ("model.name", ["resnet18", "vgg13", "senet18", "mobilenetv2"]),
    "model.gn_groups": ("model.name", ["resnet18", "vgg13", "senet18", "mobilenetv2"]),
    "model.mlp_hidden": ("model.name", ["mlp"]),
    "model.head_seed": ("model.head", ["sphere", "fixed_random"]),
    "calibration.ridge": ("calibration.method", ["ffc"]),
    "eval.client_holdout": ("eval.client_split", ["holdout"]),
    **{f"tct.{key}": ("algorithm.name", ["tct"]) for key in (
        "stage1", "p", "coordinate_seed", "coordinate_order", "head_seed", "gradient_of", "feature_dtype", "feature_store",
        "normalize", "rounds", "local_steps", "lr", "solver", "local_solver", "compute_dtype", "chunk_size",
        "memory_limit_gb", "check_invariant")},
    "calibration.clients": ("calibration.method", ["ffc"]),
    **{f"{section}.{key}": (f"{section}.lr_schedule", schedules) for section in ("train", "server")
       for key, schedules in (("lr_min", ["cosine"]), ("lr_step_every", ["step"]), ("lr_gamma", ["step"]))},
    "calibration.batch_size": ("calibration.method", ["ffc"]),
    **{f"privacy.{key}": ("privacy.mechanism", ["gaussian"]) for key in (
        "clip_norm", "noise_multiplier", "target_epsilon", "delta", "accountant", "adaptive_clip")},
}

PLUGIN_KEYS = ("model.name",)

NUM_CLASSES = {"fmnist": 10, "cifar10": 10, "cifar100": 100}

# Valid ranges: ">= x", "> x", "[0, 1)", "[0, 1]", "(0, 1]" or "(0, 1)".
RANGES = {
    "seed": ">= 0",
    "data.synthetic_train": ">= 1",
    "data.synthetic_test": ">= 1",
    "data.synthetic_classes": ">= 2",
    "data.synthetic_image_size": ">= 1",
    "data.synthetic_channels": ">= 1",
    "partition.num_clients": ">= 1",
    "partition.alpha": "> 0",
    "partition.classes_per_client": ">= 1",
    "partition.shards_per_client": ">= 1",
    "partition.min_size": ">= 0",
    "partition.max_attempts": ">= 0",
    "partition.imbalance_ratio": "(0, 1]",
    "partition.subsample": "(0, 1]",
    "partition.seed": ">= -1",
    "model.gn_groups": ">= 1",
    "model.mlp_hidden": ">= 1",
    "model.feature_dim": ">= 0",
    "model.head_seed": ">= 0",
    "calibration.ridge": ">= 0",
    "tct.p": ">= 1",
    "tct.coordinate_seed": ">= 0",
    "tct.head_seed": ">= 0",
    "tct.rounds": ">= 1",
    "tct.local_steps": ">= 1",
    "tct.lr": "> 0",
    "tct.chunk_size": ">= 1",
    "tct.memory_limit_gb": ">= 0",
    "calibration.batch_size": ">= 1",
    "aggregation.tau": "[0, 1]",
    "server.lr": "> 0",
    "server.momentum": "[0, 1)",
    "server.lr_warmup_rounds": ">= 0",
    "server.lr_min": ">= 0",
    "server.lr_step_every": ">= 1",
    "server.lr_gamma": "> 0",
    "server.beta1": "[0, 1)",
    "server.beta2": "[0, 1)",
    "server.eps": "> 0",
    "train.rounds": ">= 1",
    "train.clients_per_round": ">= 1",
    "train.local_epochs": ">= 1",
    "train.local_steps": ">= 0",
    "train.batch_size": ">= 1",
    "train.lr": "> 0",
    "train.weight_decay": ">= 0",
    "train.momentum": "[0, 1)",
    "train.lr_warmup_rounds": ">= 0",
    "train.lr_min": ">= 0",
    "train.lr_step_every": ">= 1",
    "train.lr_gamma": "> 0",
    "eval.every": ">= 1",
    "eval.batch_size": ">= 1",
    "eval.client_test_size": ">= 0",
    "eval.client_holdout": "(0, 1)",
    "eval.finetune_epochs": ">= 0",
    "checkpoint.every": ">= 0",
    "checkpoint.keep": ">= 1",
    "runtime.threads": ">= 1",
    "runtime.pack_size": ">= 0",
    "tct.threads": ">= 0",
    "privacy.clip_norm": "> 0",
    "privacy.noise_multiplier": ">= -1",
    "privacy.target_epsilon": ">= 0",
    "privacy.delta": "[0, 1)",
    "privacy.target_quantile": "(0, 1)",
    "privacy.clip_lr": ">= 0",
    "privacy.count_noise_multiplier": ">= 0",
    "model.projection_dim": ">= 0",
}

# The largest seed each key's consumer accepts: the partition's numpy RandomState takes 32 bits,
# torch's generators 64.
SEED_MAX = {"seed": 2**32 - 1, "partition.seed": 2**32 - 1, "model.head_seed": 2**64 - 1, "tct.coordinate_seed": 2**64 - 1,
            "tct.head_seed": 2**64 - 1}

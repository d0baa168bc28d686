"""pfl-research 0.6 on the shape of `distfl bench --suite cross-device`, for the column beside it.

Run with a Python that has `pfl==0.6.0` (and torch) installed, not distfl's venv:
    python bench/pfl_research_cross_device.py --rounds 3
Same shape: 1,000 users x 50 synthetic 3x32x32 samples, 50 users a round, 1 local epoch, batch 10,
local SGD lr 0.1, central SGD lr 1 (FedAvg), the same CNN as distfl's pfl_cnn (no dropout), one
intra-op thread, pfl's default device (cuda when available). Seconds per round = (time of 1 + R
rounds - time of 1 round) / R, each a fresh `FederatedAveraging().run`, so set-up and the first
round's warm-up are excluded. `distfl bench --suite cross-device` runs this script itself when
DISTFL_PFL_PYTHON names the Python to run it with.
"""
import argparse
import json
import time

import numpy as np
import torch
from torch import nn

from pfl.aggregate.simulate import SimulatedBackend
from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
from pfl.data.dataset import Dataset
from pfl.data.federated_dataset import FederatedDataset
from pfl.data.sampling import get_user_sampler
from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams
from pfl.metrics import Weighted
from pfl.model.pytorch import PyTorchModel

USERS, PER_USER, COHORT = 1000, 50, 50


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 32, 3), nn.ReLU(), nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2),
                                 nn.Flatten(), nn.Linear(64 * 14 * 14, 128), nn.ReLU(), nn.Linear(128, 10))

    def forward(self, x):
        return self.net(x)

    def loss(self, x, y, eval=False):
        self.eval() if eval else self.train()
        return nn.functional.cross_entropy(self(x), y)

    def metrics(self, x, y, eval=False):
        self.eval() if eval else self.train()
        with torch.no_grad():
            loss = nn.functional.cross_entropy(self(x), y, reduction="sum").item()
        return {"loss": Weighted(loss, len(y))}


def seconds(rounds: int, data) -> float:
    torch.manual_seed(0)
    module = CNN()
    model = PyTorchModel(model=module, local_optimizer_create=torch.optim.SGD,
                         central_optimizer=torch.optim.SGD(module.parameters(), lr=1.0))
    fed = FederatedDataset(lambda uid: Dataset(raw_data=data[uid], user_id=str(uid)),
                           get_user_sampler("random", list(range(USERS))))
    backend = SimulatedBackend(training_data=fed, val_data=None)
    params = NNAlgorithmParams(central_num_iterations=rounds, evaluation_frequency=10**9,
                               train_cohort_size=COHORT, val_cohort_size=0)
    t0 = time.perf_counter()
    FederatedAveraging().run(algorithm_params=params, backend=backend, model=model,
                             model_train_params=NNTrainHyperParams(local_num_epochs=1, local_learning_rate=0.1,
                                                                   local_batch_size=10),
                             model_eval_params=NNEvalHyperParams(local_batch_size=10), callbacks=[])
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    data = {u: (torch.rand(PER_USER, 3, 32, 32, generator=g), torch.randint(0, 10, (PER_USER,), generator=g))
            for u in range(USERS)}
    one = seconds(1, data)
    many = seconds(1 + args.rounds, data)
    print(json.dumps({"pfl_version": "0.6.0", "rounds": args.rounds, "s_per_round": (many - one) / args.rounds,
                      "first_round_s": one, "torch": torch.__version__}))


if __name__ == "__main__":
    main()

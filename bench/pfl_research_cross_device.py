"""pfl-research 0.6 on the shape of `distfl bench --suite cross-device`, for the column beside it.

Run with a Python that has `pfl==0.6.0` (and torch) installed, not distfl's venv:
    python bench/pfl_research_cross_device.py --rounds 3
Same shape: 1,000 users x 50 synthetic 3x32x32 samples, 50 users a round, 1 local epoch, batch 10,
local SGD lr 0.1, central SGD lr 1 (FedAvg), the same CNN as distfl's pfl_cnn (no dropout), one
intra-op thread, pfl's default device (cuda when available). Seconds per round = (time of 1 + R
rounds - time of 1 round) / R, each a fresh `FederatedAveraging().run`, so set-up and the first
round's warm-up are excluded. `distfl bench --suite cross-device` runs this script itself when
DISTFL_PFL_PYTHON names the Python to run it with.

`--processes N` (N > 1) runs pfl-research's multi-process mode, which its guide recommends for one GPU
(docs/source/guides/simulation_distributed.rst, "Multi-process training": try 1, 2, 3, ... processes
a GPU; the best is usually 1-5): N copies of this script, started with PFL_WORKER_ADDRESSES (N
localhost ports) and PFL_WORKER_RANK = 0..N-1, the launch the guide gives besides torchrun. pfl shards
each cohort across the N processes and all-reduces the round's sums. Not torchrun: pfl 0.6 puts each
torchrun rank on `cuda:LOCAL_RANK` (`get_default_device`, and `set_device(LOCAL_RANK)`), a device a
one-GPU machine lacks from the second rank on. The addresses route every process to `cuda`. pfl then
picks the NCCL backend on CUDA, which refuses two ranks on one GPU (ncclInvalidUsage "Duplicate GPU
detected"), so on one GPU this script starts pfl's process group with gloo (`--backend`, recorded in
the output), which all-reduces CUDA tensors through host memory; pfl's own code is unchanged.
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

import torch
from torch import nn

USERS, PER_USER, COHORT = 1000, 50, 50
RANK_ENV, ADDRESSES_ENV = "PFL_WORKER_RANK", "PFL_WORKER_ADDRESSES"  # pfl's names (generic_platform.py)


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
        from pfl.metrics import Weighted

        self.eval() if eval else self.train()
        with torch.no_grad():
            loss = nn.functional.cross_entropy(self(x), y, reduction="sum").item()
        return {"loss": Weighted(loss, len(y))}


def seconds(rounds: int, data, cohort: int = COHORT) -> float:
    from pfl.aggregate.simulate import SimulatedBackend
    from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
    from pfl.data.dataset import Dataset
    from pfl.data.federated_dataset import FederatedDataset
    from pfl.data.sampling import get_user_sampler
    from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams
    from pfl.model.pytorch import PyTorchModel

    torch.manual_seed(0)
    module = CNN()
    model = PyTorchModel(model=module, local_optimizer_create=torch.optim.SGD,
                         central_optimizer=torch.optim.SGD(module.parameters(), lr=1.0))
    fed = FederatedDataset(lambda uid: Dataset(raw_data=data[uid], user_id=str(uid)),
                           get_user_sampler("random", list(data)))
    backend = SimulatedBackend(training_data=fed, val_data=None)
    params = NNAlgorithmParams(central_num_iterations=rounds, evaluation_frequency=10**9,
                               train_cohort_size=cohort, val_cohort_size=0)
    t0 = time.perf_counter()
    FederatedAveraging().run(algorithm_params=params, backend=backend, model=model,
                             model_train_params=NNTrainHyperParams(local_num_epochs=1, local_learning_rate=0.1,
                                                                   local_batch_size=10),
                             model_eval_params=NNEvalHyperParams(local_batch_size=10), callbacks=[])
    return time.perf_counter() - t0


def launch(args) -> dict:
    """Start `args.processes` copies of this script as pfl's workers; rank 0's result, with the count."""
    with socket.socket() as sock:  # a free port for rank 0, pfl's rendezvous (init_method tcp://first address)
        sock.bind(("localhost", 0))
        port = sock.getsockname()[1]
    addresses = ",".join(f"localhost:{port + i}" for i in range(args.processes))
    argv = [sys.executable, os.path.abspath(__file__), "--rounds", str(args.rounds), "--backend", args.backend,
            "--users", str(args.users), "--cohort", str(args.cohort)]
    logs = [tempfile.TemporaryFile("w+") for _ in range(args.processes)]
    procs = [subprocess.Popen(argv, env={**os.environ, ADDRESSES_ENV: addresses, RANK_ENV: str(rank)},
                              stdout=log, stderr=subprocess.STDOUT, text=True, start_new_session=True)
             for rank, log in enumerate(logs)]
    deadline = time.monotonic() + args.timeout
    try:  # until all are done, one fails (the others would wait for it) or the time is up
        while any(p.poll() is None for p in procs) and not any(p.poll() for p in procs):
            if time.monotonic() > deadline:
                sys.exit(f"pfl workers: not done after {args.timeout} s")
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait()
    outs = []
    for rank, (p, log) in enumerate(zip(procs, logs)):
        log.seek(0)
        outs.append(log.read())
        if p.returncode != 0:
            lines = outs[-1].strip().splitlines() or ["no output"]
            print("\n".join(lines[-40:]), file=sys.stderr)
            errors = [line for line in lines if "Error" in line or "Exception" in line] or lines
            sys.exit(f"pfl worker {rank} of {args.processes} failed (exit {p.returncode}): {errors[-1].strip()}")
    return json.loads(outs[0].strip().splitlines()[-1])


def use_backend(backend: str) -> str:
    """In a worker: the process group's backend. pfl asks for NCCL on CUDA (gloo on the CPU); `gloo`
    replaces that choice, and nothing else, before pfl starts the group. Every worker this script
    starts trains on `cuda` (device 0), so on CUDA only gloo can run more than one of them."""
    if backend == "gloo":
        start = torch.distributed.init_process_group

        def init_gloo(*args, **kwargs):  # pfl passes backend= itself: replaced here, not just defaulted
            kwargs.pop("backend", None)
            return start("gloo", *args[1:], **kwargs)
        torch.distributed.init_process_group = init_gloo
        return "gloo"
    return "nccl" if torch.cuda.is_available() else "gloo"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--users", type=int, default=USERS, help="smaller for a quick check (default: the shape's 1,000)")
    ap.add_argument("--cohort", type=int, default=COHORT, help="users a round (default 50)")
    ap.add_argument("--processes", type=int, default=1, help="pfl worker processes sharing the device")
    ap.add_argument("--backend", choices=["gloo", "pfl"], default="gloo",
                    help="the workers' process group: gloo (default), or pfl's own choice (NCCL on CUDA)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds the workers may take together")
    args = ap.parse_args()
    if args.processes > 1 and RANK_ENV not in os.environ:
        print(json.dumps({**launch(args), "processes_started": args.processes}))
        return
    if RANK_ENV in os.environ:
        use_backend(args.backend)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    data = {u: (torch.rand(PER_USER, 3, 32, 32, generator=g), torch.randint(0, 10, (PER_USER,), generator=g))
            for u in range(args.users)}
    one = seconds(1, data, args.cohort)
    many = seconds(1 + args.rounds, data, args.cohort)
    from pfl.internal.ops.selector import get_framework_module

    ops = get_framework_module()
    print(json.dumps({"pfl_version": "0.6.0", "rounds": args.rounds, "users": args.users, "cohort": args.cohort,
                      "s_per_round": (many - one) / args.rounds,
                      "first_round_s": one, "torch": torch.__version__, "processes": ops.distributed.world_size,
                      # the process group pfl's workers actually started (None: one process, no group)
                      "backend": torch.distributed.get_backend() if torch.distributed.is_initialized() else None,
                      "device": str(ops.get_default_device())}))


if __name__ == "__main__":
    main()

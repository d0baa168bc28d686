"""Real training on a GPU (skipped where torch sees none): the CUDA path end to end, under strict
determinism, each run twice with equal hashes, resumed equal to uninterrupted, and ranks sharing a GPU
equal to one rank. The suite hides CUDA from itself (conftest.py); these runs are subprocesses that see
the machine's GPUs. The CPU tests of the same path are in test_gpu_path.py."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import REPO, cuda_env, run_cli, summary, write_config

TCT = {"p": 500, "rounds": 4, "local_steps": 20, "lr": 1e-3}

# A run's sitecustomize.py: TCT's stage 2 fails at the start of its round 3 (after round 2's checkpoint).
CRASH_IN_STAGE2_ROUND_3 = """
from distfl.algorithms.tct import TCTPhase

_round = TCTPhase._round


def _crashing_round(self, trainer, solvers, psi, t, *rest):
    if t == 3:
        raise RuntimeError("simulated crash in stage 2")
    return _round(self, trainer, solvers, psi, t, *rest)


TCTPhase._round = _crashing_round
"""


@pytest.fixture(scope="module")
def gpus() -> int:
    probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
                           env=cuda_env(), capture_output=True, text=True, cwd=REPO)
    count = int(probe.stdout.strip() or 0) if probe.returncode == 0 else 0
    if count == 0:
        pytest.skip("no CUDA device")
    return count


def cuda_run(config, *overrides, nproc: int = 1, resume=None) -> dict:
    args = ["train", "--resume", str(resume), *overrides] if resume else ["train", str(config), *overrides]
    proc = run_cli(args, nproc=nproc, env=cuda_env())
    assert proc.returncode == 0, f"distfl {' '.join(map(str, args))} failed:\n{proc.stdout}\n{proc.stderr}"
    out = resume or next(o.split("=", 1)[1] for o in overrides if o.startswith("output.dir="))
    result = summary(out)
    assert result["device"].startswith("cuda"), result["device"]
    return result


def twice(config, tmp_path, *overrides, nproc: int = 1) -> dict:
    a = cuda_run(config, f"output.dir={tmp_path / 'a'}", *overrides, nproc=nproc)
    b = cuda_run(config, f"output.dir={tmp_path / 'b'}", *overrides, nproc=nproc)
    assert a["model_sha256"] == b["model_sha256"] and a["final_test_acc"] == b["final_test_acc"]
    return a


def test_models_run_forward_and_backward_on_cuda(gpus):
    code = ("import torch\nfrom distfl.models import build_model\nfrom distfl.config.schema import ModelConfig\n"
            "for name in ['simplecnn','tct_cnn','lenet5','cifar_cnn','resnet18','resnet20','mlp','pfl_cnn']:\n"
            "    m = build_model(ModelConfig(name=name), (3, 32, 32), 10).cuda()\n"
            "    out = m(torch.randn(2, 3, 32, 32, device='cuda'))\n"
            "    out.sum().backward()\n"
            "    assert out.shape == (2, 10), name\n"
            "print('ok')\n")
    proc = subprocess.run([sys.executable, "-c", code], env=cuda_env(), capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr


def test_one_rank_trains_deterministically_and_resumes_exactly(gpus, tmp_path):
    config = write_config(tmp_path / "c.yaml", algorithm={"name": "scaffold"}, runtime={"device": "cuda"})
    through = twice(config, tmp_path)
    cuda_run(config, f"output.dir={tmp_path / 'r'}", "train.rounds=3")
    resumed = cuda_run(None, "train.rounds=6", resume=tmp_path / "r")
    assert resumed["model_sha256"] == through["model_sha256"]


def test_packs_on_cuda(gpus, tmp_path):
    config = write_config(tmp_path / "c.yaml", runtime={"device": "cuda", "pack_size": 4},
                          train={"momentum": 0.9})
    twice(config, tmp_path)


def test_ffc_calibration_on_cuda(gpus, tmp_path):
    config = write_config(tmp_path / "c.yaml", model={"name": "mlp", "mlp_hidden": 32, "head": "sphere"},
                          calibration={"method": "ffc", "ridge": 0.01}, runtime={"device": "cuda"})
    twice(config, tmp_path)


@pytest.mark.parametrize("solver,store,split", [("gd", "memory", "test"), ("scaffold", "disk", "holdout")])
def test_tct_on_cuda(gpus, tmp_path, solver, store, split):
    """Stage 2 lives on the host beside the features on any run device: gd ran into a device mix in
    round 1, SCAFFOLD with disk state in round 2 and after a resume inside stage 2. eval.clients scores
    stage 2's model per client there too."""
    config = write_config(tmp_path / "c.yaml", algorithm={"name": "tct"}, tct={**TCT, "solver": solver},
                          runtime={"device": "cuda", "client_state": store}, checkpoint={"every": 1, "keep": 20},
                          eval={"clients": True, "client_split": split})
    through = twice(config, tmp_path)
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(CRASH_IN_STAGE2_ROUND_3)
    crashed = run_cli(["train", config, f"output.dir={tmp_path / 'r'}"],
                      env=cuda_env(PYTHONPATH=f"{site}{os.pathsep}{REPO}"))
    assert crashed.returncode == 1 and "simulated crash in stage 2" in crashed.stderr, crashed.stderr
    resumed = cuda_run(None, resume=tmp_path / "r")
    assert resumed["phases"]["tct"]["psi_sha256"] == through["phases"]["tct"]["psi_sha256"]
    assert resumed["final_client_acc"] == through["final_client_acc"] is not None


def test_two_ranks_sharing_one_gpu_equal_one_rank(gpus, tmp_path):
    """More ranks than GPUs: gloo over the CUDA tensors (NCCL refuses two ranks on one device)."""
    config = write_config(tmp_path / "c.yaml", algorithm={"name": "scaffold"}, runtime={"device": "cuda"})
    one = cuda_run(config, f"output.dir={tmp_path / 'one'}")
    two = cuda_run(config, f"output.dir={tmp_path / 'two'}", nproc=2) if gpus == 1 else None
    if two is None:  # several GPUs: force the sharing with one visible device
        proc = run_cli(["train", str(config), f"output.dir={tmp_path / 'two'}"], nproc=2,
                       env=cuda_env(CUDA_VISIBLE_DEVICES="0"))
        assert proc.returncode == 0, proc.stderr
        two = summary(tmp_path / "two")
    assert two["model_sha256"] == one["model_sha256"]


def test_nccl_on_two_gpus_equals_one_rank(gpus, tmp_path):
    if gpus < 2:
        pytest.skip("needs two GPUs")
    config = write_config(tmp_path / "c.yaml", algorithm={"name": "scaffold"}, runtime={"device": "cuda"})
    one = cuda_run(config, f"output.dir={tmp_path / 'one'}")
    two = cuda_run(config, f"output.dir={tmp_path / 'two'}", nproc=2)
    assert two["model_sha256"] == one["model_sha256"]


GRAPHED_ON_CUDA = {
    "fedavg_momentum": {"train": {"momentum": 0.9, "weight_decay": 0.01}},
    "scaffold_disk": {"algorithm": {"name": "scaffold"}, "runtime": {"client_state": "disk"}},
    "gma": {"aggregation": {"mask": "gma", "tau": 0.4}},
    "resnet20_batchnorm": {"model": {"name": "resnet20"}},
}


@pytest.mark.parametrize("name", list(GRAPHED_ON_CUDA))
def test_cuda_graphs_give_the_bits_of_eager_packs(gpus, tmp_path, name):
    """runtime.cuda_graphs: a pack's steps replayed as CUDA graphs compute what the eager steps compute,
    bit for bit (Dirichlet clients of unequal sizes: full and partial batches, row groups)."""
    extra = GRAPHED_ON_CUDA[name]
    config = write_config(tmp_path / "c.yaml", **{**extra, "runtime": {"device": "cuda", "pack_size": 4,
                                                                      **extra.get("runtime", {})}})
    eager = cuda_run(config, f"output.dir={tmp_path / 'eager'}", "runtime.cuda_graphs=off")
    graphed = cuda_run(config, f"output.dir={tmp_path / 'graphed'}", "runtime.cuda_graphs=on")
    assert eager["cuda_graphs"] == "off" and graphed["cuda_graphs"].startswith("on ("), graphed["cuda_graphs"]
    assert graphed["model_sha256"] == eager["model_sha256"]


def test_cuda_graphs_one_rank_equals_two_ranks_equals_resumed(gpus, tmp_path):
    config = write_config(tmp_path / "c.yaml", runtime={"device": "cuda", "pack_size": 4, "cuda_graphs": "on"},
                          train={"momentum": 0.9})
    one = cuda_run(config, f"output.dir={tmp_path / 'one'}")
    two = cuda_run(config, f"output.dir={tmp_path / 'two'}", nproc=2)  # on one GPU: two ranks share it (gloo)
    cuda_run(config, f"output.dir={tmp_path / 'r'}", "train.rounds=3")
    resumed = cuda_run(None, f"train.rounds={one['rounds']}", resume=tmp_path / "r")
    assert one["cuda_graphs"].startswith("on (")
    assert two["model_sha256"] == one["model_sha256"] == resumed["model_sha256"]


def test_tf32_runs_are_deterministic_and_other_bits(gpus, tmp_path):
    config = write_config(tmp_path / "c.yaml", runtime={"device": "cuda", "pack_size": 4}, model={"name": "simplecnn"},
                          data={"synthetic_image_size": 16})
    strict = cuda_run(config, f"output.dir={tmp_path / 'strict'}")
    tf32 = twice(config, tmp_path, "runtime.tf32=true")
    assert tf32["model_sha256"] != strict["model_sha256"]

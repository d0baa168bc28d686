"""experiments/niid_bench/run.sh maps each NIID-Bench partition name to the distfl overrides that
reproduce it (rows N1-N4 of docs/evidence.md). Run with PYTHON=echo, it prints the sweep lines it
would start, so the mapping is checked without training."""
import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "experiments" / "niid_bench" / "run.sh"


def sweep_lines(parts: str, runs: str = "fedavg") -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": "echo", "SEEDS": "0", "PARTS": parts, "RUNS": runs}
    return subprocess.run(["bash", str(SCRIPT), "/tmp/out"], env=env, capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("part, overrides", [
    ("C1", "partition.scheme=n_classes partition.classes_per_client=1"),
    ("C2", "partition.scheme=n_classes partition.classes_per_client=2"),
    ("C3", "partition.scheme=n_classes partition.classes_per_client=3"),
    ("iid", "partition.scheme=iid"),
    ("dir05", "partition.scheme=dirichlet partition.alpha=0.5"),
    ("qty05", "partition.scheme=quantity partition.alpha=0.5"),
])
def test_each_partition_runs_its_niid_bench_split(part, overrides):
    done = sweep_lines(part)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == (f"-m distfl sweep experiments/niid_bench/niid_bench.yaml {overrides} "
                                   f"algorithm.name=fedavg output.dir=/tmp/out/{part}/fedavg --seeds 0")


def test_scaffold_nb_and_fedprox_carry_their_settings():
    lines = sweep_lines("C2", "fedprox scaffold_nb").stdout.splitlines()
    assert "algorithm.name=fedprox algorithm.mu=0.01 output.dir=/tmp/out/C2/fedprox" in lines[0]
    assert ("algorithm.name=scaffold algorithm.scaffold_correction=weights output.dir=/tmp/out/C2/scaffold_nb"
            in lines[1])


def test_an_unknown_partition_stops_the_script():
    done = sweep_lines("C2 C4")
    assert done.returncode == 2
    assert "unknown part C4" in done.stdout
    # C2's sweep line comes first (the loop reaches C4 second); nothing after the refusal
    assert done.stdout.count("distfl sweep") == 1


def test_extra_overrides_reach_every_sweep_line():
    """run_gpu.sh passes its GPU settings through EXTRA; they must come before output.dir on each line."""
    env = {**os.environ, "PYTHON": "echo", "SEEDS": "0 1", "PARTS": "C3", "RUNS": "fedavg scaffold_nb",
           "EXTRA": "runtime.device=cuda runtime.pack_size=10"}
    lines = subprocess.run(["bash", str(SCRIPT), "/tmp/out"], env=env, capture_output=True, text=True,
                           timeout=30).stdout.splitlines()
    assert len(lines) == 4
    for line in lines:
        assert "runtime.device=cuda runtime.pack_size=10 output.dir=/tmp/out/C3/" in line


def test_run_gpu_runs_each_job_through_run_sh_with_the_gpu_settings(tmp_path):
    gpu_script = SCRIPT.parent / "run_gpu.sh"
    env = {**os.environ, "PYTHON": "echo", "DEADLINE": "120", "JOBS": "2"}
    env.pop("EXTRA", None)
    done = subprocess.run(["bash", str(gpu_script), str(tmp_path), "C3:fedprox:1", "iid:scaffold_nb:0"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    fedprox = (tmp_path / "log_C3_fedprox_1.txt").read_text()
    assert ("partition.classes_per_client=3 algorithm.name=fedprox algorithm.mu=0.01 runtime.device=cuda "
            f"runtime.pack_size=10 runtime.client_state=disk runtime.placement=auto output.dir={tmp_path}/C3/fedprox "
            "--seeds 1") in fedprox
    assert "algorithm.scaffold_correction=weights runtime.device=cuda" in (tmp_path / "log_iid_scaffold_nb_0.txt").read_text()


def test_run_gpu_starts_no_job_past_its_deadline(tmp_path):
    env = {**os.environ, "PYTHON": "echo", "DEADLINE": "10"}
    done = subprocess.run(["bash", str(SCRIPT.parent / "run_gpu.sh"), str(tmp_path), "C3:fedavg:0"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert "not started (deadline): C3:fedavg:0" in done.stdout
    assert not (tmp_path / "log_C3_fedavg_0.txt").exists()

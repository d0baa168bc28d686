"""The multi-node code path on one machine: two torchrun agents acting as two nodes (one rank each),
meeting through a c10d rendezvous on 127.0.0.1, as slurm/train.sbatch starts them on a cluster.
They must train the same model as one node with two ranks."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

from conftest import REPO, summary, train_ok, write_config


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_nodes_of_one_rank_equal_one_node_of_two(tmp_path):
    cfg = write_config(tmp_path / "c.yaml")
    one_node = train_ok(cfg, f"output.dir={tmp_path / 'one_node'}", nproc=2)

    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    nodes = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node_rank={rank}",
         "--nproc_per_node=1", "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}",
         "--rdzv_id=distfl-two-nodes", "-m", "distfl", "train", str(cfg), f"output.dir={tmp_path / 'two_nodes'}"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in (0, 1)]
    outputs = [node.communicate(timeout=600) for node in nodes]
    for node, (out, err) in zip(nodes, outputs):
        assert node.returncode == 0, f"{out}\n{err}"
    # Rank 0 alone reports, whichever agent hosts it.
    assert sum("final test accuracy" in out for out, _ in outputs) == 1

    two_nodes = summary(tmp_path / "two_nodes")
    assert two_nodes["world_size"] == 2
    assert two_nodes["model_sha256"] == one_node["model_sha256"]
    assert two_nodes["final_test_acc"] == one_node["final_test_acc"]

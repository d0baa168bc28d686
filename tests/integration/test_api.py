"""distfl.train / distfl.report from Python: the CLI's run, bit for bit, and docs/python.md runs as written."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from conftest import REPO, run_cli, summary, write_config


def test_python_train_is_the_cli_run(tmp_path):
    import distfl
    from distfl.errors import ConfigError

    cfg = write_config(tmp_path / "c.yaml", eval={"every": 3, "clients": True})
    proc = run_cli(["train", cfg, "algorithm.name=fedprox", "algorithm.mu=0.01", "train.lr=0.05", "seed=1",
                    "partition.alpha=1e-1", f"output.dir={tmp_path / 'cli'}"], subprocess_=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = distfl.train(cfg, algorithm={"name": "fedprox", "mu": 0.01}, train__lr=0.05, seed=1,
                          **{"partition.alpha": 1e-1}, output__dir=str(tmp_path / "py"))
    cli = summary(tmp_path / "cli")
    assert result.run_dir == tmp_path / "py" and result.summary == summary(tmp_path / "py")
    assert result.summary["model_sha256"] == cli["model_sha256"]
    assert result.summary["final_client_acc"] == cli["final_client_acc"]
    assert [r["round"] for r in result.metrics()] == [1, 2, 3, 4, 5, 6]
    # Continued with more rounds: the CLI's --resume.
    longer = distfl.train(resume=result.run_dir, train__rounds=8)
    assert longer.summary["rounds"] == 8 and longer.run_dir == result.run_dir
    with pytest.raises(ConfigError, match="did you mean 'train.rounds'"):
        distfl.train(cfg, train={"roundz": 3})
    with pytest.raises(ConfigError, match="not both"):
        distfl.train(cfg, resume=result.run_dir)


def test_the_python_tutorial_runs_as_written(tmp_path):
    text = (REPO / "docs" / "python.md").read_text()
    code = "\n".join(re.findall(r"```python\n(.*?)```", text, re.S))
    assert "distfl.train(" in code and "distfl.report(" in code
    (tmp_path / "tutorial.py").write_text(code)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "tutorial.py"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "per-client mean" in proc.stdout and "client_acc_mean_vs_round.png" in proc.stdout
    compare = tmp_path / "runs" / "notebook" / "compare"
    assert len(list(compare.glob("*/seed=*/summary.json"))) == 4
    assert (compare / "report" / "report.csv").read_text().startswith("algorithm.name,")


def test_python_resume_reads_the_saved_config_as_the_cli_does(tmp_path):
    """A saved config that predates a key whose default changed (eval.finetune_optimizer: "train" before it)
    is resumed at the value it ran with from Python as from `distfl train --resume`: the same resolved config."""
    import yaml

    from distfl.api import make_config
    from distfl.config import dump_config

    run_dir = tmp_path / "old"
    run_dir.mkdir()
    saved = yaml.safe_load(write_config(tmp_path / "c.yaml", eval={"every": 3, "clients": True}).read_text())
    (run_dir / "config.yaml").write_text(yaml.safe_dump(saved))  # lacks the key, as an older distfl wrote it
    proc = run_cli(["train", "--resume", run_dir, "--print-config", "train.rounds=8"])
    assert proc.returncode == 0, proc.stderr
    cfg = make_config(resume=run_dir, train__rounds=8)
    assert cfg.eval.finetune_optimizer == "train"
    assert dump_config(cfg) == proc.stdout

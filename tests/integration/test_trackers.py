"""output.trackers: TensorBoard's namespaced scalars and HParams, MLflow's file store read back through
MLflow's own client, W&B's offline run directory read back through W&B's own record format."""
from __future__ import annotations

import json
import os
import struct
import subprocess
import sys

import pytest
import torch

from conftest import REPO, metrics, run_cli, summary, train_ok, write_config


def _events(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tb"))
    events.Reload()
    return events


def test_tensorboard_scalars_are_namespaced_with_cohort_size_update_norm_and_hparams(tmp_path):
    cfg = write_config(tmp_path / "c.yaml", eval={"every": 3, "clients": True}, checkpoint={"every": 1, "keep": 10},
                       output={"tensorboard": True, "progress": "none"})
    run = tmp_path / "sw" / "algorithm.name=fedprox" / "seed=2"
    train_ok(cfg, "algorithm.name=fedprox", "seed=2", f"output.dir={run}")
    events = _events(run)
    tags = set(events.Tags()["scalars"])
    assert all("/" in t for t in tags), tags
    assert {"test/accuracy", "test/client_acc_mean", "train/loss", "train/lr", "train/server_lr", "time/wall_s",
            "time/eval_s", "time/round_s", "comm/bytes_reduced", "comm/bytes_up", "train/cohort_size", "train/update_norm"} <= tags
    assert [e.value for e in events.Scalars("train/cohort_size")] == [5] * 6
    rows = metrics(run)
    assert [e.value for e in events.Scalars("test/client_acc_mean")] == pytest.approx(
        [r["client_acc_mean"] for r in rows if "client_acc_mean" in r])
    # The update norm of round t is ||x_t - x_{t-1}|| of the global models the checkpoints hold.
    params = {t: torch.load(run / "checkpoints" / f"round_{t:06d}" / "state.pt", weights_only=True)["params"]
              for t in range(1, 7)}
    norms = {e.step: e.value for e in events.Scalars("train/update_norm")}
    for t in range(2, 7):
        assert norms[t] == pytest.approx(float(torch.linalg.vector_norm(params[t] - params[t - 1])), rel=1e-6)

    from tensorboard.plugins.hparams import plugin_data_pb2

    contents = events.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(contents["_hparams_/session_start_info"]).session_start_info
    hparams = {k: v.string_value or v.number_value or v.bool_value for k, v in start.hparams.items()}
    assert hparams["run"] == "algorithm.name=fedprox/seed=2" and hparams["algorithm.name"] == "fedprox"
    assert hparams["eval.clients"] == 1 and hparams["seed"] == 2
    assert not any(k.startswith(("output.", "checkpoint.")) for k in hparams) and len(hparams) < 25
    experiment = plugin_data_pb2.HParamsPluginData.FromString(contents["_hparams_/experiment"]).experiment
    assert {"hparams/final_client_acc_mean", "hparams/final_client_acc_p10", "hparams/final_test_acc"} <= {
        m.name.tag for m in experiment.metric_infos}
    assert events.Scalars("hparams/final_client_acc_mean")[0].value == pytest.approx(
        summary(run)["final_client_acc"]["mean"])


def test_mlflow_file_store_holds_the_runs_params_and_metrics_across_a_resume(tmp_path):
    from mlflow.tracking import MlflowClient

    uri = (tmp_path / "mlruns").as_uri()
    cfg = write_config(tmp_path / "c.yaml", eval={"every": 2},
                       output={"trackers": ["mlflow"], "mlflow_uri": uri, "experiment": "pfl"})
    run = tmp_path / "run"
    train_ok(cfg, "algorithm.name=fedprox", "train.rounds=4", f"output.dir={run}")
    resumed = train_ok(None, "train.rounds=6", resume=str(run))
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("pfl")
    (found,) = client.search_runs([experiment.experiment_id])  # the resumed run continued the same MLflow run
    assert found.info.status == "FINISHED" and found.info.run_name == "run"
    assert found.data.tags["distfl.run_dir"] == str(run.resolve())
    assert json.loads((run / "trackers.json").read_text())["mlflow_run_id"] == found.info.run_id
    assert found.data.params["algorithm.name"] == "fedprox" and found.data.params["run"] == "run"
    assert "output.dir" not in found.data.params
    history = client.get_metric_history(found.info.run_id, "test/accuracy")
    logged = {r["round"]: r["test_acc"] for r in metrics(run) if "test_acc" in r}
    assert {m.step: m.value for m in history} == logged and sorted(logged) == [2, 4, 6]
    assert found.data.metrics["final_test_acc"] == resumed["final_test_acc"]
    assert len(client.get_metric_history(found.info.run_id, "train/update_norm")) >= 6


def _wandb_records(path):
    """The records of a W&B run file (.wandb): a 7-byte header, then LevelDB-log records in 32 KiB
    blocks (full, or first/middle/last pieces), each a wandb.proto Record."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, pieces, pending = 7, 32768, [], b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 0:
            break
        if kind in (1, 2):
            pending = b""
        pending += chunk
        if kind in (1, 4):
            pieces.append(pending)
    return [wandb_internal_pb2.Record.FromString(p) for p in pieces]


def test_wandb_offline_writes_its_run_directory_without_network(tmp_path):
    cfg = write_config(tmp_path / "c.yaml", eval={"every": 3}, output={"trackers": ["wandb"], "experiment": "pfl"})
    run = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    # No network: offline mode, and any HTTP(S) request would go to a closed port.
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", WANDB_MODE="offline", HOME=str(tmp_path),
               HTTP_PROXY="http://127.0.0.1:9", HTTPS_PROXY="http://127.0.0.1:9")
    proc = subprocess.run([sys.executable, "-m", "distfl", "train", cfg, f"output.dir={run}"], env=env,
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_id = json.loads((run / "trackers.json").read_text())["wandb_run_id"]
    (path,) = (run / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb")
    records = _wandb_records(path)
    (header,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert header.run_id == run_id and header.display_name == "run" and header.project == "pfl"
    config = {i.key: json.loads(i.value_json) for i in header.config.update}
    assert config["run"] == "run" and config["data.dataset"] == "synthetic"
    def items(update):  # W&B stores "a/b" as the nested key [a, b]
        return {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in update}

    history = {r.history.step.num: items(r.history.item)
               for r in records if r.WhichOneof("record_type") == "history"}
    logged = metrics(run)
    assert sorted(history) == [r["round"] for r in logged]
    for row in logged:
        assert history[row["round"]]["train/loss"] == row["train_loss"]
        if "test_acc" in row:
            assert history[row["round"]]["test/accuracy"] == row["test_acc"]
    final = {k: v for r in records if r.WhichOneof("record_type") == "summary" for k, v in items(r.summary.update).items()}
    assert final["final_test_acc"] == summary(run)["final_test_acc"]


def test_a_missing_tracker_package_is_one_line_before_any_data_loads(tmp_path, monkeypatch):
    import importlib.util

    from distfl.config import load_config
    from distfl.errors import ConfigError

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ConfigError, match=r"output.trackers lists wandb, which is not installed: pip install 'distfl\[wandb\]'"):
        load_config(None, ["output.trackers=tensorboard,wandb"])
    proc = run_cli(["train", write_config(tmp_path / "c.yaml"), "output.trackers=[tensorboard, mlfow]"])
    assert proc.returncode == 2 and "did you mean 'mlflow'" in proc.stderr


# ---- a tracker is an observer: checked before any work, never stopping a run --------------------------------
def _no_wandb_env(tmp_path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "NETRC"))}
    return {**env, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "HOME": str(tmp_path), **extra}


@pytest.mark.parametrize("overrides, says", [
    (["output.mlflow_uri=file:///proc/mlruns"], "output.mlflow_uri=file:///proc/mlruns: MLflow's file store would be "
                                                "in /proc/mlruns, on a system pseudo-filesystem"),
    (["output.mlflow_uri={tmp}/c.yaml/mlruns"], "output.mlflow_uri={tmp}/c.yaml/mlruns: MLflow's file store would be "
                                                "inside {tmp}/c.yaml, which is a file, not a folder"),
    (["output.mlflow_uri=http://127.0.0.1:9"], "output.mlflow_uri=http://127.0.0.1:9: no MLflow tracking server "
                                               "answers at 127.0.0.1:9 within 5 s"),
])
def test_a_tracker_uri_that_cannot_work_is_refused_before_the_run_directory(tmp_path, overrides, says):
    """One line, exit 2, no run directory to --overwrite; a closed port answers in seconds (a fresh process
    under a hang guard: MLflow's own client would retry for minutes)."""
    cfg = write_config(tmp_path / "c.yaml", output={"trackers": ["mlflow"], "progress": "none"})
    run = tmp_path / "run"
    proc = run_cli(["train", cfg, f"output.dir={run}", *(o.format(tmp=tmp_path) for o in overrides)], subprocess_=True,
                   timeout=300)
    assert proc.returncode == 2 and proc.stderr.startswith(f"distfl: error: {says.format(tmp=tmp_path)}"), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not run.exists()


def test_mlflow_database_store_without_its_package_is_refused(tmp_path):
    """mlflow-skinny has no database store (sqlalchemy, alembic): sqlite:///mlflow.db would fail at set-up."""
    import importlib.util

    if importlib.util.find_spec("sqlalchemy") is not None and importlib.util.find_spec("alembic") is not None:
        pytest.skip("the full MLflow package is installed: its database store works")
    cfg = write_config(tmp_path / "c.yaml", output={"trackers": ["mlflow"], "progress": "none"})
    proc = run_cli(["train", cfg, f"output.dir={tmp_path / 'run'}", "output.mlflow_uri=sqlite:///mlflow.db"])
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "output.mlflow_uri=sqlite:///mlflow.db: an MLflow database store needs the full MLflow package (pip " \
           "install mlflow==" in proc.stderr and not (tmp_path / "run").exists()


def test_wandb_online_without_a_login_is_refused_before_the_run_directory(tmp_path):
    cfg = write_config(tmp_path / "c.yaml", output={"trackers": ["wandb"], "wandb_mode": "online"})
    proc = subprocess.run([sys.executable, "-m", "distfl", "train", cfg, f"output.dir={tmp_path / 'run'}"],
                          env=_no_wandb_env(tmp_path), capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode == 2 and proc.stderr.startswith(
        "distfl: error: output.wandb_mode=online needs a W&B login for api.wandb.ai (run `wandb login`"), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "run").exists()


FAIL_AT_ROUND_3 = """
import os
from distfl import trackers

def fail(self, values, step, _real=trackers.{cls}.scalars):
    if step == 3:
        {break_it}
    return _real(self, values, step)

trackers.{cls}.scalars = fail
"""


@pytest.mark.parametrize("tracker, cls, break_it", [
    ("mlflow", "MLflow", "raise ConnectionError('the tracking server went away')"),
    # W&B's service process killed: its own exit hook would print a 30-line traceback
    ("wandb", "Wandb", "import psutil; [p.kill() for p in psutil.Process().children(recursive=True)]; "
                       "_real(self, values, step); raise ConnectionError('W&B service is gone')"),
])
def test_a_tracker_failing_mid_run_is_one_warning_and_the_run_completes(tmp_path, tracker, cls, break_it):
    from conftest import env_with_sitecustomize

    cfg = write_config(tmp_path / "c.yaml", output={"trackers": [tracker], "progress": "none",
                                                    "mlflow_uri": (tmp_path / "mlruns").as_uri()})
    run = tmp_path / "run"
    env = env_with_sitecustomize(tmp_path, FAIL_AT_ROUND_3.format(cls=cls, break_it=break_it), HOME=str(tmp_path))
    env = {k: v for k, v in env.items() if not k.startswith("WANDB_")}
    proc = subprocess.run([sys.executable, "-m", "distfl", "train", cfg, f"output.dir={run}"], env=env,
                          capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and warnings[0].startswith(f"warning: the {tracker} tracker failed at round 3 ("), \
        proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) <= 3, proc.stderr
    assert summary(run)["status"] == "completed" and [r["round"] for r in metrics(run)] == list(range(1, 7))


def test_system_counters_are_logged_under_system(tmp_path):
    """A round's counts of the system section go to system/, not method/ (a method's own statistics)."""
    cfg = write_config(tmp_path / "c.yaml", output={"tensorboard": True, "progress": "none"})
    run = tmp_path / "run"
    train_ok(cfg, f"output.dir={run}", "system.speed=lognormal:0,1", "system.round=deadline", "system.deadline_s=0.5",
             "system.dropout=0.2")
    tags = set(_events(run).Tags()["scalars"])
    assert {"system/sampled", "system/finished", "system/late", "system/dropped", "time/virtual_time_s",
            "time/round_virtual_s"} <= tags and not any(t.startswith("method/") for t in tags), tags
    assert {"sampled", "finished", "late", "dropped", "round_virtual_s"} <= set(metrics(run)[0])

"""A run in which no client can ever report (every round late, dropped out or offline) ends `completed`,
as it is, but says so: summary.json counts the rounds without reports and `distfl train` warns."""
from __future__ import annotations

from conftest import run_cli, summary, write_config

NEVER = ("system.speed=constant:1000", "system.round=deadline", "system.deadline_s=0.001")


def test_a_run_whose_clients_never_report_warns(tmp_path):
    cfg = write_config(tmp_path / "c.yaml")
    proc = run_cli(["train", str(cfg), f"output.dir={tmp_path / 'run'}", *NEVER])
    assert proc.returncode == 0, proc.stderr
    done = summary(tmp_path / "run")
    assert done["status"] == "completed" and done["rounds_without_reports"] == done["rounds"] == 6
    assert "warning: no client reported in any of the 6 rounds" in proc.stdout


def test_a_run_whose_clients_report_counts_no_empty_round(tmp_path):
    cfg = write_config(tmp_path / "c.yaml")
    proc = run_cli(["train", str(cfg), f"output.dir={tmp_path / 'run'}", "system.speed=constant:1"])
    assert proc.returncode == 0, proc.stderr
    assert summary(tmp_path / "run")["rounds_without_reports"] == 0 and "warning" not in proc.stdout

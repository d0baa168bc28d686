"""What a user reads when something is off: each message says what happened and what to do, without
a traceback, a source line of distfl, or advice that would delete finished work."""
from __future__ import annotations

import shutil

from conftest import run_cli, summary, train_ok, write_config


def test_a_finished_run_without_checkpoints_is_not_advised_to_be_overwritten(tmp_path, small_config):
    """A completed run whose checkpoints were deleted: a new start, and --resume, say it finished and
    where its results are, not that it stopped before its first checkpoint."""
    run = tmp_path / "run"
    done = train_ok(small_config, f"output.dir={run}", "train.rounds=2")
    shutil.rmtree(run / "checkpoints")
    for args in (["train", small_config, f"output.dir={run}", "train.rounds=2"], ["train", "--resume", run]):
        proc = run_cli(args)
        assert proc.returncode == 2, proc.stderr
        line = proc.stderr.strip()
        assert len(line.splitlines()) == 1
        assert (f"it finished (completed after 2 rounds, final test accuracy {100 * done['final_test_acc']:.2f}%) "
                f"and its checkpoints were deleted since; its results are in {run / 'summary.json'}") in line
        assert "stopped before its first checkpoint" not in line and "start it over with --overwrite" not in line
    assert summary(run) == done


BAD_HOOKS = '''
import distfl


def scale(g):
    raise ValueError("scale went wrong")


class Raises(distfl.Algorithm):
    def correct_gradient(self, w, g, run):
        raise ValueError("boom")


class Deeper(distfl.Algorithm):
    def correct_gradient(self, w, g, run):
        scale(g)
'''


def test_a_plugin_error_names_the_hook_and_the_file(tmp_path, monkeypatch):
    """The one line names the method's hook that raised and the line of the user's file, not only
    the round and client (the traceback stays in error.log)."""
    path = tmp_path / "badhooks.py"
    path.write_text(BAD_HOOKS)
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = write_config(tmp_path / "c.yaml")
    for method, where in (("Raises", f"(in correct_gradient of {path}:11)"),
                          ("Deeper", f"(in correct_gradient, at {path}:6 in scale)")):
        proc = run_cli(["train", cfg, f"output.dir={tmp_path / method}", f"algorithm.name=badhooks:{method}"])
        assert proc.returncode == 1, proc.stderr
        errors = [x for x in proc.stderr.splitlines() if x.startswith("distfl: error:")]
        assert len(errors) == 1 and errors[0].startswith("distfl: error: round 1, local training of client "), proc.stderr
        assert where in errors[0], errors[0]


# Round 2 marks its start, then waits (up to 60 s) for the Ctrl-Cs; each stop request is marked.
SITE_WAIT_IN_ROUND_2 = """
import os
if "CTRL_C_MARKS" in os.environ:
    import time
    from pathlib import Path
    from distfl.federation import runner

    marks = Path(os.environ["CTRL_C_MARKS"])
    _run_round, _request_stop = runner.Trainer.run_round, runner.Trainer.request_stop

    def run_round(self, round_idx):
        if round_idx == 2:
            (marks / "round2").touch()
            time.sleep(60)
        return _run_round(self, round_idx)

    def request_stop(self, *reason):
        (marks / "stop").touch()
        _request_stop(self, *reason)

    runner.Trainer.run_round, runner.Trainer.request_stop = run_round, request_stop
"""


def test_a_second_ctrl_c_exits_130_with_a_line(tmp_path, small_config):
    """The first Ctrl-C asks for a checkpoint after the round; a second one stops at once: exit 130
    and one line saying so and what --resume will do."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from conftest import REPO, env_with_sitecustomize

    run, marks = tmp_path / "run", tmp_path / "marks"
    marks.mkdir()
    env = env_with_sitecustomize(tmp_path, SITE_WAIT_IN_ROUND_2, CTRL_C_MARKS=str(marks))
    proc = subprocess.Popen([sys.executable, "-m", "distfl", "train", str(small_config), f"output.dir={run}",
                             "checkpoint.every=1"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)

    def wait_for(name):
        deadline = time.time() + 120  # a guard against a hang, not a measured bound
        while not (marks / name).exists() and time.time() < deadline and proc.poll() is None:
            time.sleep(0.05)

    wait_for("round2")
    os.kill(proc.pid, signal.SIGINT)
    wait_for("stop")
    os.kill(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert (f"distfl: stopped at once by a second Ctrl-C, without a checkpoint of the round in progress; "
            f"`distfl train --resume {run}` continues from its last checkpoint, {run / 'checkpoints' / 'round_000001'}"
            ) in err.splitlines()


def test_a_config_warning_is_one_line_without_a_source_location(tmp_path, small_config):
    """A key the run ignores: one `distfl: warning:` line about the config; no file and line of distfl
    (Python's default shows `/.../distfl/cli.py:50: ConfigWarning: ...` and the source line under it)."""
    proc = run_cli(["train", small_config, "algorithm.mu=0.1", "--print-config"], subprocess_=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == ["distfl: warning: algorithm.mu is set but only used by algorithm.name in "
                                        "[fedprox]; it is ignored for fedavg"]


GIB = 2**30


def fake_host(tmp_path, cgroup_line: str, files: dict) -> tuple:
    """A /proc with 100 GiB MemAvailable and this process in `cgroup_line`, and a cgroup tree of `files`."""
    proc, root = tmp_path / "proc", tmp_path / "cgroup"
    (proc / "self").mkdir(parents=True)
    (proc / "meminfo").write_text(f"MemTotal: {200 * GIB // 1024} kB\nMemAvailable: {100 * GIB // 1024} kB\n")
    (proc / "self" / "cgroup").write_text(cgroup_line + "\n")
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return proc, root


def test_available_memory_respects_the_cgroup_limit(tmp_path):
    """A job's memory cgroup (a container, Slurm) may allow far less than the host has free: v2 memory.max
    and v1 memory.limit_in_bytes count, less what the cgroup uses beyond reclaimable page cache."""
    from distfl.federation.state import available_host_memory

    v2 = fake_host(tmp_path / "v2", "0::/job", {"job/memory.max": f"{8 * GIB}\n", "job/memory.current": f"{3 * GIB}\n",
                                                 "job/memory.stat": f"anon 1\ninactive_file {GIB}\n"})
    assert available_host_memory(*v2) == 6 * GIB
    v1 = fake_host(tmp_path / "v1", "4:memory:/slurm/job1", {
        "memory/slurm/job1/memory.limit_in_bytes": f"{4 * GIB}\n", "memory/slurm/job1/memory.usage_in_bytes": f"{GIB}\n"})
    assert available_host_memory(*v1) == 3 * GIB
    unlimited = fake_host(tmp_path / "none", "0::/", {"memory.max": "max\n", "memory.current": f"{GIB}\n"})
    assert available_host_memory(*unlimited) == 100 * GIB


def test_the_memory_check_counts_every_rank_on_the_host(tmp_path, monkeypatch):
    """10 GiB of client state per rank fits in half of 30 GiB once, not twice: two ranks on one host
    are refused, with the launcher's count of local ranks (LOCAL_WORLD_SIZE) as the default."""
    import pytest
    import torch

    from distfl.errors import ConfigError
    from distfl.federation.state import ClientStateStore

    example = {"c": torch.empty(GIB // 4, dtype=torch.float32, device="meta")}  # 1 GiB a client
    ClientStateStore("memory", tmp_path, torch.device("cpu")).place(example, 10, host_free=30 * GIB, ranks_here=1)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    with pytest.raises(ConfigError) as refused:
        ClientStateStore("memory", tmp_path, torch.device("cpu")).place(example, 10, host_free=30 * GIB)
    assert ("per-client state would take 20.00 GiB of host memory (10.00 GiB for 10 clients on each of the 2 ranks "
            "on this host), more than half the 30.00 GiB of available memory; use runtime.client_state=disk") \
        in str(refused.value)


def test_output_to_a_closed_pipe_does_not_stop_training(tmp_path, small_config):
    """`distfl train ... | head -1`: once the reader is gone, the run still trains to its end, completed."""
    import os
    import subprocess
    import sys

    from conftest import REPO

    run = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    # Every line (the start line on stderr, a progress line each round, the result on stdout) into a pipe
    # that `head -1` closes after the first.
    command = (f"{sys.executable} -m distfl train {small_config} output.dir={run} output.progress=log "
               f"eval.every=1 2>&1 | head -1; echo \"status ${{PIPESTATUS[0]}}\"")
    proc = subprocess.run(["bash", "-c", command], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.stdout.strip().endswith("status 0"), proc.stdout + proc.stderr
    s = summary(run)
    assert s["status"] == "completed" and s["rounds"] == 6 and not (run / "error.log").exists()


def test_command_line_mistakes_are_one_line(tmp_path):
    """argparse's refusals print the usage first (two to six lines): one line, naming the --help to read."""
    for args, says in ((["train", "--bogus"], "distfl: error: unrecognized arguments: --bogus"),
                       (["data", "prepare", "leaf", "--from", str(tmp_path)],
                        "distfl data: error: the following arguments are required: --out"),
                       (["train", "c.yaml", "--nproc", "two"], "distfl train: error: argument --nproc: invalid int")):
        proc = run_cli(args, subprocess_=True)
        assert proc.returncode == 2 and proc.stderr.startswith(says) and len(proc.stderr.splitlines()) == 1, proc.stderr

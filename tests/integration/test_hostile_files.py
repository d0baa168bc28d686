"""Files built to hurt the reader: pickles whose shared references expand past any size, files nested past
any depth, numbers past float's range; each refused in one short line naming the file, before any work."""
from __future__ import annotations

import json
import pickle
import subprocess
import sys

import pytest

from conftest import REPO, assert_refused, write_config
from distfl.errors import ConfigError
from distfl.plain_pickle import MAX_DEPTH, brief
from distfl.system import traces


def _shared(levels: int = 30):
    """200 bytes of pickle, 2^levels leaves to whoever walks it."""
    s = [0]
    for _ in range(levels):
        s = [s, s]
    return s


@pytest.mark.parametrize("data, says", [
    (_shared(), "it shares values so that a walk of it reaches more than"),
    ({1: {"computation": _shared(20), "communication": 1.0}}, "it shares values so that a walk of it reaches more than"),
    ({1: {"computation": _shared(), "communication": 1.0}}, f"values nest deeper than {MAX_DEPTH} levels"),
])
def test_a_pickle_of_shared_references_is_refused_promptly_in_one_line(tmp_path, data, says):
    """`s = [0]` then 30 times `s = [s, s]` loads in microseconds and prints 2^30 leaves: refused, in a
    fresh process bounded by a hang guard (never reached unless it hangs)."""
    path = tmp_path / "capacity"
    path.write_bytes(pickle.dumps(data))
    assert path.stat().st_size < 500
    proc = subprocess.run([sys.executable, "-c", "import sys; from distfl.system import traces; "
                           f"traces.read_capacity({str(path)!r})"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    line = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 1 and line.startswith(f"distfl.errors.ConfigError: {path} was refused as a FedScale "
                                                    f"trace: ") and says in line and len(line) < 400, proc.stderr


def test_a_trace_file_of_shared_references_is_refused_by_distfl_train(tmp_path):
    (tmp_path / "capacity").write_bytes(pickle.dumps(_shared()))
    assert_refused(write_config(tmp_path / "c.yaml"), tmp_path / "run", [f"system.capacity_file={tmp_path / 'capacity'}"],
                   f"{tmp_path / 'capacity'} was refused as a FedScale trace: it shares values")


def test_deep_nesting_and_cycles_are_refused(tmp_path):
    deep = 0
    for _ in range(MAX_DEPTH + 1):
        deep = [deep]
    says = f"values nest deeper than {MAX_DEPTH} levels"
    for name, raw in (("deep.pkl", pickle.dumps({1: deep})), ("deep.json", json.dumps({"1": deep}).encode()),
                      ("deeper.json", b'{"1": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")):
        (tmp_path / name).write_bytes(raw)
        with pytest.raises(ConfigError, match=f"{tmp_path / name} was refused as a FedScale trace: {says}"):
            traces.read_capacity(str(tmp_path / name))
    cycle = []
    cycle.append(cycle)
    (tmp_path / "cycle").write_bytes(pickle.dumps({1: cycle}))
    with pytest.raises(ConfigError, match="a container holds itself"):
        traces.read_capacity(str(tmp_path / "cycle"))


@pytest.mark.parametrize("entry, says", [
    ({"computation": 10**400, "communication": 1.0}, "entry '1' computation must be a finite number, got 1000"),
    ({"computation": list(range(100_000)), "communication": 1.0}, "entry '1' computation must be a finite number"),
    ({"computation": "x" * 100_000, "communication": 1.0}, "entry '1' computation must be a finite number"),
])
def test_a_bad_capacity_entry_is_one_short_line(tmp_path, entry, says):
    """Python's JSON reads 10**400 as an int (float() of it overflows); a long value is cut short."""
    path = tmp_path / "capacity.json"
    path.write_text(json.dumps({"1": entry}))
    with pytest.raises(ConfigError, match=".*") as info:
        traces.read_capacity(str(path))
    assert str(info.value).startswith(f"{path}: {says}") and len(str(info.value)) < 300


def test_brief_cuts_values_short():
    assert len(brief(_shared())) < 100 and len(brief("x" * 10**6)) < 100 and brief({"a": 1}) == "{'a': 1}"


def test_lognormal_values_that_reach_zero_or_inf_are_refused(tmp_path):
    """exp(1e308 + 1e308 z) is inf or 0 for every client: a zero bandwidth divided by zero at round 1."""
    assert_refused(write_config(tmp_path / "c.yaml"), tmp_path / "run", ["system.upload_bandwidth=lognormal:1e308,1e308"],
                   "system.upload_bandwidth must be constant:V")
    assert_refused(write_config(tmp_path / "c.yaml"), tmp_path / "run", ["system.speed=lognormal:0,80"],
                   "(lognormal: |MU| + 9 SIGMA <= 700")

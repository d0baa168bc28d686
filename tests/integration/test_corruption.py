"""One damaged file never costs the run: with checkpoint.keep=2, a byte flipped in any single file of a
run directory leaves a checkpoint to resume from, and the resumed run is exact (the same model and
metrics, row for row, as the run that never stopped). Each kept checkpoint holds its own copy of every
client file, never a hard link shared with client_state/ or another checkpoint (docs/checkpoints.md)."""
from __future__ import annotations

import hashlib
import json
import subprocess

import pytest

from conftest import metrics, run_cli, summary, train_ok, write_config

# SCAFFOLD keeps a state file per client, on disk: client_state/<id>.pt and clients/<id>.pt in each checkpoint.
ARGS = ["algorithm.name=scaffold", "runtime.client_state=disk", "checkpoint.every=1", "checkpoint.keep=2"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """6 rounds through, and the same run stopped after round 4 (checkpoints round 3 and 4 kept)."""
    root = tmp_path_factory.mktemp("damage")
    cfg = write_config(root / "small.yaml")
    through = train_ok(cfg, f"output.dir={root / 'through'}", *ARGS)
    train_ok(cfg, f"output.dir={root / 'stopped'}", *ARGS, "train.rounds=4")
    return {"through": through, "through_rows": metrics(root / "through"), "stopped": root / "stopped"}


def shared_client(run) -> str:
    """A client file that rounds 3 and 4 both hold with the same bytes (a client not trained in round 4):
    the file that hard links would make one for both checkpoints and client_state/."""
    files = [json.loads((run / "checkpoints" / name / "manifest.json").read_text())["files"]
             for name in ("round_000003", "round_000004")]
    same = sorted(n for n, digest in files[0].items() if n.startswith("clients/") and files[1].get(n) == digest)
    assert same, files
    return same[0]


FILES = {
    "model and run state of the newest checkpoint": lambda run: "checkpoints/round_000004/state.pt",
    "model and run state of the older checkpoint": lambda run: "checkpoints/round_000003/state.pt",
    "manifest of the newest checkpoint": lambda run: "checkpoints/round_000004/manifest.json",
    "manifest of the older checkpoint": lambda run: "checkpoints/round_000003/manifest.json",
    "client file both checkpoints hold unchanged, in the newest": lambda run: f"checkpoints/round_000004/{shared_client(run)}",
    "client file both checkpoints hold unchanged, in the older": lambda run: f"checkpoints/round_000003/{shared_client(run)}",
    "the same client's file in client_state/": lambda run: f"client_state/{shared_client(run).split('/')[1]}",
    "metrics copy in the newest checkpoint": lambda run: "checkpoints/round_000004/metrics.jsonl",
    "metrics.jsonl": lambda run: "metrics.jsonl",
    "summary.json": lambda run: "summary.json",
    "checkpoints/latest": lambda run: "checkpoints/latest",
}


def copy(src, dst):
    """`cp -a`: hard links within the run directory stay hard links."""
    subprocess.run(["cp", "-a", str(src), str(dst)], check=True)
    return dst


def middle(data: bytearray) -> int:
    """The byte to flip: the middle one; in a metrics file, a digit of round 2's train_loss (a flip
    elsewhere may change only a timing)."""
    if not data.startswith(b'{"round": 1'):
        return len(data) // 2
    second = data.index(b'{"round": 2')
    return data.index(b'"train_loss": ', second) + len(b'"train_loss": ') + 3


@pytest.mark.parametrize("where", list(FILES))
def test_a_byte_flipped_in_any_one_file_still_resumes_exactly(runs, tmp_path, where):
    run = copy(runs["stopped"], tmp_path / "run")
    path = run / FILES[where](run)
    data = bytearray(path.read_bytes())
    data[middle(data)] ^= 1
    with open(path, "r+b") as f:  # in place, as a disk error would: every hard link to it sees the change
        f.write(data)

    proc = run_cli(["train", "--resume", str(run), "train.rounds=6"])
    assert proc.returncode == 0, proc.stderr
    assert summary(run)["model_sha256"] == runs["through"]["model_sha256"]
    keys = ("round", "train_loss")  # test_acc: the stopped run evaluated its last round, 4
    assert [[r.get(k) for k in keys] for r in metrics(run)] == [[r.get(k) for k in keys] for r in runs["through_rows"]]


def test_checkpoints_hold_client_files_of_their_own(runs):
    """No file of a checkpoint is a hard link (to client_state/ or to another checkpoint)."""
    linked = [str(p) for p in runs["stopped"].rglob("*") if p.is_file() and p.stat().st_nlink > 1]
    assert linked == []


def test_a_deleted_metrics_file_is_restored_from_the_checkpoint(runs, tmp_path):
    """--resume with metrics.jsonl deleted: the history up to the checkpoint comes back from its copy,
    said in one line, so the file still starts at round 1."""
    run = copy(runs["stopped"], tmp_path / "run")
    (run / "metrics.jsonl").unlink()
    proc = run_cli(["train", "--resume", str(run), "train.rounds=6"])
    assert proc.returncode == 0, proc.stderr
    assert (f"{run / 'metrics.jsonl'} was missing: its 4 rows up to checkpoint round_000004 are restored from "
            "the checkpoint's copy") in proc.stderr
    assert [r["round"] for r in metrics(run)] == [1, 2, 3, 4, 5, 6]
    assert [r["train_loss"] for r in metrics(run)] == [r["train_loss"] for r in runs["through_rows"]]


def test_a_byte_flipped_in_a_secret_noise_key_falls_back_to_the_older_checkpoint(tmp_path):
    """privacy.secure_noise writes its key into each checkpoint (noise_key, named in the manifest, checked by
    its own check line): one flipped byte there leaves the older checkpoint, whose key is the same, and the
    run resumes exactly as an undamaged copy of it does (another key would give other noise: another model)."""
    cfg = write_config(tmp_path / "small.yaml")
    private = ["privacy.mechanism=gaussian", "privacy.delta=1e-3", "algorithm.weighting=uniform",
               "privacy.secure_noise=true", "privacy.noise_multiplier=0.8", "privacy.clip_norm=0.3",
               "checkpoint.every=1", "checkpoint.keep=2"]
    train_ok(cfg, f"output.dir={tmp_path / 'stopped'}", *private, "train.rounds=4")
    clean, damaged = copy(tmp_path / "stopped", tmp_path / "clean"), copy(tmp_path / "stopped", tmp_path / "damaged")
    key = damaged / "checkpoints" / "round_000004" / "noise_key"
    data = bytearray(key.read_bytes())
    data[5] = ord("0") if data[5] != ord("0") else ord("1")  # still a hex digit: only the check line can tell
    key.write_bytes(bytes(data))
    for run in (clean, damaged):
        proc = run_cli(["train", "--resume", str(run), "train.rounds=6"])
        assert proc.returncode == 0, proc.stderr
    assert "round_000004" in proc.stderr and "noise_key" in proc.stderr
    assert summary(damaged)["model_sha256"] == summary(clean)["model_sha256"]


def test_the_manifest_holds_no_hash_of_the_secret_noise_key_and_older_checkpoints_still_resume(tmp_path):
    """A secret key's SHA-256 beside it would let anyone who reads the manifest test guesses of the key: the
    manifest names noise_key without a hash. A checkpoint of an earlier distfl (the key file one line, its
    SHA-256 under the manifest's files) resumes to the same model as today's."""
    cfg = write_config(tmp_path / "small.yaml")
    private = ["privacy.mechanism=gaussian", "privacy.delta=1e-3", "algorithm.weighting=uniform",
               "privacy.secure_noise=true", "privacy.noise_multiplier=0.8", "privacy.clip_norm=0.3",
               "checkpoint.every=1", "checkpoint.keep=2"]
    train_ok(cfg, f"output.dir={tmp_path / 'stopped'}", *private, "train.rounds=4")
    ckpt = tmp_path / "stopped" / "checkpoints" / "round_000004"
    text = (ckpt / "manifest.json").read_text()
    key_file = (ckpt / "noise_key").read_bytes()
    key = key_file.decode().split("\n")[0]
    manifest = json.loads(text)
    assert manifest["secret"] == ["noise_key"] and "noise_key" not in manifest["files"]
    for digest in (hashlib.sha256(key_file).hexdigest(), hashlib.sha256(key.encode()).hexdigest(),
                   hashlib.sha256(f"{key}\n".encode()).hexdigest()):
        assert digest not in text and digest[:16] not in text
    old, new = copy(tmp_path / "stopped", tmp_path / "old"), copy(tmp_path / "stopped", tmp_path / "new")
    for path in (old / "checkpoints").glob("round_*"):  # as an earlier distfl wrote them
        (path / "noise_key").write_text(f"{key}\n")
        manifest = json.loads((path / "manifest.json").read_text())
        del manifest["secret"]
        manifest["files"]["noise_key"] = hashlib.sha256(f"{key}\n".encode()).hexdigest()
        (path / "manifest.json").write_text(json.dumps(manifest))
    for run in (old, new):
        proc = run_cli(["train", "--resume", str(run), "train.rounds=6"])
        assert proc.returncode == 0, proc.stderr
        assert "skipped" not in proc.stderr
    assert summary(old)["model_sha256"] == summary(new)["model_sha256"]

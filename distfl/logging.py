"""What a run writes (rank 0 only): metrics.jsonl, TensorBoard scalars, a progress display.

metrics.jsonl has one JSON object per round, with `round` first. On resume, rows after the checkpoint's
round are dropped (they are recomputed), so the file never holds a round twice; TensorBoard does the
same through `purge_step`. At the end of a run, its flattened config and final metrics go to TensorBoard's
HParams plugin, so the runs of a sweep can be compared in the HParams view.
"""
from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

from .checkpoint import atomic_write_text
from .config import flatten_dict
from .errors import CheckpointError
from .faults import writing

# metrics.jsonl key -> TensorBoard tag
TB_TAGS = {
    "test_acc": "test/accuracy",
    "test_loss": "test/loss",
    "client_acc_mean": "test/client_acc_mean",
    "client_acc_std": "test/client_acc_std",
    "client_acc_min": "test/client_acc_min",
    "client_acc_p10": "test/client_acc_p10",
    "client_acc_weighted_mean": "test/client_acc_weighted_mean",
    "clients_never_sampled": "test/clients_never_sampled",
    "train_loss": "train/loss",
    "round_s": "time/round_s",
    "samples_per_s": "time/samples_per_s",
    "bytes_reduced": "comm/bytes_reduced",
    "privacy_epsilon": "privacy/epsilon",
    "privacy_clip_norm": "privacy/clip_norm",
    "privacy_unclipped_fraction": "privacy/unclipped_fraction",
}


class RunLogger:
    def __init__(self, run_dir: Path, output_cfg, is_main: bool, start_round: int, total_rounds: int,
                 resume_step: int | None = None):
        """`resume_step`: rows after this step are dropped (default: start_round - 1)."""
        self.active = is_main
        self.total = total_rounds
        self.start = start_round
        self.t0 = time.time()
        self.mode = output_cfg.progress
        if self.mode == "auto":
            self.mode = "bar" if sys.stderr.isatty() else "log"
        self.last_eval = ""
        self.writer = None
        if not self.active:
            return
        self.metrics_path = Path(run_dir) / "metrics.jsonl"
        self.tb_dir = Path(run_dir) / "tb"
        resume_step = start_round - 1 if resume_step is None else resume_step
        self._truncate_after(resume_step)
        self.metrics_file = open(self.metrics_path, "a")
        if output_cfg.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            _quiet_tensorboard_thread()
            with writing(self.tb_dir):
                self.writer = SummaryWriter(str(self.tb_dir), purge_step=resume_step + 1)

    def _truncate_after(self, last_round: int) -> None:
        if not self.metrics_path.exists():
            return
        lines = [line for line in self.metrics_path.read_text().splitlines() if line.strip()]
        rows = []
        for number, line in enumerate(lines, 1):
            try:
                row = json.loads(line)
            except ValueError:
                if number == len(lines):  # a kill cut the last write short; that round is recomputed
                    break
                raise CheckpointError(f"{self.metrics_path} line {number} is not JSON: {line[:80]!r}; "
                                      "repair or remove that line to resume") from None
            if row["round"] <= last_round:
                rows.append(line)
        atomic_write_text("".join(row + "\n" for row in rows), self.metrics_path)

    def log_round(self, row: dict, extra_scalars: dict | None = None) -> None:
        if not self.active:
            return
        self._write_row(row)
        with writing(self.tb_dir):
            if self.writer is not None:
                for key, value in {**row, **(extra_scalars or {})}.items():
                    if key != "round" and isinstance(value, (int, float)):
                        self.writer.add_scalar(TB_TAGS.get(key, key), value, row["round"])
        if "test_acc" in row:
            self.last_eval = f"acc {100 * row['test_acc']:.2f}% (round {row['round']})"
            if "client_acc_mean" in row:
                self.last_eval += f", clients {100 * row['client_acc_mean']:.2f}% mean"
        self._progress(row)

    def log_phase(self, row: dict) -> None:
        """A row from a phase after training (e.g. calibration): `round` is its checkpoint step and
        `phase` its name; written to metrics.jsonl and TensorBoard, announced on stderr."""
        if not self.active:
            return
        self._write_row(row)
        if self.writer is not None:
            for key, value in row.items():
                if key != "round" and isinstance(value, (int, float)) and not isinstance(value, bool):
                    self.writer.add_scalar(f"{row['phase']}/{key}", value, row["round"])

    def _write_row(self, row: dict) -> None:
        with writing(self.metrics_path):
            self.metrics_file.write(json.dumps(row) + "\n")
            self.metrics_file.flush()

    def log_hparams(self, config: dict, final: dict, step: int) -> None:
        """The run's config (dotted keys) and its final metrics (`hparams/<name>` scalars at `step`)."""
        if self.writer is None:
            return
        from torch.utils.tensorboard.summary import hparams

        values = {k: v if isinstance(v, (bool, int, float, str)) else str(v)
                  for k, v in flatten_dict(config).items()}
        metrics = {f"hparams/{k}": float(v) for k, v in final.items() if v is not None}
        writer = self.writer.file_writer  # the hparams summaries go into the run's own event file
        for summary in hparams(values, metrics):
            writer.add_summary(summary)
        for tag, value in metrics.items():
            self.writer.add_scalar(tag, value, step)

    def _progress(self, row: dict) -> None:
        t = row["round"]
        done = t - self.start + 1
        elapsed = time.time() - self.t0
        eta = elapsed / done * (self.total - t)
        loss = f"train loss {row['train_loss']:.4f}  " if "train_loss" in row else ""  # withheld under DP
        text = (f"round {t}/{self.total}  {loss}{self.last_eval}  "
                f"{row['round_s']:.2f}s/round  eta {_clock(eta)}")
        if self.mode == "bar":
            width = 24
            filled = int(width * t / self.total)
            sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {text}\033[K")
            if t == self.total:
                sys.stderr.write("\n")
            sys.stderr.flush()
        elif self.mode == "log" and ("test_acc" in row or t == self.total):
            print(text, file=sys.stderr, flush=True)

    def info(self, message: str) -> None:
        if self.active:
            if self.mode == "bar":
                sys.stderr.write("\r\033[K")
            print(message, file=sys.stderr, flush=True)

    def close(self) -> None:
        """Close both, and raise the first OSError (named) after trying both."""
        if self.active:
            try:
                with writing(self.metrics_path):
                    self.metrics_file.close()
            finally:
                if self.writer is not None:
                    with writing(self.tb_dir):
                        self.writer.close()


def _quiet_tensorboard_thread() -> None:
    """TensorBoard writes from a thread, which re-raises a failed write (a full disk) in the next call
    of ours; the thread's own dying print would put a traceback beside distfl's one line."""
    previous = threading.excepthook
    if getattr(previous, "distfl", False):
        return

    def hook(args):
        if not (type(args.thread).__module__.startswith("tensorboard.") and isinstance(args.exc_value, OSError)):
            previous(args)

    hook.distfl = True
    threading.excepthook = hook


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 60}m{seconds % 60:02d}s"

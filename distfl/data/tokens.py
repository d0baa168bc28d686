"""Next-token tasks: what a sample is, and how it is scored.

A next-token dataset holds int64 sequences: sample i is the input tokens `x[i]` (length L) and the
targets `y[i]` (length L, `y[i, t]` the token that follows `x[i, :t + 1]`), as TFF's Shakespeare and
StackOverflow pipelines cut them (data/tff_text.py). Token 0 is padding in every such dataset. A model
for them (models/base.py `TokenClassifier`) maps B x L tokens to B x L x V logits.

They are scored per token:

- loss: the cross-entropy of every target that is not padding, summed over the split and divided by the
  number of such targets (a client with more tokens weighs more, exactly as pooling its tokens would).
  TFF's baselines report the mean of each batch's loss weighted by the batch's sequences
  (keras_utils' `_WeightedMeanLossMetric`), so a value of theirs is not comparable to the last digit;
- accuracy: argmax predictions equal to the target, over the targets outside `TokenTask.unscored`, as
  TFF's `MaskedCategoricalAccuracy` counts them: padding always; for StackOverflow also the
  out-of-vocabulary and end-of-sentence tokens (TFF's `accuracy_without_out_of_vocab_or_end_of_sentence`;
  the beginning-of-sentence token is never a target).

The sums are exact: each batch adds its loss sum and its integer hit count, and the denominators are
integer token counts of the split (`token_counts`), so 1 or N ranks give the same value. Local training
steps on each batch's mean over its non-padding targets; the round's
`train_loss` averages those batch means weighted by the batch's sequences, like TFF's.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from distfl.errors import DataError
from distfl.data.parts import Parts

PAD = 0  # the padding token of every next-token dataset (TFF's pad = 0)


@dataclass(frozen=True)
class TokenTask:
    """The special tokens of a next-token dataset."""

    name: str
    unscored: tuple[int, ...] = (PAD,)  # targets left out of the accuracy (padding always among them)

    def to_json(self) -> dict:
        return {"name": self.name, "unscored": list(self.unscored)}

    @staticmethod
    def from_json(value: dict) -> "TokenTask":
        return TokenTask(str(value["name"]), tuple(int(t) for t in value["unscored"]))


def token_losses(logits: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(per-position cross-entropy with padding zeroed, the non-padding mask): logits B x L x V, y B x L.
    Written with gather, not `ignore_index`, so that torch.func can vectorise it over a pack of clients."""
    log_p = F.log_softmax(logits.float(), dim=-1)
    nll = -log_p.gather(-1, y.unsqueeze(-1)).squeeze(-1)
    kept = y != PAD
    return nll * kept, kept


def mean_token_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The training loss of a batch: the mean over its non-padding targets (0 for a batch of padding)."""
    nll, kept = token_losses(logits, y)
    return nll.sum() / kept.sum().clamp(min=1)


def scored(y: torch.Tensor, task: TokenTask) -> torch.Tensor:
    """The targets the accuracy counts."""
    return ~torch.isin(y, torch.tensor(task.unscored, dtype=y.dtype, device=y.device))


def batch_scores(model, logits: torch.Tensor, y: torch.Tensor, task: TokenTask | None):
    """(loss sum, correct predictions) of one evaluation batch. Without a token task: classification,
    one label a sample (logits B x K), the model's own loss (cross-entropy, or SphereFed's MSE)."""
    if task is None:
        return model.loss(logits, y, reduction="sum"), hits(logits, y, task)
    return token_losses(logits, y)[0].double().sum(), hits(logits, y, task)


def hits(logits: torch.Tensor, y: torch.Tensor, task: TokenTask | None) -> torch.Tensor:
    """Correct argmax predictions of a batch (of a next-token task: at its scored targets)."""
    if task is None:
        return (logits.argmax(1) == y).sum()
    return ((logits.argmax(-1) == y) & scored(y, task)).sum()


def token_counts(y: torch.Tensor, task: TokenTask | None) -> tuple[int, int]:
    """(targets the loss averages over, targets the accuracy counts) of a split or client: samples for
    classification, non-padding and scored tokens for a next-token task."""
    if task is None:
        return len(y), len(y)
    return int((y != PAD).sum()), int(scored(y, task).sum())


def client_token_counts(parts, train_y, task: TokenTask | None) -> np.ndarray:
    """int64 per client: the non-padding targets of its training samples (algorithm.weighting=tokens, the
    weights of TFF's StackOverflow baseline); one bincount over the samples, not a loop over clients."""
    if task is None:
        raise DataError("algorithm.weighting=tokens weighs clients by their target tokens, but the data is not a "
                        "next-token task (data.dataset=tff with Shakespeare or StackOverflow, or a folder prepared "
                        "from one); use algorithm.weighting=samples")
    per_sample = (torch.as_tensor(train_y) != PAD).sum(1).cpu().numpy()
    parts = Parts.of(parts)  # the population's own (no copy): clients end to end
    owner = np.repeat(np.arange(len(parts), dtype=np.int64), parts.sizes)
    return np.bincount(owner, weights=per_sample[parts.flat], minlength=len(parts)).astype(np.int64)

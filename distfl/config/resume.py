"""What may change when a run resumes, and how a saved run's config is read back.

A resumed run (`distfl train --resume`, a sweep point with a checkpoint) must finish as the run it
continues would have: only keys declared `resumable` (they do not alter the finished model) may change,
and a saved config that predates a key is read at the value it ran with (its `previous` default).
Keys of the phases after training (`resumable="phase"`: calibration.*, tct.*) may change until their
phase starts: calibrate a finished run (`distfl calibrate RUN_DIR`), or try other stage-2 settings on a
copy of a TCT run directory whose stage 1 is done. The runner refuses them once the phase has begun.
"""
from __future__ import annotations

from distfl.config.load import config_to_dict
from distfl.config.renamed import upgraded
from distfl.config.schema import KEYS, SECTIONS, Config
from distfl.config.values import flatten_dict


def _by_section(keys: list[str]) -> tuple[str, ...]:
    """`keys`, with a whole section written as "section." (the form the runner's checks match by prefix)."""
    out = []
    for key in keys:
        section = key.rpartition(".")[0]
        whole = section in SECTIONS and all(k in keys for k in KEYS if k.startswith(section + "."))
        name = f"{section}." if whole else key
        if name not in out:
            out.append(name)
    return tuple(out)


RESUMABLE_KEYS = _by_section([k for k, spec in KEYS.items() if spec.resumable])
PHASE_KEYS = _by_section([k for k, spec in KEYS.items() if spec.resumable == "phase"])
# Named in the runner's refusal: eval.* keys that may not change (a holdout split removes samples from
# the clients' training data); not resumable in their declarations.
HOLDOUT_KEYS = ("eval.client_split", "eval.client_holdout")
PREVIOUS_DEFAULTS = {k: spec.previous for k, spec in KEYS.items() if spec.previous is not None}


def saved_values(saved: dict) -> dict:
    """A saved run's config (nested, as in its config.yaml or checkpoint), flat, in today's keys (old
    names read as their new ones), with every key it predates at the value it ran with: today's
    default, or its `previous` one."""
    return {**flatten_dict(config_to_dict(Config())), **PREVIOUS_DEFAULTS, **flatten_dict(upgraded(saved))}


def predated_keys_hint(changed: list[str]) -> str:
    """For blockers that the saved run predates: the overrides that resume it as it ran ('' if none)."""
    keys = [k for k in changed if k in PREVIOUS_DEFAULTS]
    if not keys:
        return ""
    return (f" (the run predates {', '.join(keys)}; add "
            f"{' '.join(f'{k}={PREVIOUS_DEFAULTS[k]}' for k in keys)} to resume it as it ran)")


def resume_blockers(saved: dict, now: dict) -> list[str]:
    """Dotted keys whose values differ between two config dicts and may not change on resume."""
    saved, now = saved_values(saved), flatten_dict(now)
    # A cosine lr is a function of train.rounds: more rounds would change the lr of rounds already trained.
    fixed = ("train.rounds",) if "cosine" in (now["train.lr_schedule"], now["server.lr_schedule"]) else ()
    # privacy.target_epsilon calibrates the noise for train.rounds rounds: more rounds, other noise.
    fixed += ("train.rounds",) if now.get("privacy.target_epsilon", 0) > 0 else ()
    return [k for k in now if k != "output.dir" and saved.get(k) != now[k]
            and (k in fixed or k not in KEYS or not KEYS[k].resumable)]

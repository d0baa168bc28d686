"""Old import path of `distfl.config.resume` (what may change on resume), kept for code that imports it."""
from distfl.config.resume import (HOLDOUT_KEYS, PHASE_KEYS, PREVIOUS_DEFAULTS, RESUMABLE_KEYS, Blockers, predated_keys_hint,
                                  resume_blockers, saved_run_config, saved_values, with_previous_defaults)

__all__ = ["HOLDOUT_KEYS", "PHASE_KEYS", "PREVIOUS_DEFAULTS", "RESUMABLE_KEYS", "Blockers", "predated_keys_hint",
           "resume_blockers", "saved_run_config", "saved_values", "with_previous_defaults"]

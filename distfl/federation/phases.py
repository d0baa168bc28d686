"""Phases: the parts of a run that come after its training rounds.

A run is its training rounds, then its phases in order: SphereFed's FFC calibration
(`calibration.method: ffc`), TCT's stages. Each phase runs on every rank, uses the same exact
collectives as a round, and ends with a checkpoint labelled with its name, so a crash inside a phase
resumes at that phase without retraining (`distfl train --resume RUN_DIR`). A long phase may
checkpoint its own progress (`context.save_phase_checkpoint`) and find it again in
`context.state.phase_state` on resume.

The phases are the methods' own (algorithms/tct.py, algorithms/ffc.py); `distfl.algorithms.build_phases`
picks a run's. This module only defines what a phase is, so the federation layer never imports a method.
"""
from __future__ import annotations


class Phase:
    name = "phase"

    def run(self, context, logger) -> dict:
        """Do the phase's work on this rank; return a JSON-able result (goes into summary.json)."""
        raise NotImplementedError

    def restore(self, context) -> None:
        """Called on resume for a phase that already ran, after the checkpointed model is loaded:
        re-apply anything the phase changed that is not in the flat model (e.g. the model's head mode)."""

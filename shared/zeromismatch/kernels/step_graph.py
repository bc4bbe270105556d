"""The import path of ``kernels/capture/record_replay.py`` that outside code may still use."""

from .capture.record_replay import Guard, ReplayDiverged, StepGraph, capture, host_reads_for_checks

__all__ = ["Guard", "ReplayDiverged", "StepGraph", "capture", "host_reads_for_checks"]

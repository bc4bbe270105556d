"""The import path of ``kernels/capture/allowed_host_reads.py`` that outside code may still use."""

from .capture.allowed_host_reads import (
    host_reads_for_checks,
    host_reads_of_graph_constants,
    reading_for_checks,
)

__all__ = ["host_reads_for_checks", "host_reads_of_graph_constants", "reading_for_checks"]

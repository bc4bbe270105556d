"""Step graphs: one decode step's kernel calls recorded once and replayed (the CPU counterpart of the
CUDA graphs vLLM replays). The engine keys and drops them (``engine/step_graphs.py``).

- ``record_replay``: what a capture records, the ``StepGraph`` that replays it, and the ``Guard``
  that says when a graph has gone stale;
- ``ops_as_native_calls``: plain copies and fp32 adds recorded as native calls instead of torch ops;
- ``allowed_host_reads``: the host reads of tensor data a capture accepts (kernels mark their input
  checks with it).

This file imports nothing: the native kernels import ``allowed_host_reads``, and ``record_replay``
imports the native kernels."""

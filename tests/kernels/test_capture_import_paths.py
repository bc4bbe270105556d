"""The step-graph capture lives in ``kernels/capture/``; the module paths it had before still import
the same objects, for code outside the package that uses them."""

from __future__ import annotations

from zeromismatch.kernels import host_reads, replay_lowering, step_graph
from zeromismatch.kernels.capture import allowed_host_reads, ops_as_native_calls, record_replay


def test_old_module_paths_re_export_the_capture_package():
    for old, new in ((step_graph, record_replay), (replay_lowering, ops_as_native_calls),
                     (host_reads, allowed_host_reads)):  # fmt: skip
        assert old.__all__
        for name in old.__all__:
            assert getattr(old, name) is getattr(new, name), (old.__name__, name)

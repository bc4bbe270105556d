"""The import path of ``kernels/capture/ops_as_native_calls.py`` that outside code may still use."""

from .capture.ops_as_native_calls import NativeRecord, lowered, same_bytes

__all__ = ["NativeRecord", "lowered", "same_bytes"]

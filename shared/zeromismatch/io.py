"""Atomic file writes: a crash mid-write never leaves a half-written result or checkpoint.

:func:`directory_lock` holds an exclusive ``flock`` on a lock file in a directory, so two processes
never write the same run at once.

:func:`atomic_write_json` writes plain JSON values only. numpy scalars (and 0-d arrays) and 0-d
torch tensors become the Python number or bool they hold; anything else that JSON cannot hold
(a Path, a multi-element tensor, an object) is a TypeError naming its key path, raised before
anything is written -- never silently stored as its ``str()``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

LOCK_FILE = ".lock"  # hidden: the audit skips dot-names, and it is removed when the lock is released


class DirectoryLockedError(BlockingIOError):
    """Another process holds the directory's lock (the message names the directory and the holder)."""

    def __init__(self, message: str):
        super().__init__(errno.EWOULDBLOCK, message)

    def __str__(self) -> str:
        return self.strerror or ""


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temp file in the same directory + fsync + rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        # mkstemp creates 0600; results are meant to be read by others, as a plain open() would allow
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def check_directory_path(path: str | os.PathLike, option: str) -> None:
    """ValueError naming ``option`` when ``path`` cannot be (or be created as) a directory because it,
    or a parent of it, exists as something else, or because the nearest existing one is not writable:
    checked before any work, so a bad output path never fails only after the results were computed.
    Writability is tried, not read from mode bits (root, ACLs and read-only mounts defeat those): an
    unnamed temporary file is created there and removed at once; nothing else is touched."""
    if not str(path).strip():
        raise ValueError(f"{option} is empty; give a directory")
    path = Path(path)
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise ValueError(f"{option} {path}: {existing} exists and is not a directory")
    if existing is not None:
        try:
            tempfile.TemporaryFile(dir=existing).close()
        except OSError as err:
            raise ValueError(f"{option} {path}: cannot write in {existing} ({err.strerror})") from None


def check_file_path(path: str | os.PathLike, option: str) -> None:
    """As :func:`check_directory_path`, for a file to be written at ``path``."""
    if not str(path).strip():
        raise ValueError(f"{option} is empty; give a file name")
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{option} {path} is a directory; give a file name")
    check_directory_path(path.parent, option)


@contextlib.contextmanager
def directory_lock(directory: str | os.PathLike, what: str = "run", name: str = LOCK_FILE) -> Iterator[Path]:
    """Hold an exclusive, non-blocking ``flock`` on ``directory/<name>`` (default ``.lock``; creating the
    directory) until the block ends; :class:`DirectoryLockedError` at once when another process holds it.

    The lock file is removed on release, so a finished directory holds none. That is safe because a
    locker checks, once it holds the lock, that the file it locked is still the one at the path (a
    release may unlink it between another's open and flock) and retries otherwise. A killed holder's
    lock is released by the kernel; its stale file is simply locked again."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode("utf-8", "replace").strip() or "another process"
            os.close(fd)
            raise DirectoryLockedError(
                f"{directory} is in use by another {what} ({holder} holds {path}); wait for it to end "
                "or choose another directory"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # locked a file a releasing holder had just unlinked: lock the current one
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()}\n".encode())
        yield path
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # while still holding the lock: see the docstring
        os.close(fd)


def _where(at: str) -> str:
    return f"not JSON-serialisable at {at or '(top level)'}"


def _scalar(value: object, at: str) -> object:
    """The Python bool/int/float a numpy scalar or 0-d array/tensor holds; TypeError otherwise."""
    item = value.item()  # type: ignore[attr-defined]
    if isinstance(item, bool | int | float):
        return item
    raise TypeError(f"{_where(at)}: {type(value).__name__} holding {item!r}")


def _json_key(key: object, at: str) -> object:
    if key is None or isinstance(key, str | int | float | bool):
        return key
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(key, numpy.generic):
        return _scalar(key, at)
    raise TypeError(f"{_where(at)}: key {key!r} of type {type(key).__name__}")


def to_json_value(obj: object, at: str = "") -> object:
    """``obj`` with numpy/torch scalars replaced by the Python numbers they hold, checked to be JSON
    all the way down; ``at`` is the key path so far, e.g. ``metrics.loss[3]``."""
    if obj is None or isinstance(obj, str | bool | int | float):
        return obj
    if isinstance(obj, dict):
        out = {}
        for key, value in obj.items():
            name = _json_key(key, at)
            out[name] = to_json_value(value, f"{at}.{name}" if at else str(name))
        return out
    if isinstance(obj, list | tuple):
        return [to_json_value(value, f"{at}[{index}]") for index, value in enumerate(obj)]
    # only modules already imported can have made obj; importing torch here would cost seconds
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(obj, numpy.generic | numpy.ndarray):
        if isinstance(obj, numpy.ndarray) and obj.ndim != 0:
            raise TypeError(f"{_where(at)}: numpy array of shape {obj.shape}")
        return _scalar(obj, at)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        if obj.dim() != 0:
            raise TypeError(f"{_where(at)}: tensor of shape {tuple(obj.shape)}")
        return _scalar(obj, at)
    raise TypeError(f"{_where(at)}: {type(obj).__name__} {obj!r:.80}")


def atomic_write_json(path: str | os.PathLike, obj: object) -> None:
    """Write ``obj`` as indented, key-sorted JSON (see the module docstring for what it accepts)."""
    text = json.dumps(to_json_value(obj), indent=2, sort_keys=True)
    atomic_write_text(path, text + "\n")

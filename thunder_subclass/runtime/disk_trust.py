"""Stage 2 (per call), who may have written an on-disk cache entry: the checks ``thunder_subclass.runtime.disk_cache``
makes before it reads one.

In: the path of an entry about to be read, or of a directory about to be written. What happens: its ownership and
modes are checked (below). Out: None when it may be read, else the reason it may not.

A stored entry is Python source that is executed, and may hold pickled values: whoever can write it can run code in
every process that loads it. So the cache is private to the user who owns it:

* what the disk cache creates is private: directories ``0700`` (:func:`make_private_dirs`), entry files ``0600``
  (``tempfile.mkstemp``'s mode, renamed into place);
* before an entry is read, its file and every directory from the configured cache directory down to it must be
  owned by the current (effective) user and not writable by group or others (:func:`untrusted_reason`); otherwise it
  is neither executed nor unpickled: the call compiles as without the disk cache, with a
  :class:`~thunder_subclass.errors.DiskCacheWarning` saying why (once per path and process), and nothing is written
  into such a directory.

Assumption: the checks run on every load (``os.stat`` of the path's few components; no memo), so a directory made
writable by others after an entry was stored is caught at the next load. Directories above the configured cache
directory are the user's to choose (a ``$HOME`` or a private ``mkdtemp``). On platforms without POSIX user ids
(Windows) nothing is checked.
"""

from __future__ import annotations

import os
import pathlib
import stat

__all__ = ["make_private_dirs", "untrusted_reason"]


def _checks_owners() -> bool:
    return hasattr(os, "geteuid")


def untrusted_reason(path: pathlib.Path, base: pathlib.Path) -> str | None:
    """Why ``path`` (an entry file or a directory under ``base``, the configured cache directory) must not be trusted:
    it, or a directory from ``base`` down to it, is owned by another user or writable by group or others. None when
    all are private to the current user, or do not exist (nothing to read)."""
    if not _checks_owners():
        return None
    uid = os.geteuid()
    try:
        parts = path.relative_to(base).parts
    except ValueError:
        parts = ()
        base = path
    current = base
    for part in (None, *parts):
        if part is not None:
            current = current / part
        try:
            st = os.lstat(current)
        except FileNotFoundError:
            return None
        except OSError as e:
            return f"{current} cannot be inspected ({e})"
        kind = "directory" if stat.S_ISDIR(st.st_mode) else "file"
        if stat.S_ISLNK(st.st_mode):
            return f"{current} is a symbolic link"
        if st.st_uid != uid:
            return f"the {kind} {current} is owned by user id {st.st_uid}, not by this process's user ({uid})"
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return f"the {kind} {current} is writable by other users (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def make_private_dirs(directory: pathlib.Path) -> None:
    """Create ``directory`` and its missing parents with mode ``0700`` (whatever the umask)."""
    missing = []
    current = directory
    while not current.exists():
        missing.append(current)
        if current.parent == current:
            break
        current = current.parent
    for d in reversed(missing):
        try:
            d.mkdir(mode=0o700)
        except FileExistsError:  # made meanwhile by another process
            continue
        os.chmod(d, 0o700)

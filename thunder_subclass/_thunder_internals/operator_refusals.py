"""thunder's torch operators refusing an argument that eager accepts.

Hook map: reads nothing of thunder's but the location of its operator definitions (``thunder/torch/``,
``thunder/clang/``, ``thunder/core/prims.py``, ``thunder/core/symbol.py``), to tell an error that one of them raised
about an argument from any other error.

thunder 0.2.6's operators refuse arguments eager accepts, with a ``RuntimeError``, ``NotImplementedError`` or
``TypeError`` raised while tracing: ``generator=`` (``bernoulli``, ``exponential_``: "generator is not None which is
currently unsupported"), ``out=`` ("got an unexpected keyword argument 'out'"), ``F.max_pool2d(return_indices=True)``,
``F.avg_pool2d(ceil_mode=True)`` ("{ceil_mode=} is not supported"), ``scatter_(reduce=...)``, ``clone(memory_format=
torch.channels_last)`` ("only preserve_format is currently supported"). torch.compile runs such programs; the graph
break logic (``thunder_subclass.runtime.graph_breaks``) runs the code eagerly instead when
:func:`refused_by_thunder_operator` says the error is one of these.
"""

from __future__ import annotations

import os
import re

__all__ = ["refused_by_thunder_operator"]

_REFUSAL = re.compile(r"not supported|unsupported|currently supported|unexpected keyword argument")
_THUNDER_ROOT: str | None = None


def _thunder_root() -> str:
    global _THUNDER_ROOT
    if _THUNDER_ROOT is None:
        import thunder

        _THUNDER_ROOT = os.path.dirname(os.path.abspath(thunder.__file__)) + os.sep
    return _THUNDER_ROOT


def _is_operator_definition(relative: str) -> bool:
    return relative.startswith(("torch" + os.sep, "clang" + os.sep)) or relative in (
        os.path.join("core", "prims.py"), os.path.join("core", "symbol.py"))


def refused_by_thunder_operator(exc: BaseException) -> bool:
    """``exc`` is a ``RuntimeError``, ``NotImplementedError`` or ``TypeError`` whose message says an argument is not
    supported, raised inside one of thunder's operator definitions (the frames from the innermost operator frame to
    where it was raised are all thunder's: an error of code that thunder's operators call back, or of the user's
    code, is not one)."""
    if not isinstance(exc, (RuntimeError, NotImplementedError, TypeError)) or not _REFUSAL.search(str(exc)):
        return False
    root = _thunder_root()
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        frames.append(os.path.abspath(tb.tb_frame.f_code.co_filename))
        tb = tb.tb_next
    for filename in reversed(frames):  # innermost first
        if not filename.startswith(root):
            return False
        if _is_operator_definition(filename[len(root):]):
            return True
    return False

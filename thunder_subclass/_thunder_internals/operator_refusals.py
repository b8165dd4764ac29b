"""thunder's torch operators refusing an argument that eager accepts.

Hook map: reads nothing of thunder's but the location of its operator definitions (``thunder/torch/``,
``thunder/clang/``, ``thunder/core/prims.py``, ``thunder/core/symbol.py``, and ``thunder/extend/__init__.py`` for
opaque operators), to tell an error that one of them raised about an argument from any other error.

thunder 0.2.6's operators refuse arguments eager accepts, with a ``RuntimeError``, ``NotImplementedError``,
``TypeError`` or ``ValueError`` raised while tracing: ``generator=`` (``bernoulli``, ``exponential_``: "generator is
not None which is currently unsupported"), ``out=`` ("got an unexpected keyword argument 'out'"),
``F.max_pool2d(return_indices=True)``, ``F.avg_pool2d(ceil_mode=True)`` ("{ceil_mode=} is not supported"),
``scatter_(reduce=...)``, ``clone(memory_format=torch.channels_last)`` ("only preserve_format is currently
supported"), an integer ``F.interpolate(scale_factor=2)`` ("expected to be a strictly positive floating point
number"), ``F.embedding(max_norm=...)``, ``Tensor.unfold`` (registered as ``F.unfold``'s meta), and a C function it
registers as an opaque operator but cannot name (``torch._VF.lstm`` / ``gru`` / ``rnn_tanh``, whose ``__module__`` is
None: ``KeyError: None`` in ``extend/__init__.py``; ``nn.LSTM``, ``nn.GRU``, ``nn.RNN``). torch.compile runs such
programs; the graph break logic (``thunder_subclass.runtime.graph_breaks``) runs the code eagerly instead when
:func:`refused_by_thunder_operator` says the error is one of these. Where eager raises too (a user's error that
thunder's operator found first), the eager run raises eager's own error.
"""

from __future__ import annotations

import os

__all__ = ["refused_by_thunder_operator"]

_KINDS = (RuntimeError, NotImplementedError, TypeError, ValueError, KeyError)
_THUNDER_ROOT: str | None = None


def _thunder_root() -> str:
    global _THUNDER_ROOT
    if _THUNDER_ROOT is None:
        import thunder

        _THUNDER_ROOT = os.path.dirname(os.path.abspath(thunder.__file__)) + os.sep
    return _THUNDER_ROOT


def _is_operator_definition(relative: str) -> bool:
    return relative.startswith(("torch" + os.sep, "clang" + os.sep)) or relative in (
        os.path.join("core", "prims.py"), os.path.join("core", "symbol.py"), os.path.join("extend", "__init__.py"))


def refused_by_thunder_operator(exc: BaseException) -> bool:
    """``exc`` is a ``RuntimeError``, ``NotImplementedError``, ``TypeError``, ``ValueError`` or ``KeyError`` raised inside one of
    thunder's operator definitions: the frames from the innermost operator frame to where it was raised are all
    thunder's (an error of code that thunder's operators call back, of the plugin, or of the user's code, is not
    one)."""
    if not isinstance(exc, _KINDS):
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

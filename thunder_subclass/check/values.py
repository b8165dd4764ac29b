"""Comparing what the checks produce: tensors and subclasses (type, outer metadata, inner tensors, context),
flatten contexts (equality as a cached trace's guard sees it, and their plain-value structure), and where in the
subclass's own source an exception came from.

In: tensors, subclass instances, contexts, exceptions. Out: ``None`` when two values agree, else a short text saying
how they differ; plain-value structures; ``file:line (code)`` of the frame that raised.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import re
import traceback
from typing import Any

import torch

__all__ = [
    "flatten", "is_subclass", "difference", "metadata_difference", "contexts_equal", "plain_structure",
    "raising_line", "tensors_in", "clone_inner",
]


def is_subclass(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and type(t) is not torch.Tensor and hasattr(type(t), "__tensor_flatten__")


def flatten(t: torch.Tensor) -> tuple[list[str], Any]:
    names, ctx = t.__tensor_flatten__()
    return list(names), ctx


def _type_name(t: torch.Tensor) -> str:
    from thunder_subclass._thunder_internals import is_fake_tensor

    return "Tensor" if is_fake_tensor(t) else type(t).__qualname__


_NESTED_INT = re.compile(r"\bj\d+\b")


def _sizes(sizes) -> tuple:
    """Sizes or strides with nested ints (the ragged size of jagged NestedTensors, ``j4``) as ``j``: two samples
    with equal lengths have different nested ints, which the checks compare as the same."""
    return tuple(_NESTED_INT.sub("j", str(s)) if isinstance(s, torch.SymInt) else s for s in sizes)


def _outer(t: torch.Tensor) -> dict:
    meta = {"type": _type_name(t), "size": _sizes(t.size()), "dtype": t.dtype, "device": t.device}
    try:
        meta["stride"] = _sizes(t.stride())
    except RuntimeError:  # layouts without strides
        pass
    return meta


def metadata_difference(got: torch.Tensor, expected: torch.Tensor, *, keys=("type", "size", "dtype", "device",
                                                                              "stride")) -> str | None:
    """How ``got``'s outer metadata differs from ``expected``'s, over ``keys``; None when it agrees."""
    g, e = _outer(got), _outer(expected)
    diffs = [f"{k} {g.get(k)} (expected {e.get(k)})" for k in keys if g.get(k) != e.get(k)]
    return ", ".join(diffs) or None


def _values_equal(a: torch.Tensor, b: torch.Tensor, exact: bool) -> bool:
    if a.numel() == 0:
        return True
    if a.dtype.is_floating_point and a.element_size() == 1:  # float8: compare the bits
        a, b = a.view(torch.uint8), b.view(torch.uint8)
    if a.dtype.is_floating_point or a.dtype.is_complex:
        if exact:
            return bool(torch.allclose(a, b, rtol=0, atol=0, equal_nan=True))
        try:
            torch.testing.assert_close(a, b, equal_nan=True, check_stride=False)
            return True
        except AssertionError:
            return False
    return bool(torch.equal(a, b))


def difference(got: Any, expected: Any, *, exact: bool = True, where: str = "the result",
               strides: bool = True, contexts: bool = True) -> str | None:
    """How ``got`` differs from ``expected`` (tensors, subclasses recursively with their contexts, tuples, lists,
    numbers); None when they agree. ``exact``: bitwise-equal values, else ``torch.testing.assert_close``'s
    tolerances. ``strides``, ``contexts``: compare strides and flatten contexts too."""
    keys = ("type", "size", "dtype", "device", "stride") if strides else ("type", "size", "dtype", "device")
    if isinstance(expected, (tuple, list)):
        if not isinstance(got, (tuple, list)) or len(got) != len(expected):
            return f"{where} is {type(got).__name__} of {len(got) if isinstance(got, (tuple, list)) else '-'} " \
                   f"(expected {type(expected).__name__} of {len(expected)})"
        for i, (g, e) in enumerate(zip(got, expected)):
            d = difference(g, e, exact=exact, where=f"{where}[{i}]", strides=strides)
            if d:
                return d
        return None
    if not isinstance(expected, torch.Tensor):
        return None if got == expected or (got != got and expected != expected) else \
            f"{where} is {got!r} (expected {expected!r})"
    if not isinstance(got, torch.Tensor):
        return f"{where} is a {type(got).__name__} (expected a {type(expected).__qualname__})"
    d = metadata_difference(got, expected, keys=keys)
    if d:
        return f"{where} has {d}"
    if is_subclass(expected):
        (gn, gc), (en, ec) = flatten(got), flatten(expected)
        if gn != en:
            return f"{where} has inner tensors {gn} (expected {en})"
        if contexts and not contexts_equal(type(expected), gc, ec):
            return f"{where} has flatten context {gc!r} (expected {ec!r})"
        for name in en:
            g, e = getattr(got, name), getattr(expected, name)
            if isinstance(e, torch.Tensor):
                d = difference(g, e, exact=exact, where=f"{where}.{name}", strides=strides, contexts=contexts)
                if d:
                    return d
        return None
    if expected.is_nested or got.is_nested:
        return None
    return None if _values_equal(got.detach(), expected.detach(), exact) else f"{where} has other values"


def contexts_equal(cls: type, a: Any, b: Any) -> bool:
    """Whether a trace guarded on context ``a`` accepts context ``b``: the class's ``__metadata_guard__`` when it has
    one, else ``==`` (an exception or a non-bool answer counts as unequal)."""
    guard = getattr(cls, "__metadata_guard__", None)
    try:
        result = guard(a, b) if guard is not None else (a == b)
        return bool(result) if isinstance(result, bool) else False
    except Exception:
        return False


_PLAIN = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device, torch.layout,
          torch.memory_format)


def plain_structure(v: Any, depth: int = 0) -> Any:
    """The plain values of ``v`` (numbers, strings, dtypes, enums, through tuples, lists, dicts, dataclasses and
    objects' attributes), with every other object reduced to its type: two contexts whose plain structures differ
    must compare unequal. Objects are not compared by ``repr`` (which may hold addresses)."""
    if depth > 6:
        return type(v).__qualname__
    if isinstance(v, _PLAIN) or isinstance(v, enum.Enum):
        return ("nan",) if isinstance(v, float) and v != v else v
    if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return str(v)
    if isinstance(v, torch.Size):
        return tuple(plain_structure(s, depth + 1) for s in v)
    if isinstance(v, (tuple, list)):
        return (type(v).__name__, tuple(plain_structure(x, depth + 1) for x in v))
    if isinstance(v, dict):
        return ("dict", tuple(sorted(((repr(k), plain_structure(x, depth + 1)) for k, x in v.items()))))
    if isinstance(v, torch.Tensor):
        return ("tensor", tuple(v.shape), v.dtype)
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return (type(v).__qualname__, tuple((f.name, plain_structure(getattr(v, f.name, None), depth + 1))
                                            for f in dataclasses.fields(v)))
    if type(v).__module__.startswith("torch.distributed"):  # meshes and process groups: by type
        return type(v).__qualname__
    attrs = getattr(v, "__dict__", None)
    if isinstance(attrs, dict) and not isinstance(v, type):
        return (type(v).__qualname__, tuple(sorted((k, plain_structure(x, depth + 1)) for k, x in attrs.items()
                                                   if not k.startswith("__"))))
    return type(v).__qualname__


def tensors_in(v: Any, depth: int = 0):
    """The tensors held by ``v`` directly or inside tuples, lists and dict values (two levels)."""
    if isinstance(v, torch.Tensor):
        yield v
    elif depth < 2 and isinstance(v, (tuple, list)):
        for x in v:
            yield from tensors_in(x, depth + 1)
    elif depth < 2 and isinstance(v, dict):
        for x in v.values():
            yield from tensors_in(x, depth + 1)


def clone_inner(t: torch.Tensor) -> dict[str, Any]:
    """Copies of ``t``'s inner tensors by name (recursively for nested subclasses), to see later whether an operation
    changed them."""
    names, _ = flatten(t)
    out = {}
    for name in names:
        v = getattr(t, name)
        if is_subclass(v):
            out[name] = clone_inner(v)
        elif isinstance(v, torch.Tensor):
            out[name] = v.detach().clone()
    return out


def changed_inner(t: torch.Tensor, before: dict[str, Any], prefix: str = "") -> str | None:
    """The first inner tensor of ``t`` whose values differ from the copy ``before`` (:func:`clone_inner`)."""
    for name, old in before.items():
        v = getattr(t, name, None)
        if isinstance(old, dict):
            d = changed_inner(v, old, f"{prefix}{name}.")
            if d:
                return d
        elif not isinstance(v, torch.Tensor) or v.shape != old.shape or not _values_equal(v.detach(), old, True):
            return prefix + name
    return None


def _is_library_file(filename: str, here: str) -> bool:
    """torch's, thunder's, this package's or the standard library's (not other installed packages')."""
    import thunder

    path = os.path.abspath(filename)
    libs = [os.path.dirname(m.__file__) + os.sep for m in (torch, thunder)] + [here]
    stdlib = os.path.dirname(os.__file__) + os.sep
    return path.startswith(tuple(libs)) or (path.startswith(stdlib) and "site-packages" not in path) \
        or filename.startswith("<")


def raising_line(exc: BaseException, cls: type | None = None) -> str | None:
    """``file:line (code)`` of the frame that raised ``exc`` in the subclass's own code: the innermost frame in the
    file that defines ``cls``, else the innermost frame outside torch, the standard library and this package."""
    frames = traceback.extract_tb(exc.__traceback__)
    own = None
    if cls is not None:
        import inspect

        try:
            own = inspect.getsourcefile(cls)
        except (TypeError, OSError):
            own = None
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    picked = [f for f in frames if own and os.path.abspath(f.filename) == os.path.abspath(own)]
    if not picked:
        picked = [f for f in frames if not _is_library_file(f.filename, here)]
    if not picked:
        return None
    f = picked[-1]
    return f"{f.filename}:{f.lineno} ({(f.line or '').strip()})"

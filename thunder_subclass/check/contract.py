"""The checks of the subclass contract that need no compilation: flatten, guards, fake and metadata.

In: samples of the subclass, the programs eager ran on them (:class:`~thunder_subclass.check.programs.Applied`) and
the report. What happens: the sample is flattened and rebuilt (also for a view's outer size and strides), its
contexts compared, it is rebuilt from fake inner tensors and the programs rerun on the fakes, and each eager result's
outer metadata is compared with the operation's on plain fake tensors of the sample's outer metadata.
Out: findings added to the report; each says what was expected, what happened and how to fix it.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from thunder_subclass._thunder_internals import (
    data_dependent_exception_types,
    fake_tensor_mode_class,
    has_value_symbols,
    is_opaque_reference_object,
    value_symbol_fake_mode,
)
from thunder_subclass.check.report import SubclassReport
from thunder_subclass.check.values import (
    contexts_equal,
    difference,
    flatten,
    is_subclass,
    metadata_difference,
    plain_structure,
    raising_line,
    tensors_in,
)

__all__ = ["check_flatten", "check_guards", "check_fake", "check_metadata", "context_equals_itself"]


def _attributes(t: torch.Tensor) -> dict[str, Any]:
    """The instance's own attributes (``__dict__`` and ``__slots__`` along the class's bases below torch.Tensor)."""
    attrs = dict(vars(t)) if hasattr(t, "__dict__") else {}
    for klass in type(t).__mro__:
        if klass is torch.Tensor:
            break
        slots = klass.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name not in attrs and hasattr(t, name):
                attrs[name] = getattr(t, name)
    return attrs


def check_flatten(report: SubclassReport, x: torch.Tensor) -> bool:
    """``__tensor_flatten__`` names attributes holding tensors (or opaque objects), names every tensor the instance
    holds, and ``__tensor_unflatten__`` rebuilds an equal instance (for the sample and for a view of it). Returns
    whether flatten and unflatten can be used by the later checks."""
    cls, name = type(x), type(x).__qualname__
    if not (hasattr(cls, "__tensor_flatten__") and hasattr(cls, "__tensor_unflatten__")):
        report.add("flatten", f"{name} has no __tensor_flatten__ / __tensor_unflatten__: compilers cannot take it "
                              "apart. Define __tensor_flatten__(self) -> (names of tensor attributes, context) and "
                              "@staticmethod __tensor_unflatten__(inner, ctx, outer_size, outer_stride).")
        return False
    try:
        names, ctx = flatten(x)
    except Exception as e:
        report.add("flatten", f"{name}.__tensor_flatten__ raised {type(e).__name__}: {e}; it must return "
                              "(list of attribute names, context).")
        return False
    usable = True
    named_ids = set()
    for attr in names:
        if not isinstance(attr, str) or not hasattr(x, attr):
            report.add("flatten", f"{name}.__tensor_flatten__ names {attr!r}, which is not an attribute of the "
                                  f"instance; name the attributes that hold its inner tensors.")
            usable = False
            continue
        v = getattr(x, attr)
        if isinstance(v, torch.Tensor):
            named_ids.add(id(v))
        elif not is_opaque_reference_object(v):
            report.add("flatten", f"{name}.__tensor_flatten__ names {attr!r}, which holds a {type(v).__name__} "
                                  f"({v!r:.60}), not a tensor: compilers treat every named attribute as an inner "
                                  f"tensor. Move {attr!r} into the context (the second value __tensor_flatten__ "
                                  f"returns) and read it back from ctx in __tensor_unflatten__.")
            usable = False
    for attr, v in _attributes(x).items():
        held = [t for t in tensors_in(v) if id(t) not in named_ids]
        if held:
            report.add("flatten", f"{name} holds a tensor in attribute {attr!r} that __tensor_flatten__ does not "
                                  f"name (it names {names}): a compiled program would not see it, or bake its "
                                  f"values into the trace. Add {attr!r} to the names __tensor_flatten__ returns and "
                                  f"pass inner[{attr!r}] to the constructor in __tensor_unflatten__.")
    if not usable:
        return False
    # a context unequal to itself is the guards check's finding; here it would hide whether the rest rebuilds
    contexts = contexts_equal(cls, ctx, flatten(x)[1])
    views = _views(x)
    for what, t in [("the sample", x), *views]:
        if not _round_trip(report, t, what, contexts):
            return False
    report.note("flatten", f"inner tensors {names}; rebuilt equal (the sample and {len(views)} view(s))")
    return True


def _views(x: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """Views of ``x`` of its own type whose outer size or strides differ from ``x``'s (where eager makes them)."""
    out = []
    for label, view in (("x.transpose(0, 1)", lambda t: t.transpose(0, 1)), ("x[:1]", lambda t: t[:1])):
        try:
            v = view(x)
        except Exception:
            continue
        if type(v) is type(x) and (tuple(v.shape) != tuple(x.shape) or v.stride() != x.stride()):
            out.append((f"the view {label}", v))
    return out


def _round_trip(report: SubclassReport, t: torch.Tensor, what: str, contexts: bool) -> bool:
    cls, name = type(t), type(t).__qualname__
    names, ctx = flatten(t)
    inner = {n: getattr(t, n) for n in names}
    try:
        rebuilt = cls.__tensor_unflatten__(inner, ctx, t.size(), t.stride())
    except Exception as e:
        report.add("flatten", f"{name}.__tensor_unflatten__(inner, ctx, outer_size, outer_stride) raised "
                              f"{type(e).__name__}: {e} rebuilding {what} (outer size {tuple(t.shape)}, stride "
                              f"{t.stride()}); it must rebuild the instance from exactly what __tensor_flatten__ "
                              f"returned.")
        return False
    d = difference(rebuilt, t, where=f"{name}.__tensor_unflatten__'s result", contexts=contexts)
    if d:
        hint = ("build the outer tensor with _make_wrapper_subclass(cls, outer_size, strides=outer_stride, ...) when "
                "they are given" if "size" in d or "stride" in d else
                "rebuild every inner tensor and the context as they were flattened")
        report.add("flatten", f"__tensor_unflatten__ must rebuild an equal {name} from __tensor_flatten__'s output "
                              f"for {what}; {d}. Fix: {hint}.")
        return False
    return True


def context_equals_itself(x: torch.Tensor) -> bool:
    """Whether two flattens of ``x`` give contexts that a cached trace's guard accepts as equal."""
    return contexts_equal(type(x), flatten(x)[1], flatten(x)[1])


def _same_outer(x: torch.Tensor, y: torch.Tensor) -> bool:
    return (x.shape, x.stride(), x.dtype, x.device) == (y.shape, y.stride(), y.dtype, y.device)


def check_guards(report: SubclassReport, make: Callable[[int], torch.Tensor], x: torch.Tensor) -> None:
    """Two flattens of one object give equal contexts (a cached trace is found again); contexts holding other plain
    values compare unequal (a trace made for one is not reused for the other); no tensor hides in the context."""
    cls, name = type(x), type(x).__qualname__
    (_, a), (_, b) = flatten(x), flatten(x)
    if list(tensors_in(a)):
        report.add("guards", f"{name}'s flatten context holds a tensor: a cached trace cannot guard on tensor values "
                             f"(and `==` on it is not a bool). Name that tensor in __tensor_flatten__ instead.")
        return
    if not contexts_equal(cls, a, b):
        how = "__metadata_guard__" if hasattr(cls, "__metadata_guard__") else "=="
        report.add("guards", f"two flattens of one {name} must give contexts that compare equal ({how}) so that a "
                             f"cached trace is found again; they compare unequal ({a!r} vs {b!r}), so every call "
                             f"traces anew. Fix: give the context's classes an __eq__ (a dataclass or a tuple of "
                             f"plain values), not identity.")
    others = {seed: make(seed) for seed in (1, 2)}
    for seed, other in others.items():
        if type(other) is not cls:
            report.add("guards", f"make_sample({seed}) gave a {type(other).__qualname__}, make_sample(0) a {name}; "
                                 f"make_sample must give the same type for every seed.")
            return
        c = flatten(other)[1]
        # (contexts that differ only with the outer metadata, which the tensor guards check anyway, may compare
        # equal: torch 2.10's DTensorSpec compares equal across global shapes)
        if plain_structure(c) != plain_structure(a) and contexts_equal(cls, a, c) and _same_outer(x, other):
            report.add("guards", f"contexts with other values must compare unequal, so that a trace made for one "
                                 f"is not reused for the other; {name}'s context of make_sample(0) ({a!r}) compares "
                                 f"equal to make_sample({seed})'s ({c!r}). Fix: compare every field that changes "
                                 f"results in __eq__ (or __metadata_guard__).")
            return
    varied = any(plain_structure(flatten(o)[1]) != plain_structure(a) for o in others.values())
    report.note("guards", "contexts equal for equal instances" + (
        ", unequal for other values" if varied else " (make_sample gives one context for seeds 0-2)"))


def _fake_of(mode: FakeTensorMode, t: torch.Tensor) -> torch.Tensor:
    names, ctx = flatten(t)
    inner = {}
    for n in names:
        v = getattr(t, n)
        inner[n] = (_fake_of(mode, v) if is_subclass(v) else mode.from_tensor(v, static_shapes=True)) \
            if isinstance(v, torch.Tensor) else v
    with mode:
        return type(t).__tensor_unflatten__(inner, ctx, t.size(), t.stride())


def _failure(e: BaseException, cls: type) -> str:
    line = raising_line(e, cls)
    where = f" at {line}" if line else ""
    if isinstance(e, data_dependent_exception_types()):
        return (f"reads tensor data as Python numbers{where} ({type(e).__name__}): fake tensors have no values. "
                f"Fix: keep the computation on tensors (no .item(), .tolist(), float(t), `if t:`), or keep the number "
                f"in the flatten context")
    return f"raised {type(e).__name__}: {str(e)[:300]}{where}"


def check_fake(report: SubclassReport, x: torch.Tensor, applied: list) -> set[str]:
    """The subclass builds from fake inner tensors, its dispatch runs on them, and fake results have the real
    results' metadata. Returns the names of the programs flagged (all when the subclass cannot be built on fakes)."""
    cls, name = type(x), type(x).__qualname__
    flagged = set()
    mode = fake_tensor_mode_class()(allow_non_fake_inputs=True)
    try:
        fake = _fake_of(mode, x)
    except Exception as e:
        report.add("fake", f"{name} must build from fake inner tensors (compilers trace with FakeTensorMode); "
                           f"__tensor_unflatten__ on fakes {_failure(e, cls)}.")
        return {a.program.name for a in applied}
    for a in applied:
        try:
            with mode:
                fake_x = _fake_of(mode, a.sample) if a.sample is not x else fake
                result = a.program(fake_x, *a.operands)
        except Exception as e:
            if isinstance(e, data_dependent_exception_types()) and _shape_depends_on_data(a):
                report.note("fake", f"{a.program.name}: its result's size depends on tensor values (as in eager)")
                continue
            report.add("fake", f"{a.program.name}: eager runs it on a {name}, but on a {name} of fake tensors its "
                               f"dispatch {_failure(e, cls)}.")
            flagged.add(a.program.name)
            continue
        d = _metadata_tree_difference(result, a.result)
        if d:
            report.add("fake", f"{a.program.name}: on fake tensors the result must have the real result's "
                               f"metadata; {d}. Fix: derive result metadata from the inner results' metadata, not "
                               f"from their values.")
            flagged.add(a.program.name)
    report.note("fake", f"built from fake inner tensors; {len(applied) - len(flagged)} of {len(applied)} programs "
                        f"ran on it with the real results' metadata")
    return flagged


def _shape_depends_on_data(a) -> bool:
    """Whether the program's result has a size that depends on tensor values: run on fakes whose values read as
    Python numbers are symbols (a ``ShapeEnv``), a result size holds such a symbol. Reading values is then what the
    operation needs (a jagged NestedTensor's ``x[0]`` reads its offsets), not a flaw of the subclass."""
    mode = value_symbol_fake_mode()
    try:
        with mode:
            result = a.program(_fake_of(mode, a.sample), *a.operands)
    except Exception:
        return False
    return any(has_value_symbols(t.shape) for t in tensors_in(result))


def _metadata_tree_difference(got: Any, expected: Any, where: str = "the result") -> str | None:
    if isinstance(expected, (tuple, list)):
        if not isinstance(got, (tuple, list)) or len(got) != len(expected):
            return f"{where} is a {type(got).__name__} (expected a {type(expected).__name__} of {len(expected)})"
        for i, (g, e) in enumerate(zip(got, expected)):
            d = _metadata_tree_difference(g, e, f"{where}[{i}]")
            if d:
                return d
        return None
    if isinstance(expected, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            return f"{where} is a {type(got).__name__} (expected a tensor)"
        d = metadata_difference(got, expected)
        if d:
            return f"{where} has {d}".replace("FakeTensor", "tensor")
        if is_subclass(expected) and is_subclass(got):
            for n in flatten(expected)[0]:
                e, g = getattr(expected, n), getattr(got, n, None)
                if isinstance(e, torch.Tensor):
                    d = _metadata_tree_difference(g, e, f"{where}.{n}")
                    if d:
                        return d
    return None


def _outer_fake(mode: FakeTensorMode, t: torch.Tensor) -> torch.Tensor:
    with mode:
        return torch.empty_strided(tuple(t.shape), t.stride(), dtype=t.dtype, device=t.device)


def check_metadata(report: SubclassReport, x: torch.Tensor, applied: list) -> set[str]:
    """Every result's outer size, dtype, stride and device equal what the operation gives on plain (fake) tensors of
    the inputs' outer metadata. Returns the names of the programs flagged."""
    name = type(x).__qualname__
    if x.is_nested:
        report.note("metadata", f"skipped: {name} is nested (no plain tensor has its outer size)")
        return set()
    flagged = set()
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    checked = 0
    for a in applied:
        try:
            with mode:
                expected = a.program(_outer_fake(mode, a.sample), *a.operands)
        except Exception:
            continue  # a program the plain operation does not define (the subclass adds it)
        checked += 1
        d = _plain_metadata_difference(a.result, expected)
        if d:
            report.add("metadata", f"{a.program.name}: a result's outer metadata must be what the operation gives "
                                   f"for inputs of the sample's outer size, dtype and strides; {d}. Fix: in "
                                   f"__torch_dispatch__, make the outer tensor with the size/strides/dtype of the "
                                   f"operation's result (e.g. from the inner result: _make_wrapper_subclass(cls, "
                                   f"out.shape, strides=out.stride(), dtype=...)), not the input's.")
            flagged.add(a.program.name)
    report.note("metadata", f"{checked} results compared with the operations' meta functions")
    return flagged


def _plain_metadata_difference(got: Any, expected: Any, where: str = "the result") -> str | None:
    if isinstance(expected, (tuple, list)) and isinstance(got, (tuple, list)) and len(got) == len(expected):
        for i, (g, e) in enumerate(zip(got, expected)):
            d = _plain_metadata_difference(g, e, f"{where}[{i}]")
            if d:
                return d
        return None
    if isinstance(expected, torch.Tensor) and isinstance(got, torch.Tensor):
        d = metadata_difference(got, expected, keys=("size", "dtype", "device", "stride"))
        return f"{where} has {d}" if d else None
    return None

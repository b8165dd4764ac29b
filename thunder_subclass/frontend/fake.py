"""Stage 4 (interpretation), fake tensors for tracing: a ``FakeTensorMode`` per thread and the two-way map between
proxies and fakes.

In: thunder proxies (plain and subclass). What happens: each proxy's metadata becomes a fake tensor of the
thread's mode, and each fake result gets a proxy. Out: fake tensors with the same metadata (subclass fakes are rebuilt
with ``__tensor_unflatten__`` on fake inner tensors), and proxies for fake results. Used by interpretation (running an
operation on fake subclass instances) and by the metas of aten-level symbols.

Symbolic sizes: under ``cache="symbolic values"`` a recording may give its :class:`FakeEnv` a
``_thunder_internals.ShapeSymbols``: fakes then get the symbols of the proxies' size numbers (contiguous strides in
them; an argument's flatten context that holds its outer size and strides, DTensor's ``TensorMeta``, gets them too:
:func:`context_template`), the run goes under that ShapeEnv's fake mode, and sizes of results map back to number
proxies (:meth:`FakeEnv.numbers`); a result whose context holds its sizes keeps a :class:`SizedContext`.

Known values: fakes of integer inputs (NJT offsets, 1-D int arguments) of fixed sizes, and aten results on those only,
know their values (:class:`ValueSource`): dispatch reads them, guarded by value (symbolic: ``frontend.jagged``).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable

import torch
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensorMode

import thunder.core.devices as devices
import thunder.core.dtypes as dtypes
from thunder.core.proxies import NumberProxy, Proxy, TensorProxy
from thunder.core.pytree import tree_flatten

from thunder_subclass._thunder_internals import (
    detach_dtensor,
    ShapeSymbols,
    SymbolicSizeError,
    fake_tensor_mode_class,
    is_interpreting,
    isolated_mask_buffers,
    own_mask_buffers,
    pin_numbers,
    registered_nested_int,
    set_fake_nested_int,
    tensor_producer,
    trace_wrote_integer_tensors,
    traced_autocast_states,
)
from thunder_subclass.errors import SubclassProtocolError
from thunder_subclass.frontend.jagged import fake_outer as jagged_fake_outer, is_jagged_inner
from thunder_subclass.frontend.proxy import (
    STRIDE_ATTR,
    STRIDES_LIKE_ATTR,
    OpaqueObjectProxy,
    SubclassTensorProxy,
    is_marked_leaf,
    nested_int_of,
    remember_nested_int,
    size_values,
)

_STRIDE_ATTR = STRIDE_ATTR
_STRIDE_GUARD_ATTR = "_thunder_subclass_stride_guard"

_per_thread = threading.local()


def fake_mode() -> FakeTensorMode:
    """This thread's FakeTensorMode, shared by the traces the thread makes (creating one per operation is slow).

    Owned by the thread and freed with it: torch keeps a fake mode's kernel-invocation flag per thread
    (``in_kernel_invocation_manager``), so one mode entered by two threads at once fails its own checks
    (``AssertionError: False, True``). Fakes are never shared between threads: each trace makes its own."""
    mode = getattr(_per_thread, "mode", None)
    if mode is None:
        # nested ints of offsets computed in a fake run are plain nested ints, as in eager (no ShapeEnv)
        mode = _per_thread.mode = fake_tensor_mode_class()(allow_non_fake_inputs=True)
    return mode


def contiguous_strides(shape) -> tuple[int, ...]:
    strides, acc = [], 1
    for s in reversed(tuple(shape)):
        strides.append(acc)
        acc *= max(int(s), 1)
    return tuple(reversed(strides))


def stride_of(p: TensorProxy) -> tuple[int, ...]:
    """Eager's strides for the value of ``p``: recorded when ``p`` was made from a real or fake tensor, else those
    of the torch operation that produced it run on fakes (:func:`_infer_strides`), else contiguous strides."""
    if isinstance(p, SubclassTensorProxy):
        return p.outer_stride
    stride = p.__dict__.get(_STRIDE_ATTR)
    add_guard = p.__dict__.pop(_STRIDE_GUARD_ATTR, None)
    if add_guard is not None and is_interpreting():
        add_guard()
    if stride is None:
        like = p.__dict__.get(STRIDES_LIKE_ATTR)
        if like is not None:  # an inner tensor of a gradient made like an output's: the output's inner layout
            return p.__dict__.setdefault(_STRIDE_ATTR, stride_of(like))
        _infer_strides(p)
        stride = p.__dict__.setdefault(_STRIDE_ATTR, contiguous_strides(p._shape))
    return stride


def _infer_strides(p: TensorProxy) -> None:
    """Record eager's strides for ``p`` and for the values it is computed from, where thunder's own torch-level
    symbols made them (thunder's proxies carry no strides): each producing torch operation, inputs first, is run on
    fakes with its inputs' strides. Subclass dispatch that looks at strides (torchao's float8 GEMMs choose a
    column-major operand by them; ``torch._scaled_mm`` on CUDA refuses others) then decides on fakes as eager does
    on the real values. Values with no producer (inputs of the trace) keep what was recorded, else contiguous."""
    order, stack, done = [], [(p, None)], set()
    while stack:  # post-order over the producers, without recursion (long chains of operations)
        q, found = stack.pop()
        if found is not None:  # its inputs were visited
            order.append((q, found))
            continue
        if id(q) in done or isinstance(q, SubclassTensorProxy) or _STRIDE_ATTR in q.__dict__:
            continue
        if not all(type(s) is int for s in q._shape):  # symbolic sizes (cache="symbolic values"): left contiguous
            continue
        done.add(id(q))
        found = tensor_producer(q)
        if found is None:
            continue
        stack.append((q, found))
        stack.extend((a, None) for a in found[1].flat_proxy_args if isinstance(a, TensorProxy))
    for q, (fns, bsym) in order:
        if _STRIDE_ATTR in q.__dict__:  # recorded with an earlier output of the same operation
            continue
        layouts = _output_layouts(fns, bsym)
        if layouts is None:  # an operation fakes cannot run: its results keep contiguous strides
            continue
        flat_proxies = [o for o in bsym.flat_proxy_outs if isinstance(o, TensorProxy)]
        if len(layouts) == len(flat_proxies):
            for o, (shape, stride) in zip(flat_proxies, layouts):
                if shape == tuple(o._shape) and _STRIDE_ATTR not in o.__dict__ \
                        and not isinstance(o, SubclassTensorProxy):  # (their strides are their outer_stride)
                    o.__dict__[_STRIDE_ATTR] = stride


# (symbol id, argument structure, arguments' metadata and constants) -> the (shape, strides) of each tensor result of
# the operation run on fakes, or None where fakes could not run it: an operation's result layouts are a function of
# these, so the same operation on values of the same layouts (every decoder layer's) is run on fakes once
_LAYOUTS: dict = {}
_LAYOUTS_LIMIT = 8192
_NO_LAYOUTS = object()


def _layouts_key(bsym) -> tuple | None:
    def leaf(x):
        if isinstance(x, SubclassTensorProxy):
            raise TypeError  # not a plain operation (see _strided_fakes)
        if isinstance(x, TensorProxy):
            if not all(type(n) is int for n in x._shape):
                raise TypeError  # symbolic sizes: never compared as keys
            return (tuple(x._shape), stride_of(x), x.dtype, x.device)
        if isinstance(x, NumberProxy):
            return (type(x.value), x.value)
        if isinstance(x, Proxy):
            raise TypeError
        return (type(x), x)

    try:
        flat, spec = tree_flatten((bsym.args, bsym.kwargs))
        key = (bsym.sym.id, spec, tuple(leaf(x) for x in flat))
        hash(key)
    except Exception:  # noqa: BLE001 - unhashable constants (a slice before Python 3.12): not shared
        return None
    return key


def _output_layouts(fns: tuple, bsym) -> tuple | None:
    """The (shape, strides) of each tensor result of ``bsym``'s operation run on fakes of its arguments, or None."""
    key = _layouts_key(bsym)
    found = _LAYOUTS.get(key, _NO_LAYOUTS) if key is not None else _NO_LAYOUTS
    if found is not _NO_LAYOUTS:
        return found
    out = _run_on_fakes(fns, bsym)
    layouts = None if out is None else tuple(
        (tuple(f.shape), tuple(f.stride())) for f in pytree.tree_leaves(out) if isinstance(f, torch.Tensor)
    )
    if key is not None:
        if len(_LAYOUTS) >= _LAYOUTS_LIMIT:
            _LAYOUTS.clear()
        _LAYOUTS[key] = layouts
    return layouts


_working_callable: dict = {}  # symbol id -> index of the torch callable its arguments fit


def _run_on_fakes(fns: tuple, bsym) -> Any:
    try:
        with fake_mode():
            args, kwargs = _strided_fakes((bsym.args, bsym.kwargs))
            known = _working_callable.get(bsym.sym.id)
            for i in sorted(range(len(fns)), key=lambda i: i != known):  # the one that fitted before first
                try:
                    out = fns[i](*args, **kwargs)
                except Exception:
                    continue
                _working_callable[bsym.sym.id] = i
                return out
    except Exception:
        pass
    return None


def _strided_fakes(tree):
    def fake(x):
        if isinstance(x, SubclassTensorProxy):
            raise NotImplementedError  # not a plain operation
        if isinstance(x, TensorProxy):
            return torch.empty_strided(tuple(x._shape), stride_of(x), dtype=torch_dtype(x), device=torch_device(x))
        if isinstance(x, NumberProxy):  # not pinned (to_fake pins): only strides are computed from it
            return x.value
        return torch_argument(x)

    return pytree.tree_map(fake, tree, is_leaf=lambda x: isinstance(x, (TensorProxy, NumberProxy)))


def remember_input_stride(p: TensorProxy, stride: tuple[int, ...], add_guard: Callable[[], None]) -> None:
    """Input ``p`` of the trace has strides ``stride``; ``add_guard()`` adds the prologue check that the trace
    depends on them, called when a fake of ``p`` is first made while tracing (most inputs never get one)."""
    p.__dict__[_STRIDE_ATTR] = stride
    p.__dict__[_STRIDE_GUARD_ATTR] = add_guard


def recorded_stride(p: TensorProxy) -> tuple[int, ...] | None:
    """The strides recorded for ``p`` (:func:`remember_stride`, :func:`remember_input_stride`), or None."""
    return p.__dict__.get(_STRIDE_ATTR)


def remember_stride(p: TensorProxy, t: torch.Tensor, env: FakeEnv | None = None) -> TensorProxy:
    if not isinstance(p, SubclassTensorProxy):
        stride = tuple(t.stride())
        if any(isinstance(s, torch.SymInt) for s in stride):
            # a fake with symbolic sizes (``env``'s): its strides as number proxies, for the fakes made of ``p``
            # later (a transposed inner tensor stays transposed: a later reshape is not recorded as a view)
            if env is not None and env.symbols is not None:
                try:
                    p.__dict__[_SYMBOLIC_STRIDE_ATTR] = env.numbers(stride)
                except SymbolicSizeError:
                    pass
            return p
        p.__dict__[_STRIDE_ATTR] = stride
    return p


_SYMBOLIC_STRIDE_ATTR = "_thunder_subclass_symbolic_stride"


def torch_argument(x: Any) -> Any:
    """thunder's own argument types (its dtypes and devices) as torch takes them; anything else unchanged."""
    if isinstance(x, dtypes.dtype):
        return dtypes.to_torch_dtype(x)
    if isinstance(x, devices.Device):
        return devices.to_torch_device(x)
    return x


def torch_dtype(p: TensorProxy) -> torch.dtype:
    return dtypes.to_torch_dtype(p.dtype)


def torch_device(p: TensorProxy) -> torch.device:
    return devices.to_torch_device(p.device)


class ValueSource:
    """An integer tensor input of the trace (a plain argument, or an inner tensor of a subclass input: a jagged
    NestedTensor's offsets / lengths) whose values dispatch may read while tracing (``.item()``, ``.tolist()``). Holds
    the value weakly (the call being traced keeps it alive; a cached trace keeps no input alive);
    ``add_guard(value)`` adds the prologue check that a later call's tensor has these values (called the first time
    a fake run reads them, while interpreting, then dropped): a trace made for these values is never reused for
    others."""

    __slots__ = ("_ref", "_add_guard", "guarded", "stale", "name")

    def __init__(self, t: torch.Tensor, add_guard: Callable[[torch.Tensor], None], name: str):
        import weakref

        self._ref = weakref.ref(t)
        self._add_guard = add_guard
        self.guarded = False
        self.stale = False  # the trace changed an integer tensor in place: the values as passed may be stale
        self.name = name

    def usable(self) -> bool:
        """Whether fakes of the input may know its values now: while interpreting, until the trace changes an integer
        tensor in place (the input's proxy then still stands for it, its values as passed are not what later code
        reads); afterwards (an operation recorded again for autodiff), only values already read, and so guarded."""
        if is_interpreting():
            if not self.stale and trace_wrote_integer_tensors():
                self.stale = True
            return not self.stale
        return self.guarded and not self.stale

    def value(self) -> torch.Tensor | None:
        return self._ref()

    def guard(self) -> bool:
        """Add the prologue check (once); False when it can no longer be added (the prologue is made: a backward
        being recorded)."""
        if not self.guarded:
            value = self.value()
            if value is None or self._add_guard is None or not is_interpreting():
                return False
            self._add_guard(value)
            self._add_guard = None
            self.guarded = True
        return True


_VALUE_SOURCE_ATTR = "_thunder_subclass_value_source"


def real_execution() -> contextlib.AbstractContextManager:
    """Run torch code on real tensors inside a fake run (no fake mode active)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    return unset_fake_temporarily()


def remember_value_source(p: TensorProxy, source: ValueSource) -> None:
    """Fakes of input ``p`` know its values (:class:`ValueSource`), for dispatch that reads them."""
    p.__dict__[_VALUE_SOURCE_ATTR] = source


def value_source(p: Any) -> ValueSource | None:
    return p.__dict__.get(_VALUE_SOURCE_ATTR) if isinstance(p, TensorProxy) else None


class FakeEnv:
    """Maps proxies to fake tensors (for running an operation) and fake results back to proxies."""

    def __init__(self, symbols: ShapeSymbols | None = None, *, pin: bool = True):
        # cache="symbolic values", the caller able to pin sizes: fakes get this ShapeEnv's symbols (record_call)
        self.symbols = symbols
        # pin: numbers that reach fakes are pinned under cache="symbolic values" (False for a fake run whose result
        # the trace does not depend on: which instance attributes __tensor_unflatten__ restores)
        self.pin = pin
        self._fake_of: dict[int, torch.Tensor] = {}  # id(proxy) -> fake
        self._proxy_of: dict[int, TensorProxy] = {}  # id(fake) -> proxy
        self._keep: list[Any] = []  # keeps fakes alive so ids stay unique
        self.subclass_inputs: list[SubclassTensorProxy] = []
        self.mutated: set[int] = set()  # ids of fakes that in-place ops wrote to
        self._leaf_of: dict[int, torch.Tensor] = {}  # id(non-leaf fake) -> the leaf it was made from
        # id(fake) -> (its real value, the ValueSources it is computed from): fakes of integer inputs and what
        # aten calls compute from them alone (see known_value)
        self.known_values: dict[int, tuple[torch.Tensor, frozenset]] = {}
        self._keep_known: list[torch.Tensor] = []
        self.context_states: dict = {}  # what the last fake run left of torch state outside tensors (fake_execution)
        self._owned_contexts: dict = {}  # copies own_context made, per placement (values of one env share them)

    def bind(self, p: TensorProxy, fake: torch.Tensor) -> None:
        if id(fake) in self._proxy_of and self._proxy_of[id(fake)] is not p:
            self.mutated.add(id(fake))  # an in-place op made a new version of this tensor
        self._fake_of[id(p)] = fake
        self._proxy_of[id(fake)] = p
        self._keep.append((p, fake))
        remember_nested_int(p, registered_nested_int(fake))

    def remember_nested_ints(self) -> None:
        """After a fake run: plain values that became the offsets of a NestedTensor in it (a nested int was made
        for their fakes) keep that nested int, so later fake runs build NestedTensors of the same ragged size."""
        for p, fake in self._keep:
            if isinstance(p, TensorProxy) and isinstance(fake, torch.Tensor):
                remember_nested_int(p, registered_nested_int(fake))

    def own_context(self, ctx: Any) -> Any:
        """The flatten context for a proxy of a result of this environment's fake run: with state that torch keeps in
        it outside tensors (DTensor's ``_MaskPartial`` mask) as the run left it, owned by the value
        (``_thunder_internals.own_mask_buffers``)."""
        return own_mask_buffers(ctx, self.context_states, self._owned_contexts)

    def copy(self) -> FakeEnv:
        """A new environment that starts with this one's bindings (for recording a backward on a forward)."""
        new = FakeEnv(self.symbols, pin=self.pin)
        new._fake_of = dict(self._fake_of)
        new._proxy_of = dict(self._proxy_of)
        new._keep = list(self._keep)
        new.subclass_inputs = list(self.subclass_inputs)
        new.mutated = set(self.mutated)
        new._leaf_of = dict(self._leaf_of)
        new.known_values = dict(self.known_values)
        new._keep_known = list(self._keep_known)
        return new

    def rename(self, old, new) -> None:
        """Let ``new`` stand for what ``old`` stood for (thunder's autodiff renames proxies after recording)."""
        fake = self._fake_of.get(id(old))
        if fake is None or old is new:
            return
        self._proxy_of[id(fake)] = new
        self._fake_of[id(new)] = fake
        self._keep.append((new, fake))
        if isinstance(old, SubclassTensorProxy) and isinstance(new, SubclassTensorProxy):
            for a, q in old.inner.items():
                if a in new.inner:
                    self.rename(q, new.inner[a])

    def new_inner_versions(self, inputs) -> list[TensorProxy]:
        """The new versions (proxies) of the inner tensors of subclass values among ``inputs`` that a recorded call
        changed in place."""
        found = []
        for p in inputs:
            if isinstance(p, SubclassTensorProxy):
                for q in p.inner.values():
                    fake = self._fake_of.get(id(q)) if isinstance(q, TensorProxy) else None
                    current = self._proxy_of.get(id(fake)) if fake is not None else None
                    if current is not None and current is not q:
                        found.append(current)
                found += self.new_inner_versions(p.inner.values())
        return found

    def read_inputs_in_place(self, inputs) -> None:
        """After a recorded call changed some of ``inputs`` in place: their fakes stand for the input proxies again,
        not for the new versions the call made (names local to its subsymbols). What is recorded on this environment
        afterwards (the call's backward) reads the input, whose storage holds the new value when it runs."""
        for p in inputs:
            fake = self._fake_of.get(id(p)) if isinstance(p, TensorProxy) else None
            if fake is None:
                continue
            if self._proxy_of.get(id(fake)) is not p:
                self._proxy_of[id(fake)] = p
            if isinstance(p, SubclassTensorProxy):
                self.read_inputs_in_place(p.inner.values())

    def grad_input(self, fake: torch.Tensor) -> torch.Tensor:
        """What to differentiate with respect to for ``fake``: the leaf a non-leaf fake was made from. It stands for
        the value before the operation, also when an in-place op rebased ``fake`` itself onto the op's result."""
        return self._leaf_of.get(id(fake), fake)

    def bindings(self) -> list[tuple[TensorProxy, torch.Tensor]]:
        """Every (proxy, fake) binding made in this environment, in the order made (a rebound fake appears again)."""
        return list(self._keep)

    def bound_fakes(self) -> list[tuple[torch.Tensor, TensorProxy]]:
        """The (fake, proxy) pairs bound in this environment, newest binding of each fake."""
        return [(f, self._proxy_of[id(f)]) for _, f in self._keep if self._proxy_of.get(id(f)) is not None]

    def proxy_of(self, fake: torch.Tensor) -> TensorProxy | None:
        return self._proxy_of.get(id(fake))

    def known_value(self, fake: Any) -> tuple[torch.Tensor, frozenset] | None:
        """The real value of ``fake`` and the :class:`ValueSource` inputs it is computed from, when known: a fake of
        an integer input of the trace, or the result of aten calls on such fakes only (:meth:`propagate_values`)."""
        return self.known_values.get(id(fake))

    def propagate_values(self, func, args, kwargs, out) -> None:
        """After aten call ``func`` on fakes returned ``out``: when every tensor argument has a known value, run
        ``func`` on the real values too, so its results' values are known (the lengths NestedTensor's dispatch
        computes from its offsets, then reads with ``.tolist()``). Calls that write to their arguments are not run
        (they would change the caller's tensors); their arguments' values are no longer known."""
        flat = [a for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        if getattr(func, "_schema", None) is not None and func._schema.is_mutable:
            for a in flat:
                self.known_values.pop(id(a), None)
            return
        if not flat:
            return
        known = [self.known_values.get(id(a)) for a in flat]
        if any(k is None for k in known):
            return
        real_of = {id(a): k[0] for a, k in zip(flat, known)}
        sources = frozenset().union(*(k[1] for k in known))

        def real(a):
            return real_of.get(id(a), a) if isinstance(a, torch.Tensor) else a

        real_args, real_kwargs = pytree.tree_map(real, (args, kwargs))
        try:
            with real_execution():
                real_out = func(*real_args, **real_kwargs)
        except Exception:
            return
        fakes = [o for o in pytree.tree_leaves(out) if isinstance(o, torch.Tensor)]
        reals = [o for o in pytree.tree_leaves(real_out) if isinstance(o, torch.Tensor)]
        if len(fakes) == len(reals):
            for f, r in zip(fakes, reals):
                if tuple(f.shape) == tuple(r.shape):
                    self.known_values[id(f)] = (r, sources)
                    self._keep_known.append(f)  # ids stay unique while the value is known

    def to_fake(self, x: Any, requires_grad: bool | None = None, outer_size: tuple | None = None) -> Any:
        """The fake standing for ``x`` (made once per environment). ``requires_grad`` (default: the proxy's) is
        applied when the fake is made: a fake that requires grad is a leaf only for an input of the compiled
        function that was a leaf (``proxy.mark_leaf``); other values are non-leaf, as in eager, so in-place ops on
        them run as eager runs them. ``outer_size``: the size of a subclass fake, when it is not the proxy's (the
        gradient of an output has the output's ragged sizes, also when the output was traced again)."""
        if self.symbols is not None:
            if isinstance(x, NumberProxy):
                return self._number(x)
        elif self.pin:
            pin_numbers(x)  # under cache="symbolic values": the fake run holds for these values only
        if isinstance(x, NumberProxy):
            return x.value
        if isinstance(x, (dtypes.dtype, devices.Device)):
            return torch_argument(x)
        if isinstance(x, OpaqueObjectProxy):  # the object seen while tracing stands in for it in fake runs
            if id(x.value) not in self._proxy_of:
                self._proxy_of[id(x.value)] = x
                self._keep.append((x, x.value))
            return x.value
        if not isinstance(x, TensorProxy):
            return x
        fake = self._fake_of.get(id(x))
        if fake is not None:
            return fake
        requires_grad = bool(x.requires_grad) if requires_grad is None else requires_grad
        if isinstance(x, SubclassTensorProxy):
            inner = {a: self.to_fake(p) for a, p in x.inner.items()}
            size, stride = outer_size or x.outer_size, x.outer_stride
            ctx = x.flatten_ctx
            if self.symbols is not None:
                if x.history is not None and not isinstance(ctx, SizedContext):
                    # an input: its sizes in its context become the symbols too (DTensor's TensorMeta)
                    template, found = context_template(ctx, size_values(size), size_values(stride))
                    ctx = SizedContext(template) if found else ctx
                size, stride = self._symbolic_outer(x, size, stride)
            else:  # the values of size numbers (comparing number proxies would record comparisons in the trace)
                size, stride = size_values(size), size_values(stride)
            fake = unflatten_fake(x.subclass_type, inner, resolve_context(ctx, size, stride), size, stride)
            restore_python_attributes(fake, x.python_attrs)
            self.subclass_inputs.append(x)
        elif self.symbols is not None and not all(type(d) is int for d in x._shape):
            if value_source(x) is not None and not is_jagged_inner(x):  # (a jagged input's know none: frontend.jagged)
                raise SymbolicSizeError("known values are not kept symbolic")
            shape = [self._size(d) for d in x._shape]
            strides = x.__dict__.get(_SYMBOLIC_STRIDE_ATTR)
            with self.symbols.mode:  # the strides a symbolic run gave it, else contiguous in the symbols
                if strides is not None and len(strides) == len(shape):
                    fake = torch.empty_strided(shape, [self._size(d) for d in strides], dtype=torch_dtype(x),
                                               device=torch_device(x))
                else:
                    fake = torch.empty(shape, dtype=torch_dtype(x), device=torch_device(x))
            if nested_int_of(x) is not None:  # a jagged NestedTensor's offsets: the input's ragged size, symbolic
                set_fake_nested_int(fake, self.symbols.nested_int(nested_int_of(x)))
        else:
            with (self.symbols.mode if self.symbols is not None else fake_mode()):
                fake = torch.empty_strided(
                    tuple(x._shape), stride_of(x), dtype=torch_dtype(x), device=torch_device(x)
                )
            nested_int = nested_int_of(x)
            if nested_int is not None:  # the offsets of NestedTensors: those built on it share their ragged size
                set_fake_nested_int(fake, nested_int)
            source = value_source(x)
            real = source.value() if source is not None else None
            if real is not None and not source.usable():
                real = None
            if real is not None:  # a copy: environments kept for a backward keep no input alive
                with real_execution():
                    real = real.detach().clone()
                self.known_values[id(fake)] = (real, frozenset((source,)))
        if requires_grad != fake.requires_grad and fake.is_leaf:
            fake.requires_grad_(requires_grad)
        if fake.requires_grad and fake.is_leaf and not is_marked_leaf(x):
            with self._in_mode():  # (DTensor's dispatch of a symbolic fake needs its fake mode active)
                non_leaf = _NonLeaf.apply(fake)
            # through dispatch for a subclass: usable only if it kept the value's kind (detach may give a plain tensor)
            if type(non_leaf) is type(fake) and (not isinstance(x, SubclassTensorProxy) or
                                                  non_leaf.__tensor_flatten__()[0] == fake.__tensor_flatten__()[0]):
                self._leaf_of[id(non_leaf)] = fake
                fake = non_leaf
                self._bind_inner(x, fake)  # the detached inner tensors stand for the same inner proxies
        self.bind(x, fake)
        return fake

    def _in_mode(self) -> contextlib.AbstractContextManager:
        if self.symbols is None or torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is not None:
            return contextlib.nullcontext()
        return self.symbols.mode

    def numbers(self, sizes) -> tuple:
        """The sizes (or strides) of a fake result as the proxy's: ints, or, in a symbolic environment, the number
        proxies their symbols stand for (a sum or product of symbols: a number computed in the current scope,
        ``ShapeSymbols.number``)."""
        if self.symbols is None:
            return tuple(sizes)
        return tuple(self.symbols.number(d, compute=True) for d in sizes)

    def _size(self, d: Any) -> Any:
        """A size of a proxy as the fakes of a symbolic environment have it: an int, a pinned number's value, or
        the symbol of a number proxy."""
        if isinstance(d, NumberProxy):
            if d.is_static_constrained():  # pinned (a prologue check of its value)
                return int(d.value)
            return self.symbols.symint(d)
        return int(d)

    def _number(self, x: NumberProxy) -> Any:
        """A number argument of a fake run in a symbolic environment: the symbol of a size the run's tensors have
        (a gradient's ``expand`` to an input's size), else the value, pinned."""
        if self.symbols.knows(x) and not x.is_static_constrained():
            return self.symbols.symint(x)
        if x.is_dynamic() and not is_interpreting():
            raise SymbolicSizeError(f"number {x.name} reaches a fake run after the prologue was made")
        pin_numbers(x)
        return x.value

    def _symbolic_outer(self, x: SubclassTensorProxy, size: tuple, stride: tuple) -> tuple[tuple, tuple]:
        """The outer size and strides of the fake of subclass proxy ``x`` in a symbolic environment: symbols where
        ``x``'s sizes are number proxies; strides contiguous in them where they were contiguous, else its own."""
        if x.nested_sizes:  # a jagged NestedTensor
            return jagged_fake_outer(x, size, self._size, self.symbols)
        sym_size = tuple(self._size(d) for d in size)
        if x.history is None:  # a computed value: its strides were mapped from a fake run's (ints are constants)
            return sym_size, tuple(self._size(d) for d in stride)
        values, stride_values = size_values(size), size_values(stride)
        if stride_values == contiguous_strides(values):
            sym_stride, acc = [], 1
            for d in reversed(sym_size):
                sym_stride.append(acc)
                acc = acc * d
            return sym_size, tuple(reversed(sym_stride))
        if all(type(d) is int for d in sym_size):
            return sym_size, stride_values
        raise SymbolicSizeError("a non-contiguous subclass value with symbolic sizes")

    def _bind_inner(self, x: TensorProxy, fake: torch.Tensor) -> None:
        if isinstance(x, SubclassTensorProxy):
            for a, p in x.inner.items():
                if isinstance(p, TensorProxy):
                    inner = getattr(fake, a)
                    self._bind_inner(p, inner)
                    self.bind(p, inner)


class _OuterSizeMarker:
    """Stands in a flatten context for the value's outer size (``kind`` "size") or strides ("stride"), as a tuple of
    type ``typ`` (``torch.Size``, ``tuple``)."""

    __slots__ = ("kind", "typ")

    def __init__(self, kind: str, typ: type):
        self.kind, self.typ = kind, typ

    def __eq__(self, other) -> bool:
        return isinstance(other, _OuterSizeMarker) and (self.kind, self.typ) == (other.kind, other.typ)

    def __hash__(self) -> int:
        return hash((self.kind, self.typ))

    def __repr__(self) -> str:
        return f"<outer {self.kind}>"


def _same_entries(a: tuple, b: tuple) -> bool:
    # element-wise identity of sizes without guards: ints by value, SymInts by their expressions
    if len(a) != len(b) or not a:
        return False
    for x, y in zip(a, b):
        if isinstance(x, torch.SymInt) or isinstance(y, torch.SymInt):
            if not (isinstance(x, torch.SymInt) and isinstance(y, torch.SymInt)) or x.node.expr != y.node.expr:
                return False
        elif type(x) is not int or type(y) is not int or x != y:
            return False
    return True


def context_template(ctx: Any, size: tuple, stride: tuple) -> tuple[Any, bool]:
    """``(template, found)``: flatten context ``ctx`` with each tuple (a ``torch.Size``, a named tuple's field) equal
    to the value's outer ``size`` or ``stride`` replaced by a marker (DTensor's ``TensorMeta(shape, stride, dtype)``).
    Tuples, lists, named tuples and dicts are searched."""
    found = [False]
    size, stride = tuple(size), tuple(stride)

    def walk(x):
        if isinstance(x, tuple) and not hasattr(x, "_fields") and x and all(
                type(v) is int or isinstance(v, torch.SymInt) for v in x):
            if _same_entries(x, size):
                found[0] = True
                return _OuterSizeMarker("size", type(x))
            if _same_entries(x, stride):
                found[0] = True
                return _OuterSizeMarker("stride", type(x))
            return x
        return _rebuilt(x, walk)

    template = walk(ctx)
    return template, found[0]


def context_with_sizes(template: Any, size: tuple, stride: tuple) -> Any:
    """``template`` (:func:`context_template`) with its markers replaced by ``size`` and ``stride``."""

    def walk(x):
        if isinstance(x, _OuterSizeMarker):
            return x.typ(size if x.kind == "size" else stride)
        return _rebuilt(x, walk)

    return walk(template)


def _rebuilt(x: Any, walk: Callable) -> Any:
    """``x`` rebuilt with ``walk`` applied to its items, for the containers a flatten context is searched through
    (named tuples, tuples, lists, dicts); any other value as it is."""
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return type(x)(*(walk(v) for v in x))
    if type(x) in (tuple, list):
        return type(x)(walk(v) for v in x)
    if type(x) is dict:
        return {k: walk(v) for k, v in x.items()}
    return x


def has_symints(x: Any) -> bool:
    """Whether ``x`` (a flatten context) holds a SymInt in a tuple, list, named tuple or dict."""
    if isinstance(x, torch.SymInt):
        return True
    if isinstance(x, (tuple, list)):
        return any(has_symints(v) for v in x)
    if type(x) is dict:
        return any(has_symints(v) for v in x.values())
    return False


class SizedContext:
    """The flatten context of a value computed with symbolic sizes whose context holds its outer size or strides
    (DTensor's ``TensorMeta``): a template (:func:`context_template`) completed with the value's sizes where it is
    used (:meth:`resolve`: in fake runs with their symbols, when the trace runs with the actual sizes)."""

    __slots__ = ("template",)

    def __init__(self, template: Any):
        self.template = template

    def resolve(self, size: tuple, stride: tuple) -> Any:
        return context_with_sizes(self.template, size, stride)

    def __eq__(self, other) -> bool:
        return isinstance(other, SizedContext) and other.template == self.template

    def __hash__(self) -> int:
        return hash(repr(self.template))

    def __repr__(self) -> str:
        return f"SizedContext({self.template!r})"


def resolve_context(ctx: Any, size: tuple, stride: tuple) -> Any:
    """A flatten context as ``__tensor_unflatten__`` takes it, for a value of this outer size and strides."""
    return ctx.resolve(tuple(size), tuple(stride)) if isinstance(ctx, SizedContext) else ctx


class _NonLeaf(torch.autograd.Function):
    """The identity, giving a non-leaf (``x.detach()`` made inside a Function is not a view of ``x``): the fake of a
    value computed inside the compiled function, on which eager allows in-place ops even when it requires grad."""

    @staticmethod
    def forward(ctx, x):
        detached = detach_dtensor(x)  # (None for other tensors; a DTensor's own detach reduces a mask from 2.14 on)
        return x.detach() if detached is None else detached

    @staticmethod
    def backward(ctx, grad):
        return grad


def restore_python_attributes(fake: torch.Tensor, python_attrs: dict) -> None:
    """Give a fake rebuilt by ``__tensor_unflatten__`` the instance attributes the value had and the rebuild did not
    restore (e.g. ``nn.Parameter``'s ``_is_param``, a ``quant_type`` set by the user)."""
    d = getattr(fake, "__dict__", None)
    for name, value in python_attrs.items():
        if d is not None and name in d:
            continue
        try:
            missing = not hasattr(fake, name)
        except Exception:
            missing = True
        if not missing:
            continue
        if d is None or name in _slots(fake):
            setattr(fake, name, value)
        else:
            d[name] = value


def _slots(t) -> set:
    return {n for c in type(t).__mro__ for n in ([vars(c)["__slots__"]] if isinstance(vars(c).get("__slots__"), str)
                                               else vars(c).get("__slots__", ()))}


def unflatten_fake(cls: type, inner: dict, ctx: Any, shape: tuple, stride: tuple) -> torch.Tensor:
    """``cls.__tensor_unflatten__`` on fake inner tensors, checked (:func:`check_unflattened`); its exceptions become
    :class:`SubclassProtocolError` naming the class."""
    try:
        fake = cls.__tensor_unflatten__(inner, ctx, shape, stride)
    except Exception as e:
        raise SubclassProtocolError(
            f"{cls.__qualname__}.__tensor_unflatten__ raised {type(e).__name__}: {e} (rebuilding a {cls.__qualname__} "
            f"of shape {tuple(shape)} from inner tensors {sorted(inner)} and flatten context {ctx!r})"
        ) from e
    check_unflattened(cls, fake, shape)
    return fake


def check_unflattened(cls: type, t: Any, shape: tuple) -> None:
    """``cls.__tensor_unflatten__`` must rebuild a ``cls`` of the outer shape it was given, or, where ``cls``
    inherits ``__tensor_unflatten__`` from a base class, an instance of a base class that shares it (a subclass that
    only adds a ``__metadata_guard__``, say): torch.compile traces such an input as what ``__tensor_unflatten__``
    rebuilds too, and eager's ``__torch_dispatch__`` of the base class runs for both (:func:`is_inherited_rebuild`)."""
    if type(t) is not cls and not is_inherited_rebuild(cls, type(t)):
        from torch._subclasses.fake_tensor import FakeTensor

        got = "Tensor" if isinstance(t, FakeTensor) else type(t).__qualname__  # while tracing, plain tensors are fake
        raise SubclassProtocolError(
            f"{cls.__qualname__}.__tensor_unflatten__ returned a {got}, not a {cls.__qualname__}; "
            "it must rebuild the subclass from its inner tensors and flatten context."
        )
    if tuple(t.shape) != tuple(shape):
        raise SubclassProtocolError(
            f"{cls.__qualname__}.__tensor_unflatten__ returned a {cls.__qualname__} of shape {tuple(t.shape)}; "
            f"expected {tuple(shape)} (the outer_size it was given)."
        )


# what a subclass of a wrapper subclass may define and still be traced as the base instance its inherited
# ``__tensor_unflatten__`` rebuilds: nothing that changes how its values behave in traced code
_REBUILD_NEUTRAL_NAMES = frozenset({
    "__metadata_guard__", "__init__", "__new__", "__repr__", "__module__", "__qualname__", "__doc__", "__dict__",
    "__weakref__", "__annotations__", "__slots__", "__firstlineno__", "__static_attributes__", "__parameters__",
    "__orig_bases__",
})


def is_inherited_rebuild(cls: type, rebuilt: type) -> bool:
    """True when ``rebuilt`` is a base class of ``cls`` from which ``cls`` inherits ``__tensor_unflatten__`` and
    everything else that decides how its values behave: the classes from ``cls`` down to ``rebuilt`` define nothing
    but a ``__metadata_guard__``, constructors and ``__repr__`` (no ``__torch_function__``, ``__torch_dispatch__``,
    methods or properties of their own). The base's ``__tensor_unflatten__`` rebuilds a base instance, which then
    behaves in traced code as the ``cls`` instance does in eager; a class that adds behaviour (its own
    ``__torch_function__`` post-processing results, an overridden method) is not traced as its base (that was a
    silently different result) but must rebuild itself."""
    if rebuilt is cls or not isinstance(cls, type) or not issubclass(cls, rebuilt):
        return False
    for klass in cls.__mro__:
        if klass is rebuilt:
            return True
        if any(name not in _REBUILD_NEUTRAL_NAMES for name in vars(klass)):
            return False
    return False


@contextlib.contextmanager
def fake_execution(*, autocast: bool = False, env: FakeEnv | None = None):
    """Run torch code on fakes: the shared fake mode, with real (non-fake) constants allowed. State that torch keeps
    outside tensors and that a fake run changes (DTensor's ``_MaskPartial`` mask buffers) is put back at the end;
    ``env`` (whose fakes the run uses) learns the states the run left, for the results made from it
    (:meth:`FakeEnv.own_context`).

    Autocast: with ``autocast=True`` (running a user-level torch operation, as eager would run it at this point of
    the traced code), torch's autocast state is the traced code's (:func:`traced_autocast`); otherwise none (aten
    calls already recorded, backward graphs: what they compute is fixed, as when the trace runs them, which thunder
    does with autocast off)."""
    mode = env.symbols.mode if env is not None and env.symbols is not None else fake_mode()
    with mode, traced_autocast(enabled=autocast), isolated_mask_buffers() as states:
        if env is not None:
            env.context_states = states
        yield


_AUTOCAST_DEVICES = ("cpu", "cuda")


def traced_autocast(*, enabled: bool = True) -> contextlib.AbstractContextManager:
    """A context in which torch's autocast state is that of the traced code at this point: what ``torch.autocast``
    entered and exited around the call and inside the traced function has (thunder records it in its autocast stack
    instead of entering it, ``_thunder_internals.traced_autocast_states``), none where thunder applies an autocast
    rule itself (its inputs are cast already) or with ``enabled=False``. The fake runs of a subclass operation then
    cast as eager's dispatcher does (its Autocast keys run before the subclass's ``__torch_dispatch__``), and the
    casts are recorded as aten calls."""
    return autocast_context(traced_autocast_states() if enabled else ())


def autocast_context(states: tuple) -> contextlib.AbstractContextManager:
    """A context in which torch's autocast state is exactly ``states`` (``(device type, dtype, enabled)``,
    outermost first; ``()``: none), whatever it is outside."""
    active = [d for d in _AUTOCAST_DEVICES if torch.is_autocast_enabled(d)]
    if not states and not active:
        return contextlib.nullcontext()
    stack = contextlib.ExitStack()
    for device in active:  # the tracer's caller's state is not the traced code's
        stack.enter_context(torch.autocast(device, enabled=False))
    for device, dtype, on in states:
        stack.enter_context(torch.autocast(device, dtype=dtype, enabled=on))
    return stack


def autocast_in_effect() -> tuple:
    """The traced code's autocast states (:func:`traced_autocast`) when autocast is on for some device at this point,
    else ``()``."""
    states = traced_autocast_states()
    final = {}
    for device, dtype, on in states:
        final[device] = on
    return states if any(final.values()) else ()

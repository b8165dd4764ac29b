"""Stage 2 (per call), data-dependent branches traced as one program: the value a branch reads is computed while tracing
and guarded.

In: a conversion of a value computed from tensor data to a Python value while a plugin jit traces —
``if tensor:`` / ``bool(t)``, ``int(t)``, ``float(t)``, ``operator.index(t)`` of a tensor, the same of a number
``t.item()`` made (``if x.sum().item() > 0:``), ``.item()`` of a subclass tensor, and ``t.tolist()`` of a tensor (at
most :data:`TOLIST_LIMIT` numbers: MoE routing's ``counts.tolist()``). thunder cannot trace past such a
point (its proxies have no values), and the program would run as compiled regions with eager code between them
(:mod:`thunder_subclass.runtime.graph_breaks`), as torch.compile breaks its graph there.

What happens instead: the operations of the trace so far that the value depends on (its *slice*: torch-level bound
symbols back to the inputs) are run eagerly on the call's real inputs (the torch function each symbol stands for, on
real tensors and subclass tensors, under ``no_grad`` and without autocast), the Python value is handed to the traced
code, which goes on tracing the branch it picks, and a prologue check ``check_speculation(spec, inputs)`` is added:
on every later call the prologue runs the same slice on that call's inputs and compares the value (exactly; NaN
equal to NaN). Another value is a cache miss (``thunder_subclass.explain_recompiles`` says which value changed), and
the new trace takes the other branch. Out: the Python value, handed to the traced code, and the check. Because the
check is in the prologue, a call never runs any of a trace whose
branch does not hold: no partial computation, no side effect, no wrong answer.

The slice runs twice per call (in the prologue, and in the computation where the program uses its tensors); it is
usually small (a reduction feeding a comparison). Not speculated, so that the program breaks the graph as before
(the data-dependency error, then :mod:`~thunder_subclass.runtime.graph_breaks`): a value whose slice holds an in-place
or random operation (running it in the prologue would change inputs or the random state), a value computed after an
in-place change of anything but a tensor the trace made from no tensor (which aliases no input) and the value does not
read, an operation without a torch
function, a proxy made inside another operation's scope, or a value not reached from the inputs; and a source line
that already speculated ``thunder_subclass.config.speculation_limit`` (default 4) values for the compiled function
(a value that changes on every call, ``loss.item()`` style, would otherwise retrace every time).
"""

from __future__ import annotations

import functools
import math
import operator
import weakref
from collections.abc import Callable
from typing import Any

import torch
import thunder.core.prims as prims
from thunder.core.proxies import NumberProxy, Proxy, TensorProxy
from thunder.core.pytree import tree_flatten, tree_map
from thunder.core.symbol import Symbol

from thunder_subclass import _thunder_internals
from thunder_subclass.runtime.cache import DEFAULT_SPECULATION_LIMIT, config
from thunder_subclass.executor import subclass_executor
from thunder_subclass.guards import SubclassGuardFailure
from thunder_subclass.frontend.proxy import SubclassTensorProxy

__all__ = ["SPECULATION_LIMIT", "TOLIST_LIMIT", "SpeculationSpec", "check_speculation", "lookaside", "record_input", "speculate"]

# distinct values a source line may speculate per compiled function before it breaks the graph instead: the default of
# thunder_subclass.config.speculation_limit, which is what is read
SPECULATION_LIMIT = DEFAULT_SPECULATION_LIMIT

NOT_SPECULATED = object()

def _tolist(t):
    return t.tolist()


_CONVERSIONS: dict[str, Callable[[Any], Any]] = {
    "bool": bool, "int": int, "float": float, "index": operator.index,
    "number": lambda n: n, "tolist": _tolist,
}

# the most numbers a speculated ``.tolist()`` may hold (a bigger one is not speculated: its check would copy it)
TOLIST_LIMIT = 256


def _speculable(value, conversion: str) -> bool:
    if conversion != "tolist":
        return isinstance(value, (bool, int, float))
    count, todo = 0, [value]
    while todo:
        v = todo.pop()
        if isinstance(v, list):
            todo.extend(v)
        elif isinstance(v, (bool, int, float)):
            count += 1
            if count > TOLIST_LIMIT:
                return False
        else:
            return False
    return True

def _convert_number(v, numbertype):
    return numbertype(v)


# thunder symbols on Python numbers (a number proxy from .item() compared, added, ...) -> the Python operation
_NUMBER_OPS: dict[str, Callable] = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul, "true_divide": operator.truediv,
    "div": operator.truediv, "floor_divide": operator.floordiv, "mod": operator.mod, "pow": operator.pow,
    "eq": operator.eq, "ne": operator.ne, "lt": operator.lt, "le": operator.le, "gt": operator.gt,
    "ge": operator.ge, "neg": operator.neg, "abs": abs, "bitwise_and": operator.and_, "bitwise_or": operator.or_,
    "bitwise_xor": operator.xor, "logical_not": operator.not_, "convert_element_type": _convert_number,
}

_BINARY = frozenset({"add", "sub", "mul", "true_divide", "div", "eq", "ne", "lt", "le", "gt", "ge"})

_RANDOM_NAMES = ("rand", "randn", "randint", "randperm", "bernoulli", "multinomial", "normal", "uniform", "dropout",
                 "exponential", "geometric", "cauchy", "log_normal", "poisson")


def record_input(p, real) -> None:
    """Input proxy ``p`` of the trace being interpreted stands for the real object ``real`` (called when inputs are
    proxified): what a slice starts from. Held weakly where it can be (a tensor): the state outlives the trace, and
    must not keep the call's arguments alive."""
    state = _thunder_internals.jit_state()
    if state is not None and isinstance(p, Proxy):
        state.setdefault("real_inputs", {})[p.name] = (p, _held(real))


def _held(value) -> Callable[[], Any]:
    """A callable giving ``value`` back: a weak reference where ``value`` takes one."""
    try:
        return weakref.ref(value)
    except TypeError:  # a number, a string: small, held as it is
        return lambda: value


def _real_values(real_inputs: dict, names) -> list:
    return [real_inputs[n][1]() for n in names]


class _Step:
    """One bound symbol of a slice: ``fn`` called with ``args``/``kwargs`` in which ``_Ref(name)`` stands for the value
    of proxy ``name``; ``outs`` names the proxies its (flattened) result gives."""

    __slots__ = ("fn", "args", "kwargs", "outs", "name")

    def __init__(self, fn, args, kwargs, outs, name):
        self.fn, self.args, self.kwargs, self.outs, self.name = fn, args, kwargs, outs, name

    def __eq__(self, other) -> bool:
        return type(other) is _Step and (self.fn, self.args, self.kwargs, self.outs) == \
            (other.fn, other.args, other.kwargs, other.outs)

    __hash__ = None


class _Ref:
    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __eq__(self, other) -> bool:
        return type(other) is _Ref and other.name == self.name

    def __hash__(self) -> int:
        return hash(self.name)

    def __repr__(self) -> str:
        return self.name


class SpeculationSpec:
    """A value a trace speculated on: how to compute it from the trace's inputs (``inputs``: the names of the input
    proxies, in the order the check receives them; ``steps``; ``target``: the proxy whose value is converted by
    ``conversion``), the value seen when tracing (``expected``) and where (``site``: the user's file:line)."""

    __slots__ = ("inputs", "steps", "target", "conversion", "expected", "site", "compiled")

    def __init__(self, inputs: tuple, steps: tuple, target: str, conversion: str, expected: Any, site: str):
        self.inputs, self.steps, self.target = inputs, steps, target
        self.conversion, self.expected, self.site = conversion, expected, site
        # the steps compiled (flattened subclasses, thunder's executors), or None: the steps run eagerly
        self.compiled = None

    def __getstate__(self):  # an on-disk cache entry keeps the steps; the compiled function is made in this process
        return {name: getattr(self, name) for name in self.__slots__ if name != "compiled"}

    def __setstate__(self, state) -> None:
        for name, value in state.items():
            setattr(self, name, value)
        self.compiled = None

    def __repr__(self) -> str:
        return f"SpeculationSpec({self.conversion}({self.target}) == {self.expected!r} at {self.site})"

    def __eq__(self, other) -> bool:  # value equality: an on-disk cache entry stores a pickled copy
        return type(other) is SpeculationSpec and (self.inputs, self.steps, self.target, self.conversion, self.site) \
            == (other.inputs, other.steps, other.target, other.conversion, other.site) \
            and _same_value(self.expected, other.expected)

    __hash__ = None

    def evaluate(self, values) -> Any:
        """The speculated value for input values ``values`` (in ``inputs`` order), computed eagerly."""
        if self.compiled is not None:
            return _CONVERSIONS[self.conversion](self.compiled(*values)[0])
        env = dict(zip(self.inputs, values))

        def value_of(x):
            return env[x.name] if type(x) is _Ref else x

        with torch.no_grad(), _no_autocast():
            for step in self.steps:
                args, kwargs = tree_map(value_of, (step.args, step.kwargs))
                result = step.fn(*args, **kwargs)
                leaves = _result_leaves(result)
                if len(leaves) != len(step.outs):
                    raise RuntimeError(f"{step.name} gave {len(leaves)} values where the trace has {len(step.outs)}")
                env.update(zip(step.outs, leaves))
            return _CONVERSIONS[self.conversion](env[self.target])


def _no_autocast():
    from thunder_subclass.frontend.fake import autocast_context

    return autocast_context(())  # autocast off on every device, whatever the caller's state


def _result_leaves(result) -> list:
    from torch.utils._pytree import tree_leaves

    if isinstance(result, torch.Tensor):
        return [result]
    return tree_leaves(result)


def _same_value(a, b) -> bool:
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b))
    if type(a) is not type(b):
        return False
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return a == b


def _check_speculation_impl(spec: SpeculationSpec, inputs) -> None:
    try:
        value = spec.evaluate(inputs)
    except Exception as e:  # noqa: BLE001 - whatever the slice raises on these inputs, the trace does not hold
        error = e  # (`e` itself is unbound when the except clause ends, before explain runs)
        raise SubclassGuardFailure(
            explain=lambda: f"the value speculated at {spec.site} could not be computed "
                            f"({type(error).__name__}: {error})")
    if not _same_value(value, spec.expected):
        raise SubclassGuardFailure(
            explain=lambda: f"the value at {spec.site} ({spec.conversion} of data) was {spec.expected!r} when traced "
                            f"and is {value!r} now")


check_speculation = subclass_executor.register_operator(
    "check_speculation", meta=lambda spec, inputs: None, fn=_check_speculation_impl, tags=[prims.OpTags.DONT_DCE],
)


def is_unsafe(bsym, *, random: bool = True) -> bool:
    """An in-place (or, with ``random``, a random or side-effecting) operation, in the bound symbol or any of its
    subsymbols."""
    todo = [bsym]
    while todo:
        b = todo.pop()
        name = b.sym.name
        tags = b.sym.tags or ()
        if prims.OpTags.IN_PLACE in tags or (name.endswith("_") and not name.endswith("__")) \
                or b.sym.id == prims.PrimIDs.UPDATE_ALIASES:
            return True
        if random and (prims.OpTags.RANDOM_OP in tags or prims.OpTags.DONT_DCE in tags
                       or any(r in name for r in _RANDOM_NAMES)):
            return True
        todo.extend(b.subsymbols)
    return False


def _step_for(bsym) -> _Step | None:
    from thunder.core import devices, dtypes

    from thunder_subclass.frontend.recording import denormalize, torch_callable_for

    def template(x):
        if isinstance(x, Proxy):
            return _Ref(x.name)
        if isinstance(x, dtypes.dtype):
            return dtypes.to_torch_dtype(x)
        if isinstance(x, devices.Device):
            return devices.to_torch_device(x)
        return x

    outs = tuple(o.name for o in tree_flatten(bsym.output)[0] if isinstance(o, Proxy))
    flat_args = tree_flatten((bsym.args, bsym.kwargs))[0]
    if bsym.sym.name in _NUMBER_OPS and any(isinstance(a, NumberProxy) for a in flat_args) \
            and not any(isinstance(a, TensorProxy) for a in flat_args):
        fn = _NUMBER_OPS[bsym.sym.name]
        args, kwargs = tree_map(_number_type, (bsym.args, bsym.kwargs))
    elif bsym.sym.name in _BINARY and len(bsym.args) == 2 and isinstance(bsym.args[0], (NumberProxy, int, float)) \
            and isinstance(bsym.args[1], TensorProxy) and bsym.kwargs.get("alpha", 1) in (1, None) \
            and set(bsym.kwargs) <= {"alpha"}:
        # a number first (`n + t`): torch.add(n, t) takes no number there; Python's operator does (Tensor.__radd__)
        fn, args, kwargs = _NUMBER_OPS[bsym.sym.name], bsym.args, {}
    elif bsym.sym.id == subclass_item.id:
        fn, args, kwargs = torch.Tensor.item, bsym.args, bsym.kwargs
    else:
        if not _thunder_internals.is_torch_level_symbol(bsym.sym):
            return None
        try:
            fn = torch_callable_for(bsym.sym, bsym.args)
        except Exception:  # noqa: BLE001 - no torch function: not speculated
            return None
        args, kwargs = denormalize(bsym.sym, bsym.args, bsym.kwargs)
    args, kwargs = tree_map(template, (tuple(args), dict(kwargs)))
    return _Step(fn, args, kwargs, outs, bsym.sym.name)


def _number_type(x):
    """A dtype argument of a symbol on numbers as the Python type it converts to."""
    from thunder.core import dtypes

    if isinstance(x, dtypes.dtype):
        return dtypes.dtype_to_numbertype(x)
    return x


def _dim_size(t, dim: int) -> int:
    return t.shape[dim]


def _size_sources(real_inputs: dict) -> dict:
    """Name of a symbolic size -> (name of the input tensor proxy whose shape holds it, dim)."""
    sources = {}
    for name, (p, _) in real_inputs.items():
        for d, size in enumerate(getattr(p, "_shape", ()) if isinstance(p, TensorProxy) else ()):
            if isinstance(size, NumberProxy):
                sources.setdefault(size.name, (name, d))
    return sources


def _changed_fresh_tensors(trace) -> set[str] | None:
    """The names of the tensors the trace so far changed in place, when each is fresh: made in the trace by an
    operation that reads no tensor (``torch.arange``, ``torch.zeros``), or a new version of such a tensor; None when an
    in-place operation changes any other tensor (an input, a view, the result of an operation on tensors, which may
    alias an input). A fresh tensor aliases no input, so a value that does not read it is unaffected by the change
    (transformers 4.57's mask, ``kv_arange = torch.arange(n); kv_arange += offset``, before dynamic RoPE's branch)."""
    fresh: set[str] = set()
    changed: set[str] = set()
    for bsym in trace.bound_symbols:
        tensors = [a for a in bsym.flat_proxy_args if isinstance(a, TensorProxy)]
        outs = [o.name for o in tree_flatten(bsym.output)[0] if isinstance(o, TensorProxy)]
        if is_unsafe(bsym, random=False):
            if not tensors or any(a.name not in fresh for a in tensors):
                return None
            changed.update(a.name for a in tensors)
            changed.update(outs)
            fresh.update(outs)
        elif not tensors:
            fresh.update(outs)
    return changed


def _slice(target, trace, real_inputs: dict) -> tuple | None:
    """(input names, steps, bound symbols, number inputs) computing ``target`` from the trace's inputs, or None when it
    cannot be. None as soon as the trace so far changed in place a tensor other than a fresh one the value does not read
    (:func:`_changed_fresh_tensors`): the trace reads a tensor by the proxy it
    had before the change (thunder makes operations functional only after tracing), so the operations a value depends
    on are not those of its producers alone (an input, or a view of it, changed before the branch would give the
    prologue's value of the unchanged one)."""
    changed: set[str] = set()
    if _thunder_internals.trace_recorded(functools.partial(is_unsafe, random=False), "in_place_scan"):
        changed = _changed_fresh_tensors(trace)
        if changed is None:
            return None
    producers = {}
    for i, bsym in enumerate(trace.bound_symbols):
        for o in tree_flatten(bsym.output)[0]:
            if isinstance(o, Proxy):
                producers.setdefault(o.name, i)
    needed, inputs, todo = set(), [], [target.name]
    seen, sizes, extra = set(), [], {}
    number_inputs = {}
    for bsym in trace.bound_symbols:
        for a in bsym.flat_proxy_args:
            if isinstance(a, NumberProxy) and a.value is not None and getattr(a, "history", None) is not None:
                number_inputs.setdefault(a.name, a)
    size_sources = None
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in real_inputs:
            inputs.append(name)
            continue
        i = producers.get(name)
        if i is None and name in number_inputs:
            # a number read from the inputs (cache="symbolic values": a proxy the prologue unpacks, e.g. a module's
            # int attribute)
            real_inputs = {**real_inputs, name: (number_inputs[name], _held(number_inputs[name].value))}
            extra[name] = real_inputs[name]
            inputs.append(name)
            continue
        if i is None:
            # a symbolic size of an input (cache="symbolic values"): read from that input
            if size_sources is None:
                size_sources = _size_sources(real_inputs)
            source = size_sources.get(name)
            if source is None:
                return None
            sizes.append(_Step(_dim_size, (_Ref(source[0]), source[1]), {}, (name,), "size"))
            todo.append(source[0])
            continue
        bsym = trace.bound_symbols[i]
        if bsym.sym.id in (prims.PrimIDs.UNPACK_TRIVIAL, prims.PrimIDs.RETURN) or is_unsafe(bsym):
            return None
        needed.add(i)
        todo.extend(p.name for p in bsym.flat_proxy_args)
    if changed & seen:
        return None  # (a tensor changed in place that the value reads, by a view made before the change)
    steps = sizes
    for i in sorted(needed):
        step = _step_for(trace.bound_symbols[i])
        if step is None:
            return None
        steps.append(step)
    return tuple(sorted(inputs)), tuple(steps), [trace.bound_symbols[i] for i in sorted(needed)], extra


def _compile(spec: SpeculationSpec, bsyms: list, real_inputs: dict, target) -> None:
    """Compile the steps of ``spec`` (as a region of their own: the flatten pass, then the plugin's and thunder's
    executors), checked against the eager value; left eager where that fails."""
    from thunder_subclass.transforms.flatten import flatten_subclasses

    try:
        fn = _thunder_internals.region_callable(
            bsyms, [real_inputs[n][0] for n in spec.inputs], [target], "speculated_value",
            transform=flatten_subclasses, executors=(subclass_executor,))
        with torch.no_grad(), _no_autocast():
            value = _CONVERSIONS[spec.conversion](fn(*_real_values(real_inputs, spec.inputs))[0])
    except Exception:  # noqa: BLE001 - the eager steps stay
        return
    if _same_value(value, spec.expected):
        spec.compiled = fn


def speculate(target, conversion: str) -> Any:
    """The Python value ``conversion`` gives of proxy ``target`` (a tensor, or a number computed from tensor data) for
    the call being traced, with its prologue check added; :data:`NOT_SPECULATED` when it cannot be (module
    docstring: the data-dependency error follows, a graph break)."""
    from thunder.core.trace import get_tracectx

    jit_ctx = _thunder_internals.jit_context()
    state = _thunder_internals.jit_state()
    trace = get_tracectx()
    if jit_ctx is None or state is None or trace is None or len(trace.scopes) > 1:
        return NOT_SPECULATED
    real_inputs = state.get("real_inputs", {})
    found = _slice(target, trace, real_inputs)
    if found is None:
        return NOT_SPECULATED
    inputs, steps, bsyms, extra = found
    real_inputs = {**real_inputs, **extra}
    filename, lineno = _thunder_internals.source_location(skip_files=(__file__,))
    site = f"{filename}:{lineno}"
    counts = _site_counts()
    if counts is None:
        return NOT_SPECULATED
    key = (site, conversion, target.name)  # a line may convert several values
    limit = config.speculation_limit
    if limit is not None and counts.get(key, 0) >= limit:
        raise NotImplementedError(
            f"the value at {site} ({conversion} of a value computed from tensor data) took {limit} "
            f"different values on calls of this compiled function (each one traced, guarded by its prologue); it is "
            f"no longer speculated on: the code around it runs eagerly from now on (data dependency)")
    spec = SpeculationSpec(inputs, steps, target.name, conversion, None, site)
    try:
        from thunder_subclass.frontend.fake import real_execution

        with real_execution():
            value = spec.evaluate(_real_values(real_inputs, inputs))
    except Exception:  # noqa: BLE001 - the slice cannot run eagerly here: not speculated
        return NOT_SPECULATED
    if not _speculable(value, conversion):
        return NOT_SPECULATED
    spec.expected = value
    _compile(spec, bsyms, real_inputs, target)
    counts[key] = counts.get(key, 0) + 1
    # (the spec first: thunder compares a new constraint with each earlier one item by item, and a tuple of tensor
    # proxies compared with another would record an `==` operation)
    jit_ctx.add_constraint((check_speculation, spec, tuple(real_inputs[n][0] for n in inputs)))
    return value


def _site_counts() -> dict | None:
    """Values speculated per source line for the compiled function being traced (kept in its ``jit_record``)."""
    from thunder.core.compile_data import get_compile_data

    cd = get_compile_data()
    return None if cd is None else _thunder_internals.jit_record(cd).speculations


_CONVERTERS = {bool: "bool", int: "int", float: "float", operator.index: "index"}


def lookaside(fn, wrapped_args: tuple) -> Callable | None:
    """The interpreter lookaside for ``bool``/``int``/``float``/``operator.index`` of a tensor proxy or of a number
    proxy without a value, and ``.tolist()`` of a tensor proxy, when the value can be speculated (module docstring);
    else None."""
    if getattr(fn, "__module__", None) == "math" and callable(fn) and any(
            isinstance(unwrap_value(w), TensorProxy) for w in wrapped_args):
        return _math_of_tensors(fn, wrapped_args)
    if fn is round and len(wrapped_args) == 2:
        return _round_to_digits(wrapped_args)
    if type(fn) is Symbol and fn.id == "Tensor.tolist":  # thunder's symbol for it fails on fakes
        conversion = "tolist"
    else:
        conversion = _CONVERTERS.get(fn) if type(fn) is type or fn is operator.index else None
    if conversion is None or len(wrapped_args) != 1:
        return None
    from thunder.core.interpreter import interpreter_needs_wrap, unwrap

    v = unwrap(wrapped_args[0])
    if not (isinstance(v, TensorProxy) or (isinstance(v, NumberProxy) and v.value is None and conversion != "tolist")):
        return None
    try:
        value = speculate(v, "number" if isinstance(v, NumberProxy) else conversion)
    except NotImplementedError as e:  # the line's speculation limit: raised in the program, at its line
        error = e
        return lambda *args: _thunder_internals.raise_in_interpreter(error)
    if value is not NOT_SPECULATED and isinstance(v, NumberProxy):
        value = _CONVERSIONS[conversion](value)
    if value is NOT_SPECULATED:
        return None
    return interpreter_needs_wrap(lambda *args: value)


def unwrap_value(w):
    from thunder.core.interpreter import unwrap

    return unwrap(w)


def _math_of_tensors(fn, wrapped_args: tuple) -> Callable | None:
    """``math.exp(t)``, ``math.floor(t.sum())``, ``math.gcd(n, 4)`` of a one-element tensor proxy: eager converts the
    tensor to a Python number (``__float__``; ``__index__`` where the function takes integers) and calls the
    function. thunder registered the C function as an opaque operator whose meta ran it on a random tensor, and the
    trace kept that random result as a constant (measured: ``x * math.exp(x[0])`` wrong on every call). Here each
    tensor is converted as ``float(t)`` (``operator.index(t)`` for an integer tensor) is, speculated and guarded, and
    the function is called on the numbers; where a value cannot be speculated, a graph break (the data-dependence
    error ``float(t)`` raises then)."""
    from thunder.core import dtypes
    from thunder.core.interpreter import interpreter_needs_wrap

    values = []
    for w in wrapped_args:
        v = unwrap_value(w)
        if isinstance(v, TensorProxy):
            try:
                v = speculate(v, "index" if dtypes.is_exact_dtype(v.dtype) and v.dtype is not dtypes.bool8 else "float")
            except NotImplementedError as e:  # the line's speculation limit
                error = e
                return lambda *args: _thunder_internals.raise_in_interpreter(error)
            if v is NOT_SPECULATED:
                error = NotImplementedError(f"math.{getattr(fn, '__name__', fn)} of a tensor whose value cannot be "
                                            "known while tracing (data dependency)")
                return lambda *args: _thunder_internals.raise_in_interpreter(error)
        values.append(v)
    return interpreter_needs_wrap(lambda *args: fn(*values))


def _round_to_digits(wrapped_args: tuple) -> Callable | None:
    """``round(n, digits)`` of a number computed from tensor data (``round(loss.item(), 2)``): thunder's number
    proxies take no ``digits`` ("NumberProxy.__round__() takes 1 positional argument but 2 were given"); the number is
    speculated and guarded as ``float(n)`` would be, then rounded as eager rounds it."""
    from thunder.core.interpreter import interpreter_needs_wrap

    v, digits = (unwrap_value(w) for w in wrapped_args)
    if not (isinstance(v, NumberProxy) and v.value is None) or isinstance(digits, Proxy):
        return None
    try:
        value = speculate(v, "number")
    except NotImplementedError as e:  # the line's speculation limit
        error = e
        return lambda *args: _thunder_internals.raise_in_interpreter(error)
    if value is NOT_SPECULATED:
        return None
    return interpreter_needs_wrap(lambda *args: round(value, digits))


def _subclass_item_meta(t):
    return prims.item.meta(t)


# ``t.item()`` of a subclass tensor: a number proxy without value (as thunder's ``prims.item`` gives for a plain
# tensor), run at run time as ``t.item()`` on the subclass object (rebuilt from its inner tensors, through its
# ``__torch_dispatch__``); its value is known while tracing only where a branch speculates on it
subclass_item = subclass_executor.register_operator(
    "subclass_item", meta=_subclass_item_meta, fn=lambda t: t.item(),
)


def refuse_unknown_numbers(sym, args: tuple, kwargs: dict) -> None:
    """A subclass operation called with a number computed from tensor data (``x * s.item()`` on a subclass):
    ``__torch_dispatch__`` runs on fakes, which need the number. Raised as a data dependency (a graph break: the code
    runs eagerly), as the number has no value while tracing."""
    for a in tree_flatten((args, kwargs))[0]:
        if isinstance(a, NumberProxy) and a.value is None:
            from thunder_subclass.errors import format_location
            from thunder_subclass.frontend.recording import subclass_names

            where = format_location(*_thunder_internals.source_location(skip_files=(__file__,)))
            raise NotImplementedError(
                f"{sym.name} on {subclass_names(args, kwargs)} at {where} takes {a.name}, a number computed from "
                f"tensor data (e.g. by .item()): __torch_dispatch__ runs on fake tensors while tracing and needs its "
                f"value (data dependency)")


def item_of_subclass(sym, args: tuple, kwargs: dict) -> Any:
    """``t.item()`` of a subclass proxy (``ltorch.item``): a number proxy computed by :data:`subclass_item`, or
    :data:`NOT_SPECULATED` for other calls (dispatch is unrolled as usual, and ``.item()`` inside it is an error)."""
    if sym.name != "item" or len(args) != 1 or kwargs or not isinstance(args[0], SubclassTensorProxy):
        return NOT_SPECULATED
    return subclass_item(args[0])

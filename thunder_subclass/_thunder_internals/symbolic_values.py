"""thunder's ``cache="symbolic values"`` for plugin jits.

Plain inputs' sizes, subclass arguments' sizes and number inputs become NumberProxies whose values the prologue does
not check. Subclass operations run on fakes whose sizes are symbols of a torch ``ShapeEnv`` (:class:`ShapeSymbols`,
torch's ``torch/fx/experimental/symbolic_shapes.py``); what a run relied on becomes a prologue check
(:func:`add_size_guards`). Where that cannot be done, the operation runs on fakes of the current sizes and every
number that reaches it is pinned (:func:`pin_numbers`, called by ``thunder_subclass.frontend.fake`` where a proxy
becomes a fake: the input numbers it is computed from get a value check in the prologue). The hooks below fix what
thunder 0.2.6 itself gets wrong under symbolic values; each acts only for a plugin jit with that cache option:
``jit_ext.unpack_inputs`` (parameters tagged ``STATIC_MEMORY_LOCATION``: :func:`unpacked_parameters_tagged`, entered
by :mod:`.fixes`' hook of it), ``StringProxy``'s comparison methods
(inherited from ``Proxy``, which raises), and, through the ``general_jit_lookaside`` hook of :mod:`.tracing`,
thunder's bool lookaside (a number input used only in a branch is guarded; thunder reuses a stale trace),
list/tuple ``__getitem__`` with a number index, ``isinstance`` of a number proxy, ``len()`` whose ``__len__`` returns a
number proxy (pinned: transformers 5.x ``_PerLayerConfigView``), ``int()`` / ``float()`` of a number proxy (thunder
returns its value unchecked; the numbers are pinned).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any

from thunder_subclass._thunder_internals.plugin_state import is_plugin_active
from thunder_subclass._thunder_internals.size_conditions import AssumedSizes, SizeCondition  # noqa: F401
from thunder_subclass._thunder_internals.size_conditions import condition_check_symbol as _condition_check_symbol
from thunder_subclass._thunder_internals.thunder_state import (
    is_interpreting,
    jit_state,
    number_producer,
    trace_producers,
)


def _symbolic_values_active() -> bool:
    if not is_plugin_active():
        return False
    from thunder.core.compile_data import get_compile_data
    from thunder.core.options import CACHE_OPTIONS

    return get_compile_data().cache_option is CACHE_OPTIONS.SYMBOLIC_VALUES


def symbolic_values_active() -> bool:
    """Whether a plugin jit is tracing (or transforming) with ``cache="symbolic values"``."""
    try:
        return _symbolic_values_active()
    except Exception:  # noqa: BLE001 - no compile data (outside a jit)
        return False


def _is_input_number(v) -> bool:
    from thunder.core.jit_ext import should_register_for_prologue

    return v.history is not None and should_register_for_prologue(v.history)


def pin_input_numbers(v) -> None:
    """A prologue value check on every input number ``v`` is computed from (``v`` itself if it is one)."""
    import thunder.clang as clang
    from thunder.core.jit_ext import get_jit_ctx
    from thunder.core.proxies import NumberProxy

    ctx, producers, seen, stack = get_jit_ctx(), None, set(), [v]
    while stack:
        p = stack.pop()
        if p.name in seen:
            continue
        seen.add(p.name)
        if _is_input_number(p):
            if not p.is_dynamic():
                p.make_static_constrained()
            ctx.add_constraint((clang.check_number_type_and_value, p, p.value))
            continue
        producers = producers if producers is not None else trace_producers()
        b = producers.get(p.name)
        if b is not None:
            stack.extend(a for a in b.flat_proxy_args if isinstance(a, NumberProxy))


def pin_numbers(x) -> None:
    """Pin ``x`` (a number proxy, or a tensor proxy's sizes) before it becomes part of a fake run, where a plugin jit
    traces with ``cache="symbolic values"``: the traced program is valid only for these values."""
    from thunder.core.proxies import NumberProxy, TensorProxy

    if not is_interpreting() or not _symbolic_values_active():
        return
    if isinstance(x, NumberProxy) and x.value is not None:
        pin_input_numbers(x)
    elif isinstance(x, TensorProxy):
        for s in x._shape:
            if isinstance(s, NumberProxy) and s.value is not None:
                pin_input_numbers(s)


_STRING_PROXY_METHODS = ("__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__add__", "__mul__", "__rmul__",
                         "__mod__", "__rmod__")


def _string_proxy_method(name: str, original):
    # StringProxy (thunder/core/proxies.py, `class StringProxy(Proxy, str)`) defines __eq__, but Proxy's
    # NotImplementedError-raising __ne__, __lt__, ... come first in its MRO: under symbolic values a string attribute
    # reached from an input (config._attn_implementation) fails `!= "eager"` (transformers' attention). For a plugin
    # jit, str's behaviour on its value (no guard recorded, as for thunder's own __eq__).
    str_method = getattr(str, name)

    def method(self, *args):
        if not is_plugin_active():
            return original(self, *args)
        from thunder.core.proxies import StringProxy

        return str_method(self.value, *(a.value if isinstance(a, StringProxy) else a for a in args))

    method.__name__ = name
    return method


def _hook_string_proxy_method(name: str):
    return lambda original: _string_proxy_method(name, original)


class _TaggingUnpackParameter:
    """``prims.unpack_parameter`` whose bound outputs carry ``STATIC_MEMORY_LOCATION``."""

    def __init__(self, sym):
        self._sym = sym

    def bind(self, *args, output=None, **kwargs):
        from thunder.core.proxies import ProxyTag

        if output is not None and hasattr(output, "tags"):
            output.tags.add(ProxyTag.STATIC_MEMORY_LOCATION)
        return self._sym.bind(*args, output=output, **kwargs)

    def __getattr__(self, name):
        return getattr(self._sym, name)


@contextlib.contextmanager
def unpacked_parameters_tagged():
    """While thunder's ``jit_ext.unpack_inputs`` runs (its hook is :mod:`.fixes`'s, which enters this).
    Under symbolic values a parameter's sizes have provenance ``<param>.shape[i]``, so unpack_inputs unpacks the
    parameter as an intermediate (a fresh proxy) and then asserts it carries STATIC_MEMORY_LOCATION, which only the
    parameter's own proxy has: "Parameter was not tagged with STATIC_MEMORY_LOCATION" (``thunder.jit(nn.Linear(4, 4),
    cache="symbolic values")`` fails in 0.2.6). For a plugin jit with symbolic values, ``prims.unpack_parameter``
    tags its outputs meanwhile."""
    import thunder.core.prims as prims

    if not _symbolic_values_active():
        yield
        return
    saved = prims.unpack_parameter
    prims.unpack_parameter = _TaggingUnpackParameter(saved)
    try:
        yield
    finally:
        prims.unpack_parameter = saved


def _sequence_getitem_lookaside(original):
    """thunder's list/tuple ``__getitem__`` (``core/interpreter.py`` ``SequenceWrapperMethods.__getitem__``) accepts
    only ``int`` indices; under symbolic values an int attribute (``LlamaAttention.layer_idx``) is an IntegerProxy:
    "list indices must be integers or slices, not IntegerProxy" (transformers' ``self.layers[layer_idx]``). The index
    is pinned (a prologue check) and its value used."""
    from thunder.core.interpreter import WrappedValue, wrap_const
    from thunder.core.proxies import IntegerProxy

    def lookaside(self, idx, /):
        value = idx.value if isinstance(idx, WrappedValue) else idx
        if isinstance(value, IntegerProxy) and value.python_type is int:
            pin_input_numbers(value)
            idx = wrap_const(int(value.value))
        return original(self, idx)

    return lookaside


def _len_impl(obj):
    # what thunder's _len_lookaside interprets (core/interpreter.py), run by the interpreter
    if not hasattr(obj, "__len__"):
        raise TypeError(f"object of type '{type(obj).__name__}' has no len()")
    result = obj.__len__()
    if not isinstance(result, int):
        raise TypeError(f"'{type(result).__name__}' object cannot be interpreted as an integer")
    if result < 0:
        raise ValueError("__len__() should return >= 0")
    return result


def _len_lookaside(obj):
    """``len(obj)`` whose ``__len__`` returns an int read from an input, an IntegerProxy under symbolic values
    (transformers 5.x ``_PerLayerConfigView.__len__`` returns ``config.num_hidden_layers``): thunder's lookaside
    asserts an ``int`` ("AssertionError" in ``_len_lookaside``). ``len()`` is an int in CPython: the number is pinned
    (a prologue check) and its value returned."""
    from thunder.core.interpreter import INTERPRETER_SIGNALS, _interpret_call, unwrap, wrap_const
    from thunder.core.proxies import IntegerProxy

    result = _interpret_call(_len_impl, obj)
    if result is INTERPRETER_SIGNALS.EXCEPTION_RAISED:
        return result
    value = unwrap(result)
    if isinstance(value, IntegerProxy):
        pin_input_numbers(value)
        return wrap_const(int(value.value))
    return result


def _number_isinstance(obj, cls):
    # isinstance on a NumberProxy tests its Python value (its type is part of the number's identity in thunder's
    # caching); thunder answers False for isinstance(<IntegerProxy>, int), so transformers'
    # `slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep` indexes with a number
    return isinstance(obj.value, cls)


class _Name(str):
    """A proxy's name in a :class:`_Condition` step (as opposed to a constant string)."""


class _Condition:
    """A branch condition as a straight-line program over input numbers, re-evaluated by a prologue check on the
    call's numbers: steps ``(out, fn, args)`` whose args are input / earlier names or constants."""

    def __init__(self, inputs, steps, out, expected):
        self.inputs, self.steps, self.out, self.expected = inputs, steps, out, expected

    def __call__(self, *values) -> bool:
        env = dict(zip(self.inputs, values))
        for out, fn, args in self.steps:
            env[out] = fn(*(env[a] if isinstance(a, _Name) else a for a in args))
        return bool(env[self.out]) == self.expected

    def __repr__(self):
        return f"<condition {self.out} == {self.expected} over {self.inputs}>"


@functools.cache
def _number_ops() -> dict:
    import operator

    return {"add": operator.add, "sub": operator.sub, "mul": operator.mul, "eq": operator.eq, "ne": operator.ne,
            "lt": operator.lt, "le": operator.le, "gt": operator.gt, "ge": operator.ge,
            "floor_divide": operator.floordiv, "neg": operator.neg, "bitwise_and": operator.and_,
            "bitwise_or": operator.or_, "py_and": lambda a, b: a and b}


def _condition_program(v):
    """``(input proxies, _Condition)`` for ``v`` computed from input numbers by number prims only; None otherwise."""
    from thunder.core.proxies import NumberProxy, Proxy

    producers, ops = trace_producers(), _number_ops()
    inputs, steps, seen = {}, [], set()

    def visit(p) -> bool:
        if p.name in seen:
            return True
        seen.add(p.name)
        if _is_input_number(p):
            inputs[p.name] = p
            return True
        b = producers.get(p.name)
        if b is None or not b.sym.is_prim or b.sym.name not in ops or b.kwargs:
            return False
        args = []
        for a in b.args:
            if isinstance(a, NumberProxy):
                if not visit(a):
                    return False
                args.append(_Name(a.name))
            elif isinstance(a, Proxy):
                return False
            else:
                args.append(a)
        steps.append((p.name, ops[b.sym.name], tuple(args)))
        return True

    if not visit(v):
        return None
    names = list(inputs)
    return [inputs[n] for n in names], _Condition(names, steps, v.name, bool(v.value))


def _bool_lookaside(original):
    """thunder's bool lookaside (``core/jit_ext.py`` ``_general_jit_bool_lookaside``) makes a NumberProxy that
    control flow branches on static-constrained, but the prologue checks only numbers passed on to the computation
    or epilogue (``unpack_inputs``): an input number used only in a branch is not checked, and a trace made for one
    branch serves the other (transformers' ``DynamicLayer.update`` ``if not self.is_initialized``: prefill and decode
    would share a trace). The branch is guarded: an input number by its value; a number computed from input numbers
    by number prims as that condition, re-evaluated on the call's numbers (so ``kv_len + offset > 0`` does not pin
    each size); anything else pins the input numbers it depends on."""
    from thunder.core.proxies import NumberProxy

    def lookaside(wrapped_x):
        res = original(wrapped_x)
        v = wrapped_x.value
        if isinstance(v, NumberProxy) and v.is_static_constrained():
            import thunder.clang as clang
            from thunder.core.jit_ext import get_jit_ctx

            if _is_input_number(v):
                get_jit_ctx().add_constraint((clang.check_number_type_and_value, v, v.value))
                return res
            program = _condition_program(v)
            if program is None:
                pin_input_numbers(v)
                return res
            inputs, condition = program
            get_jit_ctx().add_constraint((_condition_check_symbol(), condition, *inputs))
            v.make_constrainable()  # the condition guard replaces thunder's pinning of every input it reads
        return res

    return lookaside


def symbolic_values_lookaside(fn, wrapped_args):
    """The lookaside of a symbolic-values fix for ``fn``, or None."""
    if not (fn is bool or fn is list.__getitem__ or fn is tuple.__getitem__ or fn is isinstance or fn is len
            or fn is float or fn is int):
        return None
    if not _symbolic_values_active():
        return None
    import thunder.core.interpreter as interpreter
    import thunder.core.jit_ext as jit_ext
    from thunder.core.proxies import NumberProxy

    if fn is bool:
        return _bool_lookaside(jit_ext._general_jit_lookaside_map[bool])
    if fn is len:
        return _len_lookaside
    if fn is list.__getitem__ or fn is tuple.__getitem__:
        return _sequence_getitem_lookaside(interpreter._default_provenance_tracking_lookaside_map[fn])
    if fn is isinstance and len(wrapped_args) == 2 and isinstance(interpreter.unwrap(wrapped_args[0]), NumberProxy):
        return interpreter.interpreter_needs_wrap(_number_isinstance)
    if (fn is float or fn is int) and len(wrapped_args) == 1:
        v = interpreter.unwrap(wrapped_args[0])
        if isinstance(v, NumberProxy) and v.value is not None:
            return interpreter.interpreter_needs_wrap(functools.partial(_number_conversion, fn))
    return None


def _number_conversion(fn, v):
    """``int(n)`` / ``float(n)`` of a number proxy: thunder's ``NumberProxy.__int__`` / ``__float__`` return the
    value as a constant, unchecked: ``torch.arange(float(n))`` was traced for the first call's ``n`` and served
    another (a shape error, or a wrong result where the shapes agree). ``int`` of an int proxy is the proxy itself;
    any other conversion pins the input numbers it depends on (a prologue check of their values)."""
    if fn is int and v.python_type is int:
        return v
    pin_input_numbers(v)
    return fn(v.value)


def hook_targets() -> list[tuple[Any, str, Callable]]:
    import thunder.core.proxies as proxies

    return [
        *((proxies.StringProxy, name, _hook_string_proxy_method(name)) for name in _STRING_PROXY_METHODS),
    ]


# ---------------------------------------------------------------------------------------------------------------
# Symbolic sizes in fake runs (torch's ShapeEnv)
# ---------------------------------------------------------------------------------------------------------------


_SAME_SIZE_AS = "_thunder_subclass_same_size_as"
# on an input size number: ``(q, k)``, it is input size number ``q`` plus the constant ``k`` by construction (a jagged
# NestedTensor's batch size is its offsets' length less one): fake runs give it that expression of ``q``'s symbol
_OFFSET_OF = "_thunder_subclass_offset_of"


def relate_size_by_offset(p, q, k: int) -> None:
    """Input size numbers ``p`` and ``q`` satisfy ``p == q + k`` by construction of the value they are read from (no
    call can break it: ``NestedTensor.shape[0]`` is computed as ``offsets.shape[0] - 1``): fake runs give ``p`` the
    expression ``symbol(q) + k``, so sizes of results computed from ``q`` map back to ``p`` and no guard relates
    them."""
    p.__dict__[_OFFSET_OF] = (q, int(k))


def guard_equal_sizes(pairs: list) -> None:
    """Input size numbers ``(p, q)`` that are equal (an inner tensor's size and its subclass input's outer size at the
    same dim): a prologue check that they stay equal, and fake runs give ``p`` the symbol of ``q``. Relations between
    them that a run relies on later (autograd checks a gradient's outer size against the input's, after the prologue
    is made) are then known."""
    import sympy

    pairs = [(p, q) for p, q in pairs if p.name != q.name]
    if not pairs:
        return
    from thunder.core.jit_ext import get_jit_ctx

    added = jit_state().setdefault(_SIZE_GUARDS, set())
    exprs = []
    for p, q in pairs:
        p.__dict__[_SAME_SIZE_AS] = q
        e = sympy.Eq(sympy.Symbol(p.name, integer=True), sympy.Symbol(q.name, integer=True))
        added.add(e)
        exprs.append(e)
    proxies = {}
    for p, q in pairs:
        proxies[p.name], proxies[q.name] = p, q
        p.__dict__[_SIZE_GUARDS] = q.__dict__[_SIZE_GUARDS] = added
    names = sorted(set().union(*(e.free_symbols for e in exprs)), key=str)
    get_jit_ctx().add_constraint(
        (_condition_check_symbol(), SizeCondition(names, exprs), *(proxies[n.name] for n in names))
    )


class SymbolicSizeError(Exception):
    """A fake run cannot keep these sizes symbolic: a size its results have is an expression no number proxy stands
    for, a number the ShapeEnv specialised or a guard it recorded came after the prologue was made. The caller runs
    the operation again on fakes of the current sizes (pinned), or, where it can no longer pin, refuses to trace
    with symbolic sizes."""


class ShapeSymbols:
    """The sizes of one environment of fake runs (``thunder_subclass.frontend.fake.FakeEnv``) as symbols of a torch
    ``ShapeEnv`` (torch/fx/experimental/symbolic_shapes.py): one symbol per size number proxy (no duck sizing: equal
    values are not assumed equal), with the proxy's value as hint; ``mode`` is a fake mode over that ShapeEnv (the
    fakes of the environment are made and run under it).

    What the runs rely on becomes a prologue check (:func:`add_size_guards`): the guards the ShapeEnv recorded
    (``Eq(s0, s1)`` from a matmul's inner dims, a branch on a size inside dispatch) and the range it assumed for
    each symbol (>= 2: it specialises 0 and 1, and those numbers are pinned). A size of a result maps back to a
    number proxy where it is a bare symbol, a constant, or a sum or product of those (:meth:`number`; otherwise
    :class:`SymbolicSizeError`).

    Owner: the FakeEnv that made it, and the copies of that environment (a backward recorded on a forward's fakes);
    freed with them."""

    def __init__(self):
        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        from thunder_subclass._thunder_internals.torch_state import fake_tensor_mode_class

        self.shape_env = ShapeEnv(duck_shape=False)
        self.mode = fake_tensor_mode_class()(allow_non_fake_inputs=True, shape_env=self.shape_env)
        self._symint: dict[str, Any] = {}  # number proxy name -> its SymInt (an int where specialised)
        self._proxy: dict[Any, Any] = {}  # sympy symbol -> number proxy
        self._specialised: list = []  # number proxies the ShapeEnv made constants (0, 1), not yet pinned
        self._new_symbols: list = []  # symbols whose range is not yet guarded
        self._guards_seen = 0
        self._nested: dict[int, Any] = {}  # id of a plain nested int -> its symbolic nested int here
        self._nested_symbols: set = set()  # their sympy symbols

    def nested_int(self, j):
        """The symbolic nested int standing for plain nested int ``j`` (an input jagged NestedTensor's ragged size) in
        this environment's fakes (made once; hint ``j``), as torch.compile's fakes have one: it multiplies with size
        symbols (a NestedTensor's stride ``j * D``), where a plain nested int cannot. Results' sizes map back to ``j``
        (:meth:`number`)."""
        from torch.nested._internal.nested_int import NestedIntNode

        if not isinstance(j.node, NestedIntNode):  # symbolic already (a fake output's size: its gradient's)
            return j
        key, coeff = j.node.nested_int(), j.node.nested_int_coeff()
        s = self._nested.get(key)
        if s is None:
            from torch._dynamo.source import ConstantSource

            base = j if coeff == 1 else None
            if base is None:
                raise SymbolicSizeError(f"the nested int {j} of an input has a coefficient")
            source = ConstantSource(f"nested_{key}_{len(self._nested)}")
            expr = self.shape_env.create_symbol(base, source)
            s = self._nested[key] = self.shape_env.create_symintnode(expr, hint=base, source=source)
            self._nested_symbols.add(expr)
        return s

    def nested_symbols(self) -> set:
        """The symbols of the symbolic nested ints made by :meth:`nested_int`."""
        return self._nested_symbols

    def _is_nested_multiple(self, expr) -> bool:
        import sympy

        if expr in self._nested_symbols:
            return True
        return isinstance(expr, sympy.Mul) and len(expr.args) == 2 and expr.args[0].is_Integer \
            and expr.args[1] in self._nested_symbols

    def knows(self, p) -> bool:
        same = p.__dict__.get(_SAME_SIZE_AS)
        return (same if same is not None else p).name in self._symint

    def symint(self, p):
        """The SymInt standing for size number proxy ``p`` in this environment's fakes (made once): for a number the
        trace computes from others by thunder's number prims (``i9 = prims.mul(i0, i1)``, a flattened size), that
        expression of theirs; else a new symbol."""
        same = p.__dict__.get(_SAME_SIZE_AS)
        if same is not None:  # guarded equal to another input number: one symbol for both
            return self.symint(same)
        s = self._symint.get(p.name)
        offset = p.__dict__.get(_OFFSET_OF)
        if s is None and offset is not None and not p.is_static_constrained():
            base, k = offset
            s = self.symint(base) + k if not base.is_static_constrained() else int(base.value) + k
            self._symint[p.name] = s
            if isinstance(s, torch_symint()):
                self._proxy.setdefault(self.shape_env.replace(s.node.expr), p)
            return s
        if s is None:
            s = self._computed_symint(p, 16)
            if s is not None:
                self._symint[p.name] = s
                if isinstance(s, torch_symint()):
                    self._proxy.setdefault(self.shape_env.replace(s.node.expr), p)
                return s
            import sympy
            from torch._dynamo.source import ConstantSource
            from torch.fx.experimental.symbolic_shapes import DimDynamic

            value = int(p.value)
            source = ConstantSource(f"{p.name}_{len(self._symint)}")
            expr = self.shape_env.create_symbol(value, source, dynamic_dim=DimDynamic.DYNAMIC)
            if isinstance(expr, sympy.Integer) or expr.is_number:
                s = value
                self._specialised.append(p)
            else:
                s = self.shape_env.create_symintnode(expr, hint=value, source=source)
                self._proxy[expr] = p
                self._new_symbols.append(expr)
            self._symint[p.name] = s
        return s

    def _computed_symint(self, p, depth: int):
        """The SymInt (or constant) thunder's number prims compute ``p`` as from size symbols: ``add`` / ``sub`` /
        ``mul`` / ``py_floordiv``, and the decomposition of a floor division thunder records for ``view(2, -1)``
        (``div`` rounding toward zero, less a correction that a ``signbit`` / ``fmod`` test computes), folded where
        the ShapeEnv decides the sign of the dividend; None where it cannot."""
        from thunder.core.prims import PrimIDs

        if depth <= 0 or p.history is not None:
            return None
        try:
            b = number_producer(p.name, lambda b: b.sym.id in _COMPUTED_OPS)
        except Exception:  # noqa: BLE001 - no trace being built
            return None
        if b is None or b.sym.id not in _COMPUTED_OPS or b.kwargs:
            return None
        if b.sym.id is PrimIDs.CONVERT_ELEMENT_TYPE:
            if len(b.args) != 2 or b.args[1] not in (int, bool):
                return None
            v = self._operand(b.args[0], depth)
            return b.args[1](v) if type(v) in (int, bool) else None
        if b.sym.id is PrimIDs.SIGNBIT:
            v = self._operand(b.args[0], depth) if len(b.args) == 1 else None
            return None if v is None else self._decided(v < 0)
        if len(b.args) != 2:
            return None
        x = self._operand(b.args[0], depth)
        if x is None or (b.sym.id is PrimIDs.BITWISE_AND and x is False):
            return False if x is False else None  # False & anything: the second operand is not needed
        y = self._operand(b.args[1], depth)
        if y is None:
            return None
        if b.sym.id in (PrimIDs.DIV, PrimIDs.FMOD):  # C-style: floor division / modulo where both are >= 0
            if type(y) is not int or y <= 0 or self._decided(x >= 0) is not True:
                return None
            return x // y if b.sym.id is PrimIDs.DIV else x % y
        if b.sym.id in (PrimIDs.EQ, PrimIDs.NE, PrimIDs.BITWISE_AND):
            v = _COMPUTED_OPS[b.sym.id](x, y)
            return v if type(v) is bool else self._decided(v)
        return _COMPUTED_OPS[b.sym.id](x, y)

    def _operand(self, a, depth: int):
        from thunder.core.proxies import NumberProxy

        if isinstance(a, NumberProxy):
            if a.is_static_constrained():
                return a.value
            if a.name in self._symint:
                return self._symint[a.name]
            v = self._computed_symint(a, depth - 1)
            if v is None:
                if a.history is None or type(a.value) is not int:
                    return None
                v = self.symint(a)
            return v
        return a if type(a) in (int, bool) else None

    def _decided(self, cond):
        """A SymBool (or bool) the ShapeEnv decides from what it knows of the symbols (their ranges), as a bool;
        None where it does not (no guard is added)."""
        import torch

        if not isinstance(cond, torch.SymBool):
            return bool(cond)
        import sympy

        v = self.shape_env._maybe_evaluate_static(cond.node.expr)
        if v is sympy.true:
            return True
        if v is sympy.false:
            return False
        return None

    def number(self, x, *, compute: bool = False, ragged_stride: bool = False):
        """The int or number proxy a size of a fake result stands for. A sum or product of symbols (``s0 * s1``
        from a flattening view, ``s0 + s1`` from a ``cat``) is, with ``compute``, a number proxy computed by
        thunder's number prims in the current scope (which runs them where the scope's symbols run), else, like
        any other expression, a :class:`SymbolicSizeError`. ``ragged_stride``: ``x`` is a stride of a jagged
        NestedTensor, which nothing reads as a number (``__tensor_unflatten__`` computes its strides, ``x.stride()``
        in traced code is refused): a symbolic nested int times sizes is the value it has for the traced sizes."""
        import torch

        if not isinstance(x, torch.SymInt):
            return int(x)
        expr = self.shape_env.replace(x.node.expr)
        if expr.is_number:
            return int(expr)
        if self._nested_symbols and expr.free_symbols & self._nested_symbols:
            # a ragged size (a multiple of an input's nested int), or a NestedTensor's stride (the nested int times
            # dense sizes, which are pinned: frontend.jagged): that multiple of the plain nested int
            if self._is_nested_multiple(expr) or ragged_stride:
                return x.node.hint
            raise SymbolicSizeError(f"a size of a result is {expr}: a ragged size times a symbolic size")
        p = self._proxy.get(expr)
        if p is not None:
            return p
        if compute:
            return self._computed(expr)
        raise SymbolicSizeError(f"a size of a result is {expr}, not a size of an argument")

    def _computed(self, expr):
        import sympy
        import thunder.core.prims as prims

        if expr.is_Integer:
            return int(expr)
        if expr.is_Symbol:
            p = self._proxy.get(expr)
            if p is None:
                raise SymbolicSizeError(f"{expr} stands for no number proxy")
            return p
        from torch.utils._sympy.functions import FloorDiv, Max, Min

        if isinstance(expr, FloorDiv):  # view(-1, 2): sizes // 2
            return prims.py_floordiv(self._computed(expr.args[0]), self._computed(expr.args[1]))
        if isinstance(expr, (Max, Min)) and len(expr.args) == 2:  # a stride max(1, size)
            a, b = expr.args
            first = self.shape_env._maybe_evaluate_static(sympy.Ge(a, b) if isinstance(expr, Max) else
                                                          sympy.Le(a, b))
            if first is not sympy.true and first is not sympy.false:  # decided by the traced sizes: a guard
                first = self.shape_env.evaluate_expr(sympy.Ge(a, b) if isinstance(expr, Max) else sympy.Le(a, b))
            return self._computed(a if first else b)
        if not isinstance(expr, (sympy.Add, sympy.Mul)):
            raise SymbolicSizeError(f"a size of a result is {expr}: not a sum, product or floor division of sizes")
        op = prims.add if isinstance(expr, sympy.Add) else prims.mul
        terms = [self._computed(a) for a in expr.args]
        acc = terms[0]
        for t in terms[1:]:
            acc = op(acc, t)
        return acc

    def take_guards(self) -> tuple[list, list, list]:
        """``(guards, symbol ranges, specialised proxies)`` recorded since the last call: the guard expressions,
        ``(symbol, lower, upper)`` of new symbols, and the number proxies the ShapeEnv made constants."""
        guards = [g.expr for g in self.shape_env.guards[self._guards_seen:]]
        self._guards_seen = len(self.shape_env.guards)
        ranges = []
        for s in self._new_symbols:
            r = self.shape_env.var_to_range.get(s)
            if r is not None:
                ranges.append((s, r.lower, r.upper))
        self._new_symbols = []
        specialised, self._specialised = self._specialised, []
        return guards, ranges, specialised

    def proxy_of(self, symbol):
        return self._proxy.get(symbol)

    def input_proxies(self) -> list:
        """The number proxies that have a symbol of their own here."""
        return list(self._proxy.values())


def size_computation(name: str, defined: set, depth: int = 8) -> list | None:
    """The bound symbols (``add`` / ``sub`` / ``mul`` / ``py_floordiv`` of numbers) that compute size number ``name``
    from the numbers in ``defined``, as the trace being built or the traces being differentiated hold them
    (``number_producer``), in order; None where it is not computed that way."""
    from thunder.core.prims import PrimIDs
    from thunder.core.proxies import NumberProxy

    ids = (PrimIDs.ADD, PrimIDs.SUB, PrimIDs.MUL, PrimIDs.PY_FLOORDIV)
    try:
        b = number_producer(name, lambda b: b.sym.id in ids)
    except Exception:  # noqa: BLE001 - no trace being built
        return None
    if b is None or depth <= 0 or b.kwargs:
        return None
    out: list = []
    for a in b.flat_proxy_args:
        if not isinstance(a, NumberProxy):
            return None
        if a.name in defined or any(o.name == a.name for c in out for o in c.flat_proxy_outs):
            continue
        sub = size_computation(a.name, defined, depth - 1)
        if sub is None:
            return None
        out.extend(sub)
    return [*out, b]


@functools.cache
def _computed_ops_table() -> dict:
    import operator

    from thunder.core.prims import PrimIDs

    return {PrimIDs.ADD: operator.add, PrimIDs.SUB: operator.sub, PrimIDs.MUL: operator.mul,
            PrimIDs.PY_FLOORDIV: operator.floordiv, PrimIDs.DIV: None, PrimIDs.FMOD: None,
            PrimIDs.EQ: operator.eq, PrimIDs.NE: operator.ne, PrimIDs.BITWISE_AND: operator.and_,
            PrimIDs.SIGNBIT: None, PrimIDs.CONVERT_ELEMENT_TYPE: None}


class _ComputedOps:
    # the number prims ShapeSymbols._computed_symint follows (a lazily built table: thunder is imported late)
    def __contains__(self, k):
        return k in _computed_ops_table()

    def __getitem__(self, k):
        return _computed_ops_table()[k]


_COMPUTED_OPS = _ComputedOps()


def torch_symint() -> type:
    import torch

    return torch.SymInt


def add_size_guards(symbols: ShapeSymbols) -> None:
    """The prologue checks for what the fake runs of ``symbols`` relied on since the last call: one condition over
    the input numbers the guards and ranges name (a relation another fake run of the trace already made a check for
    is not checked twice); numbers that are not inputs (computed from them) and numbers the ShapeEnv specialised
    are pinned. After the prologue is made (autodiff recording an operation again, a backward recorded on the
    forward's fakes), a relation no check holds yet is a :class:`SymbolicSizeError`."""
    import sympy

    if is_interpreting():
        _cover_input_sizes(symbols)
    guards, ranges, specialised = symbols.take_guards()
    # a guard on ragged sizes alone (``Ne(j, 1)``) holds for every call: nested ints compare alike with numbers, and
    # which inputs share one is checked by guards.tensors.check_nested_sizes
    exprs = [g for g in guards if not (g.free_symbols and g.free_symbols <= symbols.nested_symbols())]
    for s, lower, upper in ranges:
        if isinstance(lower, sympy.Integer):
            exprs.append(sympy.Ge(s, lower))
        if isinstance(upper, sympy.Integer):
            exprs.append(sympy.Le(s, upper))
    if not exprs and not specialised:
        return
    interpreting = is_interpreting()

    def pin(p) -> None:
        if interpreting:
            pin_input_numbers(p)
        elif not (_is_input_number(p) and p.is_static_constrained()):
            raise SymbolicSizeError(f"a fake run after the prologue was made relied on the value of {p.name}")

    for p in specialised:
        pin(p)
    free = sorted(set().union(*(e.free_symbols for e in exprs)), key=str) if exprs else []
    inputs, subs = [], {}
    for s in free:
        p = symbols.proxy_of(s)
        if p is None:
            raise SymbolicSizeError(f"a guard names {s}, which stands for no number proxy")
        if _is_input_number(p):
            inputs.append((s, p))
        else:  # computed from input numbers: pinned (those numbers checked by value), its value used
            pin(p)
            subs[s] = sympy.Integer(int(p.value))
    if not interpreting:  # input numbers pinned since the forward's run: their values are checked
        subs.update({s: sympy.Integer(int(p.value)) for s, p in inputs if p.is_static_constrained()})
    exprs = [e.xreplace(subs) for e in exprs]
    if any(e is sympy.false for e in exprs):
        raise SymbolicSizeError(f"a guard does not hold for the traced sizes: {exprs}")
    # in terms of the proxies' names: the same relation found by another fake run of the trace is checked once
    by_name = {s: sympy.Symbol(p.name, integer=True) for s, p in inputs}
    if interpreting:
        added = jit_state().setdefault(_SIZE_GUARDS, set())
    else:
        added = next((p.__dict__[_SIZE_GUARDS] for _, p in inputs if _SIZE_GUARDS in p.__dict__), set())
    fresh = []
    for e in exprs:
        key = e.xreplace(by_name)
        if key is not sympy.true and key not in added:
            fresh.append(key)
    if not fresh:
        return
    if not interpreting:
        assumed = next((p.__dict__[_ASSUMED] for _, p in inputs if _ASSUMED in p.__dict__), None)
        if assumed is None or not assumed.assume(fresh):
            raise SymbolicSizeError(
                "a fake run after the prologue was made relied on sizes: " + ", ".join(str(e) for e in fresh)
            )
        added.update(fresh)
        return
    added.update(fresh)
    for _, p in inputs:  # found again when autodiff records the operation again
        p.__dict__[_SIZE_GUARDS] = added
    from thunder.core.jit_ext import get_jit_ctx

    names = sorted(set().union(*(e.free_symbols for e in fresh)), key=str)
    proxies = {p.name: p for _, p in inputs}
    condition = SizeCondition(names, fresh)
    get_jit_ctx().add_constraint((_condition_check_symbol(), condition, *(proxies[n.name] for n in names)))


# the size relations a prologue check already holds: in the jit state while interpreting, and on the input number
# proxies they name (for autodiff, which records operations again after the prologue is made)
_SIZE_GUARDS = "_thunder_subclass_size_guards"
# the trace's AssumedSizes: in the jit state, and on the input number proxies it takes
_ASSUMED = "_thunder_subclass_assumed_sizes"


def _cover_input_sizes(symbols: ShapeSymbols) -> None:
    """The trace's :class:`AssumedSizes` check takes the input numbers ``symbols`` has symbols for (its constraint in
    thunder's jit context is replaced by one with the larger argument list: thunder builds the prologue from the
    list at the end of interpretation)."""
    from thunder.core.jit_ext import get_jit_ctx

    inputs = [p for p in symbols.input_proxies() if _is_input_number(p) and not p.is_static_constrained()]
    if not inputs:
        return
    state = jit_state()
    assumed = state.get(_ASSUMED)
    old = state.get(_ASSUMED + "_constraint")
    if assumed is None:
        assumed = state[_ASSUMED] = AssumedSizes()
    constraint = assumed.cover(inputs)
    if constraint is None:
        return
    ctx = get_jit_ctx()
    for p in inputs:
        p.__dict__[_ASSUMED] = assumed
    if old is not None:
        for i, c in enumerate(ctx._constraints):
            if c is old:
                ctx._constraints[i] = constraint
                break
        else:
            ctx.add_constraint(constraint)
    else:
        ctx.add_constraint(constraint)
    state[_ASSUMED + "_constraint"] = constraint

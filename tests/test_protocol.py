"""More of the subclass protocol: custom ops, mutation, nesting depth, tangent metadata hooks (issue 5)."""

import pytest
import thunder
import torch
from torch.utils._pytree import tree_flatten, tree_map

import thunder_subclass
from thunder_subclass import SubclassProtocolError, UnsupportedSubclassOperationError
from subclasses import ElemTensor, TwoTensor
from helpers import two
from test_training import _clone_leaf, assert_same, check_training

aten = torch.ops.aten


@torch.library.custom_op("thunder_subclass_tests::scale_add", mutates_args=())
def scale_add(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
    return x + alpha * y


@scale_add.register_fake
def _(x, y, alpha):
    return torch.empty_like(x)


@torch.library.custom_op("thunder_subclass_tests::no_fake", mutates_args=())
def no_fake(x: torch.Tensor) -> torch.Tensor:
    return x * 2


class CustomOpTensor(ElemTensor):
    """Wraps one tensor; ``add`` runs the custom op ``scale_add``, ``mul`` the custom op without a fake impl."""

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is aten.add.Tensor:
            x, y = (a.elem if isinstance(a, CustomOpTensor) else a for a in args[:2])
            return CustomOpTensor(torch.ops.thunder_subclass_tests.scale_add(x, y, float(kwargs.get("alpha", 1))))
        if func is aten.mul.Tensor:
            return CustomOpTensor(torch.ops.thunder_subclass_tests.no_fake(args[0].elem))
        return super().__torch_dispatch__(func, types, args, kwargs)


def test_custom_op_inside_dispatch_is_its_own_symbol():
    x, y = CustomOpTensor(torch.randn(4)), CustomOpTensor(torch.randn(4))
    jf = thunder_subclass.jit(lambda x, y: (x + y).sin())
    out, expected = jf(x, y), (x + y).sin()
    assert type(out) is CustomOpTensor
    torch.testing.assert_close(out.elem, expected.elem)
    names = [b.sym.name for b in thunder.last_traces(jf)[-1].bound_symbols]
    assert "thunder_subclass_tests_scale_add_default" in names  # runs the real implementation


def test_custom_op_without_fake_impl_names_it():
    x = CustomOpTensor(torch.randn(4))
    with pytest.raises(
        UnsupportedSubclassOperationError,
        match=r"custom operator thunder_subclass_tests::no_fake, called by CustomOpTensor .* has no fake "
        r"implementation.*register_fake\(\"thunder_subclass_tests::no_fake\"\)",
    ):
        thunder_subclass.jit(lambda x: x * 2)(x)


@pytest.mark.parametrize(
    "fn",
    [
        lambda x, y: (x.add_(1), x.mul_(y), x.sin())[-1],
        lambda x, y: x.copy_(y.a * 2).cos(),  # copy a plain tensor into a TwoTensor
        lambda x, y: x.copy_(y) * 2,
    ],
    ids=["add_-mul_", "copy_-plain", "copy_-subclass"],
)
def test_in_place_ops_change_the_callers_subclass(fn):
    x, y = two(4), two(4)
    ex, ey = _clone_leaf(x), _clone_leaf(y)
    out = thunder_subclass.jit(fn)(x, y)
    assert_same(out, fn(ex, ey))
    assert_same(x, ex)  # the caller's TwoTensor was updated in place, as in eager
    assert_same(y, ey)


def test_sgd_style_update_under_no_grad():
    def step(w, g):
        with torch.no_grad():
            w.add_(g, alpha=-0.1)
            return w * 1

    w, g = two(4).requires_grad_(), two(4)
    ew = _clone_leaf(w)
    out = thunder_subclass.jit(step)(w, g)
    assert_same(out, step(ew, g))
    assert_same(w.detach(), ew.detach())


def test_optimizer_step_of_subclass_parameters():
    # torch.optim.SGD's update of a TwoTensor parameter, compiled: w.add_(grad, alpha=-lr) under no_grad
    def sgd_step(params, grads):
        with torch.no_grad():
            for p, g in zip(params, grads):
                p.add_(g, alpha=-0.5)

    params = [two(3, 3).requires_grad_(), two(3).requires_grad_()]
    grads = [two(3, 3), two(3)]
    eparams = [_clone_leaf(p) for p in params]
    thunder_subclass.jit(sgd_step)(params, grads)
    sgd_step(eparams, grads)
    for p, ep in zip(params, eparams):
        assert_same(p.detach(), ep.detach())


def _deep(depth, *shape):
    if depth == 0:
        return torch.randn(*shape)
    return TwoTensor(_deep(depth - 1, *shape), _deep(depth - 1, *shape))


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_nested_subclasses_of_any_depth(depth):
    x, w = _deep(depth, 3, 4).requires_grad_(), _deep(depth, 4, 2).requires_grad_()
    jf = check_training(lambda x, w: ((x @ w).relu() + x.sum()).sum(), x, w)
    first = str(thunder.last_traces(jf)[0])
    assert first.count("TwoTensor[") >= 2 ** depth - 1  # every level shows in the proxies' types


class Tagged(torch.Tensor):
    """A tensor with a tag in its flatten context; multiplying by a number keeps the tag, other ops are plain.
    Incoming gradients with another tag are coerced to the expected one."""

    coerced: list = []

    @staticmethod
    def __new__(cls, data, tag):
        return torch.Tensor._make_wrapper_subclass(cls, data.shape, dtype=data.dtype, device=data.device)

    def __init__(self, data, tag):
        self.data_, self.tag = data, tag

    def __tensor_flatten__(self):
        return ["data_"], self.tag

    @staticmethod
    def __tensor_unflatten__(inner, tag, outer_size, outer_stride):
        return Tagged(inner["data_"], tag)

    def __coerce_same_metadata_as_tangent__(self, expected_metadata, expected_type=None):
        Tagged.coerced.append((self.tag, expected_metadata))
        return Tagged(self.data_, expected_metadata)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is aten.mul.Tensor and isinstance(args[0], Tagged) and isinstance(args[1], (int, float)):
            return Tagged(args[0].data_ * args[1], args[0].tag)
        if func in (aten.detach.default, aten.clone.default, aten.ones_like.default):
            return Tagged(func(args[0].data_, *args[1:], **kwargs), args[0].tag)
        args, kwargs = tree_map(lambda a: a.data_ if isinstance(a, Tagged) else a, (args, kwargs))
        return func(*args, **kwargs)


def test_coerce_same_metadata_as_tangent_is_used_for_incoming_gradients():
    Tagged.coerced.clear()
    x = Tagged(torch.randn(4), "fwd").requires_grad_()
    ex = Tagged(x.data_.clone(), "fwd").requires_grad_()
    jf = thunder_subclass.jit(lambda x: x * 2)
    out = jf(x)
    assert type(out) is Tagged and out.tag == "fwd"
    g = Tagged(torch.randn(4), "other")
    out.backward(g)
    assert Tagged.coerced == [("other", "fwd")]  # coerced to the metadata the backward was compiled for
    (ex * 2).backward(g)
    # values as eager (the tag is the coerced one, as with torch.compile)
    torch.testing.assert_close(x.grad.data_, ex.grad.data_)


def test_view_then_in_place_updates_base_as_eager():
    # TwoTensor's dispatch uses return_and_correct_aliasing: a view of a TwoTensor aliases it
    def f(x):
        v = x.view(16)
        v.mul_(2)
        return v, x + 0

    x = two(4, 4)
    ex = _clone_leaf(x)
    out, eout = thunder_subclass.jit(f)(x), f(ex)
    for a, e in zip(out, eout):
        assert_same(a, e)
    assert_same(x, ex)


class FunctionOverride(ElemTensor):
    """Overrides __torch_function__ (instead of disabling it): ``sin`` computes ``cos``."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is torch.Tensor.sin:
            func = torch.Tensor.cos
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))


def test_torch_function_override_is_respected():
    x = FunctionOverride(torch.randn(5))
    jf = thunder_subclass.jit(lambda t: t.sin() * 2)
    out, expected = jf(x), x.sin() * 2
    assert type(out) is FunctionOverride
    torch.testing.assert_close(out.elem, expected.elem)
    torch.testing.assert_close(out.elem, x.elem.cos() * 2)
    names = [b.sym.name for b in thunder.last_traces(jf)[-1].bound_symbols]
    assert "cos" in names and "sin" not in names


def test_symbolic_values_cache_reuses_one_trace_for_new_batch_sizes():
    # thunder 0.2.6 cache="symbolic values": thunder_subclass's fake runs have symbolic sizes (a ShapeEnv) and the
    # subclass input's guard checks what they relied on, so new batch sizes reuse the trace (see docs/limits.md)
    f = lambda t: (t * 2).sum(0)  # noqa: E731
    jf = thunder_subclass.jit(f, cache="symbolic values")
    for n in (3, 5, 3):
        x = two(n, 4)
        assert_same(jf(x), f(x))
    assert thunder.cache_misses(jf) == 1 and thunder.cache_hits(jf) == 2


# ---------------------------------------------------------------------------------------------------------------
# Opaque attributes (torch >= 2.11, as DeviceMesh): a class derived from torch's opaque base and registered as a
# reference type (torch 2.11-2.13: OpaqueBase + register_opaque_type(typ="reference"); torch >= 2.14:
# CustomClassBase + register_custom_class(typ="symbolic"), the old names deprecated in 2.15). torch 2.10 has none.
# ---------------------------------------------------------------------------------------------------------------

from thunder_subclass import TorchFeatureUnavailableError  # noqa: E402
from thunder_subclass._thunder_internals import opaque_attributes_supported  # noqa: E402

OPAQUE_ATTRIBUTES = opaque_attributes_supported()
needs_opaque_attributes = pytest.mark.skipif(
    not OPAQUE_ATTRIBUTES, reason=f"opaque reference attributes need torch >= 2.11 (found torch {torch.__version__})"
)


def _opaque_base_and_register():
    if not OPAQUE_ATTRIBUTES:
        return object, lambda cls, guard_fn: None
    try:
        from torch._custom_class_base import CustomClassBase
        from torch._library.opaque_object import register_custom_class
    except ImportError:
        from torch._library.opaque_object import register_opaque_type
        from torch._opaque_base import OpaqueBase

        return OpaqueBase, lambda cls, guard_fn: register_opaque_type(cls, typ="reference", guard_fn=guard_fn)
    return CustomClassBase, lambda cls, guard_fn: register_custom_class(cls, typ="symbolic", guard_fn=guard_fn)


_OpaqueBase, _register_opaque = _opaque_base_and_register()


class Mesh(_OpaqueBase):
    def __init__(self, size):
        self.size = size


_register_opaque(Mesh, guard_fn=lambda m: [m.size])


class MeshTensor(torch.Tensor):
    """A tensor placed on a Mesh (an opaque reference object listed by __tensor_flatten__); results keep the
    first argument's mesh."""

    @staticmethod
    def __new__(cls, elem, mesh):
        return torch.Tensor._make_wrapper_subclass(cls, elem.shape, dtype=elem.dtype, device=elem.device)

    def __init__(self, elem, mesh):
        self.elem, self.mesh = elem, mesh

    def __tensor_flatten__(self):
        return ["elem", "mesh"], None

    @staticmethod
    def __tensor_unflatten__(inner, ctx, outer_size, outer_stride):
        return MeshTensor(inner["elem"], inner["mesh"])

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        mesh = next(a.mesh for a in args if isinstance(a, MeshTensor))
        args, kwargs = tree_map(lambda a: a.elem if isinstance(a, MeshTensor) else a, (args, kwargs or {}))
        out = func(*args, **kwargs)
        return tree_map(lambda o: MeshTensor(o, mesh) if isinstance(o, torch.Tensor) else o, out)


def _on(mesh, requires_grad=False):
    return MeshTensor(torch.randn(4), mesh).requires_grad_(requires_grad)


@needs_opaque_attributes
def test_opaque_attribute_is_an_input_not_a_constant():
    f = lambda x, y: (x * y).sin()  # noqa: E731
    jf = thunder_subclass.jit(f)
    m1, m2 = Mesh(2), Mesh(2)
    x, y = _on(m1), _on(m1)
    out = jf(x, y)
    assert type(out) is MeshTensor and out.mesh is m1
    torch.testing.assert_close(out.elem, f(x, y).elem)
    assert "mesh: opaque Mesh" in str(thunder.last_traces(jf)[0])
    out2 = jf(_on(m2), _on(m2))  # another object, equal guard_fn values: same trace, that object out
    assert out2.mesh is m2
    assert thunder.cache_misses(jf) == 1 and thunder.cache_hits(jf) == 1


@needs_opaque_attributes
def test_opaque_guard_fn_value_change_is_a_cache_miss():
    jf = thunder_subclass.jit(lambda x: x * 2)
    jf(_on(Mesh(2)))
    m3 = Mesh(3)
    assert jf(_on(m3)).mesh is m3
    assert thunder.cache_misses(jf) == 2


@needs_opaque_attributes
def test_opaque_object_shared_by_two_inputs_stays_one_object():
    m = Mesh(4)
    out = thunder_subclass.jit(lambda x, y: x + y)(_on(m), _on(m))
    assert out.mesh is m


@needs_opaque_attributes
def test_opaque_attribute_with_backward():
    m = Mesh(2)
    x, y = _on(m, True), _on(m, True)
    ex, ey = MeshTensor(x.elem.clone(), m).requires_grad_(), MeshTensor(y.elem.clone(), m).requires_grad_()
    thunder_subclass.jit(lambda x, y: (x * y).sin().sum())(x, y).backward()
    (ex * ey).sin().sum().backward()
    assert type(x.grad) is MeshTensor and x.grad.mesh is m
    torch.testing.assert_close(x.grad.elem, ex.grad.elem)
    torch.testing.assert_close(y.grad.elem, ey.grad.elem)


@pytest.mark.skipif(OPAQUE_ATTRIBUTES, reason=f"torch {torch.__version__} has opaque reference attributes")
def test_opaque_attribute_without_torch_support_names_the_torch_version():
    with pytest.raises(TorchFeatureUnavailableError, match=r"MeshTensor.__tensor_flatten__ names attribute 'mesh' "
                       r"\(Mesh\).*need torch >= 2.11") as info:
        thunder_subclass.jit(lambda x: x * 2)(_on(Mesh(2)))
    assert info.value.needs_torch == "2.11"


class Placed(torch.Tensor):
    """A tensor with a placement in its context, like DTensor: ``partial`` outputs expect ``replicate``
    gradients (__coerce_tangent_metadata__), and gradients are converted between placements
    (__coerce_same_metadata_as_tangent__). Placement does not change values."""

    coerced_to: list = []

    @staticmethod
    def __new__(cls, data, placement):
        return torch.Tensor._make_wrapper_subclass(cls, data.shape, dtype=data.dtype, device=data.device)

    def __init__(self, data, placement):
        self.data_, self.placement = data, placement

    def __tensor_flatten__(self):
        return ["data_"], self.placement

    @staticmethod
    def __tensor_unflatten__(inner, placement, outer_size, outer_stride):
        return Placed(inner["data_"], placement)

    def __coerce_tangent_metadata__(self):
        return Placed(self.data_, "replicate") if self.placement == "partial" else self

    def __coerce_same_metadata_as_tangent__(self, expected_placement, expected_type=None):
        Placed.coerced_to.append(expected_placement)
        return Placed(self.data_, expected_placement)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        placement = next(a.placement for a in args if isinstance(a, Placed))
        if func is aten.sum.default:
            placement = "partial"  # a reduction leaves a partial result, as DTensor's sum over a sharded dim
        args, kwargs = tree_map(lambda a: a.data_ if isinstance(a, Placed) else a, (args, kwargs or {}))
        out = func(*args, **kwargs)
        return tree_map(lambda o: Placed(o, placement) if isinstance(o, torch.Tensor) else o, out)


def test_coerce_tangent_metadata_sets_the_compiled_gradient_kind():
    Placed.coerced_to.clear()
    x = Placed(torch.randn(4), "shard").requires_grad_()
    ex = Placed(x.data_.clone(), "shard").requires_grad_()
    jf = thunder_subclass.jit(lambda x: (x * x).sum())
    out = jf(x)
    assert type(out) is Placed and out.placement == "partial"
    bw = thunder.last_backward_traces(jf)[-1]
    flat = [b for b in bw.bound_symbols if b.sym.name == "flatten_cotangent_Placed"]
    assert len(flat) == 1 and flat[0].args[2] == "replicate"  # compiled for the coerced (replicate) gradient
    out.backward()  # the default gradient is a partial Placed (ones_like): coerced to replicate at run time
    assert Placed.coerced_to == ["replicate"]
    (ex * ex).sum().backward()
    torch.testing.assert_close(x.grad.data_, ex.grad.data_)


# ---------------------------------------------------------------------------------------------------------------
# A subclass that inherits its base's __tensor_unflatten__ (which rebuilds the base) and adds a __metadata_guard__,
# as PyTorch's own compile tests write it (issue 25): traced as what __tensor_unflatten__ rebuilds, as
# torch.compile does, guarded on its own type and with its own __metadata_guard__.
# ---------------------------------------------------------------------------------------------------------------


class CtxTensor(torch.Tensor):
    """A tensor with a constant in its flatten context; results carry the largest constant among the arguments,
    and ``mul`` doubles its result."""

    @staticmethod
    def __new__(cls, a, constant):
        return torch.Tensor._make_wrapper_subclass(cls, a.shape, strides=a.stride(), dtype=a.dtype, device=a.device,
                                                   requires_grad=a.requires_grad)

    def __init__(self, a, constant):
        self.a, self.constant = a, constant

    def __tensor_flatten__(self):
        return ["a"], (self.constant,)

    @staticmethod
    def __tensor_unflatten__(inner, meta, outer_size, outer_stride):
        return CtxTensor(inner["a"], meta[0])  # always the base class, also for a subclass that inherits this

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        biggest = max(a.constant for a in tree_flatten((args, kwargs))[0] if isinstance(a, CtxTensor))
        args, kwargs = tree_map(lambda t: t.a if isinstance(t, CtxTensor) else t, (args, kwargs or {}))
        out = tree_map(lambda t: CtxTensor(t, biggest) if isinstance(t, torch.Tensor) else t, func(*args, **kwargs))
        return out + out if func is aten.mul.Tensor else out


class CtxTensorAtLeast(CtxTensor):
    """Declares a trace made for constant c good for any constant >= c."""

    @classmethod
    def __metadata_guard__(cls, orig, other):
        return orig[0] <= other[0]


def test_inherited_tensor_unflatten_with_own_metadata_guard():
    f = lambda x: x * x  # noqa: E731
    jf = thunder_subclass.jit(f)
    x = CtxTensorAtLeast(torch.randn(3), 2)
    out, expected = jf(x), f(x)
    assert type(out) is CtxTensor and out.constant == 2  # eager's dispatch returns the base class
    assert_same(out, expected)
    first = str(thunder.last_traces(jf)[0])
    assert "x: \"CtxTensorAtLeast[" in first  # the input's own type, guarded as such
    # as torch.compile: a larger constant passes the class's own __metadata_guard__ (no new trace), a smaller not
    x2 = CtxTensorAtLeast(torch.randn(3), 3)
    torch.testing.assert_close(jf(x2).a, f(x2).a)
    assert thunder.cache_misses(jf) == 1 and thunder.cache_hits(jf) == 1
    x3 = CtxTensorAtLeast(torch.randn(3), 1)
    assert_same(jf(x3), f(x3))
    assert thunder.cache_misses(jf) == 2
    # the base class itself is another type: a new trace, never the subclass's
    assert_same(jf(CtxTensor(x.a, 2)), f(CtxTensor(x.a, 2)))
    assert thunder.cache_misses(jf) == 3


class CtxTensorDoubledAdd(CtxTensor):
    """Inherits the base's __tensor_unflatten__ (which rebuilds a CtxTensor) but changes behaviour: its own
    __torch_function__ doubles every add. Traced as its base, the doubling was silently lost."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        out = super().__torch_function__(func, types, args, kwargs or {})
        return out * 2 if func is torch.Tensor.add else out


def test_inherited_tensor_unflatten_of_a_class_that_adds_behaviour_is_a_protocol_error():
    x = CtxTensorDoubledAdd(torch.randn(3), 2)
    f = lambda x: x + 1  # noqa: E731
    assert not torch.equal(f(x).a, f(CtxTensor(x.a, 2)).a)  # eager: its own __torch_function__ changes the result
    with pytest.raises(SubclassProtocolError, match=r"CtxTensorDoubledAdd.__tensor_unflatten__ returned a CtxTensor, "
                                                    r"not a CtxTensorDoubledAdd.*test_protocol.py:\d+"):
        thunder_subclass.jit(f)(x)


def test_inherited_tensor_unflatten_input_returned_and_differentiated():
    x = CtxTensorAtLeast(torch.randn(3), 2)
    assert thunder_subclass.jit(lambda x: x)(x) is x  # an input returned is the caller's object, as in eager
    a = torch.randn(3, requires_grad=True)
    ea = a.detach().clone().requires_grad_()
    f = lambda x: (x.sin() * x).sum()  # noqa: E731
    x, ex = CtxTensorAtLeast(a, 2), CtxTensorAtLeast(ea, 2)
    out, expected = thunder_subclass.jit(f)(x), f(ex)
    assert_same(out.detach(), expected.detach())
    out.backward()
    expected.backward()
    assert_same(x.grad, ex.grad)


# ---------------------------------------------------------------------------------------------------------------
# Inner tensors that require grad themselves (issue 25): eager code reading x.a differentiates to the caller's a
# (a.grad, or through a's own history), apart from what reaches x; the read is an input of its own.
# ---------------------------------------------------------------------------------------------------------------


def _leaves(n, *shape):
    return [torch.randn(*shape, requires_grad=True) for _ in range(n)]


def _check_inner_grads(f, make):
    """``f`` eagerly and compiled, each on what ``make()`` builds (the value, its autograd leaves): equal outputs,
    and equal gradients (values and types) on the value and on each leaf."""
    torch.manual_seed(0)
    ex, eleaves = make()
    torch.manual_seed(0)
    x, leaves = make()
    jf = thunder_subclass.jit(f)
    expected, out = f(ex), jf(x)
    assert_same(out.detach(), expected.detach())
    expected.backward()
    out.backward()
    assert_same(x.grad, ex.grad)
    for got, want in zip(leaves, eleaves):
        assert_same(got.grad, want.grad)
    return jf


def test_inner_leaf_that_requires_grad_gets_its_gradient():
    def make():
        a, b = _leaves(2, 3)
        return TwoTensor(a, b), [a, b]

    jf = _check_inner_grads(lambda x: (x.a * 2 + x.b.sin()).sum(), make)
    assert thunder.cache_misses(jf) == 1
    x, (a, b) = make()
    jf(x).backward()  # new leaves, same trace: the prologue unpacks x.a and x.b from the new x
    torch.testing.assert_close(a.grad, torch.full((3,), 2.0))
    torch.testing.assert_close(b.grad, b.detach().cos())
    assert thunder.cache_misses(jf) == 1 and thunder.cache_hits(jf) == 1


def test_inner_reads_and_subclass_operations_differentiate_apart():
    # (x * 2) reaches x (a leaf: x.grad), x.a reaches a: as in eager
    def make():
        a, b = _leaves(2, 3)
        return TwoTensor(a, b), [a, b]

    _check_inner_grads(lambda x: (x * 2).sum() + x.a.sum(), make)


def test_nested_subclass_with_inner_leaves():
    def make():
        a, b, c, d = _leaves(4, 3)
        x = TwoTensor(TwoTensor(a, b), TwoTensor(c, d))
        return x, [x.a, a, b, c, d]  # x.a is itself a leaf TwoTensor that requires grad

    _check_inner_grads(lambda x: (x.a * 3).sum() + x.b.b.sum(), make)
    _check_inner_grads(lambda x: (x.a.a * 2 + x.b.sin()).sum(), make)


def test_inner_tensor_with_history_differentiates_through_it():
    def make():
        (w,) = _leaves(1, 3)
        a = w * 2  # not a leaf: eager differentiates through it to w
        return TwoTensor(a, a.detach().clone().requires_grad_()), [w]

    _check_inner_grads(lambda x: (x.a.exp() * x.b).sum(), make)


# ---------------------------------------------------------------------------------------------------------------
# __coerce_tangent_metadata__ that changes the gradient's type (issue 25)
# ---------------------------------------------------------------------------------------------------------------

from torch.testing._internal.subclasses import WrapperSubclass  # noqa: E402


class _TangentAs(WrapperSubclass):
    """torch's WrapperSubclass (its __coerce_same_metadata_as_tangent__ converts to a plain tensor or a TwoTensor)
    whose outputs expect gradients of another type, ``TANGENT``: "plain" or "two"."""

    TANGENT = "plain"

    def __coerce_tangent_metadata__(self):
        a = self.a.contiguous()
        return a if self.TANGENT == "plain" else TwoTensor(a, a.clone())

    @staticmethod
    def __tensor_unflatten__(inner, meta, outer_size, outer_stride):
        return _TangentAs(inner["a"], outer_size, outer_stride)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        args, kwargs = tree_map(lambda t: t.a if isinstance(t, _TangentAs) else t, (args, kwargs or {}))
        return tree_map(lambda t: _TangentAs(t) if isinstance(t, torch.Tensor) else t, func(*args, **kwargs))


class _TangentAsTwo(_TangentAs):
    TANGENT = "two"

    @staticmethod
    def __tensor_unflatten__(inner, meta, outer_size, outer_stride):
        return _TangentAsTwo(inner["a"], outer_size, outer_stride)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        args, kwargs = tree_map(lambda t: t.a if isinstance(t, _TangentAs) else t, (args, kwargs or {}))
        return tree_map(lambda t: _TangentAsTwo(t) if isinstance(t, torch.Tensor) else t, func(*args, **kwargs))


def _grad_of(cls, f, grad, jit):
    torch.manual_seed(0)
    x = cls(torch.randn(4)).requires_grad_()
    out = (thunder_subclass.jit(f) if jit else f)(x)
    out.backward(grad() if grad is not None else None)
    return out, x.grad


@pytest.mark.parametrize("f, grad", [
    (lambda x: (x * 2).sum(), None),  # the default gradient: a _TangentAs of ones
    (lambda x: x.sin(), lambda: _TangentAs(torch.ones(4))),  # of the output's type: a backward made for it runs
    (lambda x: x.sin(), lambda: torch.ones(4)),  # the expected plain gradient
    (lambda x: x.sin(), lambda: TwoTensor(torch.ones(4), torch.ones(4))),
], ids=["default", "own-type", "plain", "TwoTensor"])
def test_coerce_tangent_metadata_to_a_plain_gradient(f, grad):
    # torch.compile fails here ('FakeTensor' object has no attribute '__tensor_flatten__'); eager's gradients
    out, g = _grad_of(_TangentAs, f, grad, jit=True)
    eout, eg = _grad_of(_TangentAs, f, grad, jit=False)
    assert_same(out.detach(), eout.detach())
    assert_same(g, eg)


def test_coerce_tangent_metadata_to_another_subclass():
    # as torch.compile (aot_eager gives the same TwoTensor): the compiled backward expects a TwoTensor gradient, so
    # the default gradient (a _TangentAsTwo of ones) is coerced to one by __coerce_same_metadata_as_tangent__ and the
    # gradient is a TwoTensor of eager's values (eager's is a _TangentAsTwo)
    f = lambda x: x.sin() * 2  # noqa: E731
    grad = lambda: _TangentAsTwo(torch.ones(4))  # noqa: E731
    jf = thunder_subclass.jit(f)
    torch.manual_seed(0)
    x = _TangentAsTwo(torch.randn(4)).requires_grad_()
    jf(x).backward(grad())
    bw = thunder.last_backward_traces(jf)[-1]
    assert any(b.sym.name == "flatten_cotangent_TwoTensor" for b in bw.bound_symbols)
    _, eg = _grad_of(_TangentAsTwo, f, grad, jit=False)
    assert type(x.grad) is TwoTensor
    assert_same(x.grad.a, eg)
    assert_same(x.grad.b, eg)


@pytest.mark.parametrize("grad", [lambda: torch.ones(4), lambda: TwoTensor(two(4), two(4))], ids=["plain", "nested"])
def test_gradient_of_another_kind_passing_straight_through(grad):
    # x + 1: the input's gradient is the incoming one itself; a gradient of another kind than the output's runs a
    # backward made for it, in which that gradient is an argument returned as is (was a KeyError)
    torch.manual_seed(0)
    g = grad()
    x = two(4).requires_grad_()
    ex = _clone_leaf(x)
    thunder_subclass.jit(lambda x: x + 1)(x).backward(g)
    (ex + 1).backward(g)
    assert_same(x.grad, ex.grad)


@pytest.mark.parametrize("cls", [_TangentAs, _TangentAsTwo])
@pytest.mark.parametrize("f", [lambda x: x + 1, lambda x: x.clone()], ids=["add", "clone"])
def test_coerced_tangent_type_and_a_gradient_passing_through(cls, f):
    # an output whose compiled gradient type differs (__coerce_tangent_metadata__), a plain gradient given, and a
    # derivative that passes it through: the backward made for the plain gradient returns it (was KeyError: 't9')
    out, g = _grad_of(cls, f, lambda: torch.ones(4), jit=True)
    eout, eg = _grad_of(cls, f, lambda: torch.ones(4), jit=False)
    assert_same(out.detach(), eout.detach())
    assert_same(g, eg)


class PartlyCoercible(Tagged):
    """A Tagged whose ``__coerce_same_metadata_as_tangent__`` cannot convert a gradient tagged "foreign" (returns
    None): eager never asks it and accepts such a gradient; the compiled function must too."""

    @staticmethod
    def __tensor_unflatten__(inner, tag, outer_size, outer_stride):
        return PartlyCoercible(inner["data_"], tag)

    def __coerce_same_metadata_as_tangent__(self, expected_metadata, expected_type=None):
        return None if self.tag == "foreign" else PartlyCoercible(self.data_, expected_metadata)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is aten.mul.Tensor and isinstance(args[0], PartlyCoercible) and isinstance(args[1], (int, float)):
            return PartlyCoercible(args[0].data_ * args[1], args[0].tag)
        if func in (aten.detach.default, aten.clone.default, aten.ones_like.default):
            return PartlyCoercible(func(args[0].data_, *args[1:], **kwargs), args[0].tag)
        args, kwargs = tree_map(lambda a: a.data_ if isinstance(a, PartlyCoercible) else a, (args, kwargs))
        return func(*args, **kwargs)


def test_gradient_that_coercion_refuses_is_accepted_as_eager():
    x = PartlyCoercible(torch.randn(4), "fwd").requires_grad_()
    ex = PartlyCoercible(x.data_.clone(), "fwd").requires_grad_()
    jf = thunder_subclass.jit(lambda x: x * 2)
    g = PartlyCoercible(torch.randn(4), "foreign")
    jf(x).backward(g)
    (ex * 2).backward(g)
    assert type(x.grad) is type(ex.grad)
    torch.testing.assert_close(x.grad, ex.grad)

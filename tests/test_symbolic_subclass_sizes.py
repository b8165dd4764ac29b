"""Sizes of subclass values stay symbolic under ``cache="symbolic values"`` (issue 25): subclass operations run on
fakes whose sizes are symbols of a torch ShapeEnv, what dispatch relied on about them becomes a prologue check, and
an operation that cannot keep them symbolic runs on fakes of the current sizes, pinned (a new trace per size).

Every test compares values, types (and gradients) with eager and counts traces exactly."""

import pytest
import thunder
import torch

import thunder_subclass
from subclasses import ElemTensor, ScaledTensor, TwoTensor
from helpers import assert_same


def _two(n: int, m: int = 4, requires_grad: bool = False) -> TwoTensor:
    return TwoTensor(torch.randn(n, m, requires_grad=requires_grad), torch.randn(n, m, requires_grad=requires_grad))


def _counts(jf) -> tuple[int, int]:
    return thunder.cache_misses(jf), thunder.cache_hits(jf)


def _counts_over_sizes(f, sizes, make=_two) -> tuple[int, int]:
    """``f`` jitted with symbolic values, called on ``make(n)`` for each size ``n`` and compared with eager; its
    (cache misses, cache hits)."""
    jf = thunder_subclass.jit(f, cache="symbolic values")
    for n in sizes:
        x = make(n)
        assert_same(jf(x), f(x))
    return _counts(jf)


def test_elementwise_ops_on_new_batch_sizes_trace_once():
    f = lambda x: (x * 2 + 1).sin()  # noqa: E731
    assert _counts_over_sizes(f, (3, 5, 7, 9)) == (1, 3)


def test_matmul_with_a_plain_weight_traces_once():
    w = torch.randn(4, 6)
    f = lambda x: x @ w  # noqa: E731
    assert _counts_over_sizes(f, (3, 5, 7)) == (1, 2)


def test_the_plain_weight_may_change_size_too():
    f = lambda x, w: x @ w  # noqa: E731
    jf = thunder_subclass.jit(f, cache="symbolic values")
    for n, k in ((3, 6), (5, 2), (7, 9)):
        x, w = _two(n), torch.randn(4, k)
        assert_same(jf(x, w), f(x, w))
    assert _counts(jf) == (1, 2)


def test_sum_and_mean_over_dims_trace_once():
    f = lambda x: x.sum(0) + x.mean(1).sum() + x.sum(dim=1, keepdim=True).mean(0)  # noqa: E731
    assert _counts_over_sizes(f, (3, 5, 7)) == (1, 2)


def test_views_whose_sizes_are_sums_and_products_of_sizes_trace_once():
    f = lambda x: torch.cat([x.flatten(), x[:, :2].flatten()]) * 2  # noqa: E731  (n*4 + n*2)
    assert _counts_over_sizes(f, (3, 5, 7)) == (1, 2)


def test_a_transposed_value_keeps_its_layout_in_later_operations():
    # x.t() * 2 is a transposed TwoTensor: the reshape after it copies (a view would fail when the trace runs)
    f = lambda x: (x.t() * 2).reshape(-1) + x[:, 1:3].sum()  # noqa: E731
    assert _counts_over_sizes(f, (3, 5, 7)) == (1, 2)


def test_training_with_backward_traces_once():
    def f(x, w):
        return ((x @ w).sin() * 2).sum(0).sum()

    jf = thunder_subclass.jit(f, cache="symbolic values")
    _check_training(jf, f, [(n, 4) for n in (3, 5, 7)], lambda n, m: torch.randn(4, 3))
    assert _counts(jf) == (1, 2)


@pytest.mark.parametrize("jit_kwargs", [{"dynamic": True}, {"cache": "symbolic values"}])
@pytest.mark.parametrize("flat", ["view", "flatten"])
def test_backward_through_a_view_of_computed_size_traces_once(jit_kwargs, flat):
    # view(-1) / flatten() give a size computed from the input sizes (i0 * i1); the grad rules' fake runs, made after
    # the prologue, find how it is computed (thunder_state.differentiating) instead of relying on its value
    def f(x):
        return (x.clone().view(-1).sin() if flat == "view" else (x.flatten() * 2).sin()).sum()

    jf = thunder_subclass.jit(f, **jit_kwargs)
    for n in (3, 5, 7):
        a, b = torch.randn(n, 4), torch.randn(n, 4)
        x = TwoTensor(a.clone().requires_grad_(), b.clone().requires_grad_())
        x_ref = TwoTensor(a.clone().requires_grad_(), b.clone().requires_grad_())
        out, expected = jf(x), f(x_ref)
        assert_same(out, expected)
        out.backward()
        expected.backward()
        assert_same(x.grad, x_ref.grad)
    assert _counts(jf) == (1, 2)


def test_a_size_of_one_is_a_new_trace():
    # the ShapeEnv specialises sizes 0 and 1 (a size-1 dim broadcasts): a trace holds for sizes >= 2, and a trace
    # made for size 1 pins it
    f = lambda x, y: x * y + 1  # noqa: E731
    jf = thunder_subclass.jit(f, cache="symbolic values")
    for n in (3, 5, 1, 1, 6):
        x, y = _two(n), _two(n)
        assert_same(jf(x, y), f(x, y))
    assert _counts(jf) == (2, 3)


def test_a_non_contiguous_input_is_a_new_trace():
    f = lambda x: x * 2  # noqa: E731
    jf = thunder_subclass.jit(f, cache="symbolic values")
    x = _two(3)
    assert_same(jf(x), f(x))
    a, b = torch.randn(4, 5), torch.randn(4, 5)
    transposed = TwoTensor(a.t(), b.t())  # (5, 4), strides (1, 5): its fakes would have other strides
    out = jf(transposed)
    assert_same(out, f(transposed))
    assert out.stride() == f(transposed).stride()
    assert _counts(jf) == (2, 0)


def test_a_scaled_tensor_input_of_new_sizes_traces_once():
    # ScaledTensor computes on data * factor and returns plain tensors; its factor is in the flatten context
    f = lambda x: (x * 1.0).sum(0)  # noqa: E731
    assert _counts_over_sizes(f, (3, 5, 7), make=lambda n: ScaledTensor(torch.randn(n, 4), 2.0)) == (1, 2)


class _SizeBranchTensor(ElemTensor):
    """Dispatch branches on a size: ``mul`` doubles the result for more than 4 rows (eager does the same)."""

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if func is torch.ops.aten.mul.Tensor and out.elem.shape[0] > 4:
            return cls(out.elem * 2)
        return out


def test_dispatch_that_branches_on_a_size_is_guarded_by_the_condition():
    f = lambda x: x * 3  # noqa: E731
    jf = thunder_subclass.jit(f, cache="symbolic values")
    for n in (3, 4, 6, 8, 2):  # n > 4 is False, False, True, True, False
        x = _SizeBranchTensor(torch.randn(n, 4))
        out, expected = jf(x), f(x)
        assert type(out) is _SizeBranchTensor
        torch.testing.assert_close(out.elem, expected.elem)
    assert _counts(jf) == (2, 3)


class _IntSizeTensor(ElemTensor):
    """Dispatch reads a size as a Python int (``int(shape[0])``) and builds a tensor from it: the trace holds for
    that size only."""

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if func is torch.ops.aten.mul.Tensor:
            rows = int(out.elem.shape[0])
            return cls(out.elem + torch.arange(rows, dtype=out.elem.dtype).unsqueeze(1))
        return out


def test_dispatch_that_reads_a_size_as_an_int_pins_it():
    f = lambda x: x * 3  # noqa: E731
    jf = thunder_subclass.jit(f, cache="symbolic values")
    for n in (3, 5, 3, 5):
        x = _IntSizeTensor(torch.randn(n, 4))
        out, expected = jf(x), f(x)
        torch.testing.assert_close(out.elem, expected.elem)
    assert _counts(jf) == (2, 2)


def test_a_size_that_is_a_floor_division_of_sizes_traces_once():
    # view(-1, 2) of an (n, 4) value has n * 4 // 2 rows: a number computed by py_floordiv of the sizes (the
    # ShapeEnv's guard that n * 4 is even is a prologue check), one trace for all sizes, with eager's values
    f = lambda x: x.view(-1, 2) + 1  # noqa: E731
    assert _counts_over_sizes(f, (3, 5, 3, 5, 7)) == (1, 4)


@pytest.mark.parametrize("dynamic_kwargs", [{}, {"dynamic": True}])
def test_automatic_and_explicit_dynamic_shapes(dynamic_kwargs):
    f = lambda x: (x @ torch.ones(4, 2)).relu()  # noqa: E731
    jf = thunder_subclass.jit(f, **dynamic_kwargs)
    for n in (2, 3, 4, 5):
        x = _two(n)
        assert_same(jf(x), f(x))
    # automatic: the first trace is exact, the second (after a size-driven miss) symbolic
    assert _counts(jf) == ((2, 2) if not dynamic_kwargs else (1, 3))


def test_a_module_trained_on_subclass_inputs_of_new_batch_sizes_traces_once():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    reference = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    reference.load_state_dict(model.state_dict())
    jmodel = thunder_subclass.jit(model, cache="symbolic values")
    for n in (3, 5, 7):
        a, b = torch.randn(n, 4), torch.randn(n, 4)
        x = TwoTensor(a.clone().requires_grad_(), b.clone().requires_grad_())
        x_ref = TwoTensor(a.clone().requires_grad_(), b.clone().requires_grad_())
        out, expected = jmodel(x), reference(x_ref)
        assert_same(out, expected)
        out.sum().backward()
        expected.sum().backward()
        assert_same(x.grad, x_ref.grad)
    for p, q in zip(model.parameters(), reference.parameters()):
        assert_same(p.grad, q.grad)
    assert _counts(jmodel) == (1, 2)


def test_nested_subclass_inputs_trace_once():
    # a TwoTensor of TwoTensors: the nested values' outer sizes are symbolic too
    f = lambda x: (x * 2).sum(0) + x.mean()  # noqa: E731
    jf = thunder_subclass.jit(f, cache="symbolic values")
    for n in (3, 5, 7):
        x = TwoTensor(TwoTensor(torch.randn(n, 4), torch.randn(n, 4)), TwoTensor(torch.randn(n, 4), torch.randn(n, 4)))
        out, expected = jf(x), f(x)
        assert type(out) is type(expected)
        for attr in ("a", "b"):
            assert_same(getattr(out, attr), getattr(expected, attr))
    assert _counts(jf) == (1, 2)


def test_a_quantized_weight_argument_of_new_sizes_traces_once():
    # QuantizedWeight: int8 data (out, in) and a per-row scale (out,); dispatch dequantizes to float32
    from subclasses import quantize

    f = lambda x, w: torch.nn.functional.linear(x, w) * 2  # noqa: E731
    jf = thunder_subclass.jit(f, cache="symbolic values")
    for n, out_features in ((3, 5), (4, 6), (7, 5), (2, 9)):
        x, w = torch.randn(n, 8), quantize(torch.randn(out_features, 8))
        out, expected = jf(x, w), f(x, w)
        assert out.dtype == expected.dtype
        assert_same(out, expected)
    assert _counts(jf) == (1, 3)


def _dtensor(mesh, t, placement):
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(t, mesh, [placement], run_check=False)


def test_dtensor_inputs_of_new_sizes_trace_once(mesh):
    # a DTensor's flatten context holds its size and strides (TensorMeta): the trace holds them as the call's
    from torch.distributed.tensor import Replicate, Shard

    f = lambda x, w: ((x @ w).sin() * 2).sum(0)  # noqa: E731
    jf = thunder_subclass.jit(f, cache="symbolic values")
    for n, k in ((3, 2), (5, 2), (7, 3)):
        x, w = _dtensor(mesh, torch.randn(n, 4), Shard(0)), _dtensor(mesh, torch.randn(4, k), Replicate())
        out, expected = jf(x, w), f(x, w)
        assert type(out) is type(expected) and out.placements == expected.placements
        assert out.shape == expected.shape and out.stride() == expected.stride()
        torch.testing.assert_close(out.to_local(), expected.to_local())
    assert _counts(jf) == (1, 2)


def test_dtensor_training_of_new_sizes_traces_once(mesh):
    from torch.distributed.tensor import Shard

    def f(x):
        return (x * x).sum(1).mean()

    jf = thunder_subclass.jit(f, cache="symbolic values")
    for n in (3, 5, 7):
        local = torch.randn(n, 4)
        leaf, leaf_ref = local.clone().requires_grad_(), local.clone().requires_grad_()
        x, x_ref = _dtensor(mesh, leaf, Shard(0)), _dtensor(mesh, leaf_ref, Shard(0))  # (from_local: not leaves)
        out, expected = jf(x), f(x_ref)
        assert type(out) is type(expected)
        torch.testing.assert_close(out.to_local(), expected.to_local())
        out.backward()
        expected.backward()
        torch.testing.assert_close(leaf.grad, leaf_ref.grad)
    assert _counts(jf) == (1, 2)


def test_a_module_flag_that_is_a_number_proxy_is_passed_as_its_value():
    # nn.ReLU reads self.inplace (False), a number proxy under symbolic values: it reached TensorBase.relu as an
    # argument ("takes no arguments (1 given)"); now dropped as the default it equals, and checked by the prologue
    m = torch.nn.ReLU()
    jm = thunder_subclass.jit(m, cache="symbolic values")
    for n in (3, 5, 7):
        x = _two(n)
        assert_same(jm(x), m(x))
    assert _counts(jm) == (1, 2)


def _train_step(f, x_parts, w):
    """Two independent copies of the leaves ``(x, w)`` requiring grad, one for the compiled call and one for eager:
    ``x`` a TwoTensor of ``x_parts`` (or the plain ``x_parts[0]``), ``w`` a copy of ``w``."""
    def leaves():
        xs = [p.clone().requires_grad_() for p in x_parts]
        return (TwoTensor(*xs) if len(xs) == 2 else xs[0]), w.clone().requires_grad_()

    return leaves(), leaves()


def _check_training(jf, f, sizes, make_w, two: bool = True):
    for n, m in sizes:
        parts = [torch.randn(n, m) for _ in range(2 if two else 1)]
        (x, w), (x_ref, w_ref) = _train_step(f, parts, make_w(n, m))
        out, expected = jf(x, w), f(x_ref, w_ref)
        assert_same(out, expected)
        out.backward()
        expected.backward()
        assert_same(x.grad, x_ref.grad)
        torch.testing.assert_close(w.grad, w_ref.grad)


def _floor_division_view(x, w):
    return (x.view(-1, 2) @ w.view(2, -1)).sum()


def _repeat_by_a_size(x, w):
    return (x.view(-1) * w.view(-1).repeat(x.shape[0])).sum()


@pytest.mark.parametrize("two", [True, False], ids=["TwoTensor", "plain"])
@pytest.mark.parametrize("jit_kwargs", [{"dynamic": True}, {"cache": "symbolic values"}])
def test_backward_through_a_floor_division_view_traces_once(jit_kwargs, two):
    # x.view(-1, 2) has (n * m) // 2 rows and w.view(2, -1) a floor-divided size too: the forward keeps them
    # symbolic (py_floordiv of the sizes), and what the backward's fake runs rely on about them (view's stride
    # arithmetic) is added to the prologue's checks of this trace
    jf = thunder_subclass.jit(_floor_division_view, **jit_kwargs)
    _check_training(jf, _floor_division_view, ((3, 4), (5, 4), (2, 6)), lambda n, m: torch.randn(4, 2), two)
    assert _counts(jf) == (1, 2)


@pytest.mark.parametrize("two", [True, False], ids=["TwoTensor", "plain"])
def test_backward_through_repeat_by_a_size_traces_once_per_row_length(two):
    jf = thunder_subclass.jit(_repeat_by_a_size, dynamic=True)
    _check_training(jf, _repeat_by_a_size, ((3, 4), (5, 4), (7, 4)), lambda n, m: torch.randn(m), two)
    assert _counts(jf) == (1, 2)


def test_a_call_breaking_what_the_backward_assumed_is_a_new_trace():
    # the first trace's backward relied on relations of w's sizes (view's stride arithmetic for w.view(2, -1) in
    # the backward, where w's first size is not 2): a w of shape (2, 4) is a cache miss and a new trace, as eager
    from thunder_subclass._thunder_internals.symbolic_values import AssumedSizes

    jf = thunder_subclass.jit(_floor_division_view, dynamic=True)
    _check_training(jf, _floor_division_view, ((3, 4), (5, 4)), lambda n, m: torch.randn(4, 2))
    assumed = [a for b in thunder.last_prologue_traces(jf)[-1].bound_symbols for a in b.args
               if isinstance(a, AssumedSizes)]
    assert len(assumed) == 1 and assumed[0].exprs
    assert not assumed[0](*(2 if p.value == 4 and n == "i6" else p.value for n, p in assumed[0].proxies.items()))
    _check_training(jf, _floor_division_view, ((5, 4),), lambda n, m: torch.randn(2, 4))
    assert _counts(jf) == (2, 1)


def _redistributed(mesh):
    from torch.distributed.tensor import Replicate

    return lambda x: (x.redistribute(mesh, [Replicate()]) * 2).sin()


def _from_local(mesh):
    from torch.distributed.tensor import DTensor, Shard

    return lambda t: DTensor.from_local(t * 2, mesh, [Shard(0)], run_check=False).sin()


@pytest.mark.parametrize("case", ["redistribute", "from_local", "cat"])
def test_dtensor_results_with_a_backward_trace_once_under_dynamic_sizes(mesh, case):
    # a DTensor result that requires grad: its gradient's flatten context differs only in requires_grad, so the
    # backward is compiled for the result's symbolic sizes (it raised "coerced to another kind" before)
    from torch.distributed.tensor import DTensor, Shard

    if case == "cat":
        f = lambda a, b: torch.cat([a, b]) * 2  # noqa: E731
    else:
        f = _redistributed(mesh) if case == "redistribute" else _from_local(mesh)
    jf = thunder_subclass.jit(f, dynamic=True)
    for n in (3, 5, 7):
        tensors = [torch.randn(n + i, 4) for i in range(2 if case == "cat" else 1)]
        leaves, leaves_ref = ([t.clone().requires_grad_() for t in tensors] for _ in range(2))

        def args(ls):
            return ls if case == "from_local" else [DTensor.from_local(t, mesh, [Shard(0)], run_check=False)
                                                     for t in ls]

        out, expected = jf(*args(leaves)), f(*args(leaves_ref))
        assert type(out) is DTensor and out.placements == expected.placements and out.shape == expected.shape
        torch.testing.assert_close(out.to_local(), expected.to_local())
        (out.to_local() * torch.arange(out.numel()).view(out.shape)).sum().backward()
        (expected.to_local() * torch.arange(expected.numel()).view(expected.shape)).sum().backward()
        for leaf, ref in zip(leaves, leaves_ref):
            torch.testing.assert_close(leaf.grad, ref.grad)
    # torch 2.10's DTensor sharding propagation pins the symbolic sizes it sees (the cat's total: "Eq(i0 + i8, 7)"), so
    # there each size is a trace of its own, with eager's values (docs/limits.md); 2.11 and later keep one trace
    assert _counts(jf) == ((1, 2) if torch.__version__ >= "2.11" else (3, 0))

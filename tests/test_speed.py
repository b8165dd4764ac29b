"""Per-call speed work (issue 18), asserted as behaviour: the flattened program's rewrites give eager's exact values,
and every guard of the fused prologue and of the faster cache-info still makes a changed input a cache miss."""

import pytest
import thunder
import torch
from torch import nn
from torch.testing._internal.custom_tensor import ConstantExtraMetadataTensor
from torch.testing._internal.two_tensor import TwoTensor

import thunder_subclass
from thunder_subclass._thunder_internals import record_of
from helpers import cache_counts
from thunder_subclass.guards.prologue import check_prologue, fuse_prologue_checks


def _exact(a, b):
    assert type(a) is type(b)
    if isinstance(a, TwoTensor):
        torch.testing.assert_close(a.a, b.a, rtol=0, atol=0)
        torch.testing.assert_close(a.b, b.b, rtol=0, atol=0)
    else:
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def _linear_stack(layers=4, width=16, bias=True):
    m = nn.Sequential(*[nn.Linear(width, width, bias=bias) for _ in range(layers)])
    for lin in m:
        w = lin.weight.detach()
        lin.weight = nn.Parameter(TwoTensor(w, w.clone() * 0.5), requires_grad=False)
        if bias:
            lin.bias.requires_grad_(False)
    return m


def _execution_text(jf):
    return str(thunder.last_traces(jf)[-1])


# ---------------------------------------------------------------------------------------------------------------
# rewrites in the flattened program
# ---------------------------------------------------------------------------------------------------------------


def test_linear_on_twotensor_weights_runs_as_linear_with_eager_values():
    m = _linear_stack()
    jm = thunder_subclass.jit(m)
    x = torch.randn(2, 16)
    with torch.no_grad():
        out, expected = jm(x), m(x)
    _exact(out, expected)
    text = _execution_text(jm)
    # TwoTensor's dispatch of F.linear is t + addmm per inner tensor: recorded as one linear each
    assert text.count("torch.nn.functional.linear(") == 8
    assert "aten_addmm" not in text and "permute" not in text


def test_addmm_with_beta_or_alpha_stays_generic_and_equal():
    w, b = TwoTensor(torch.randn(4, 4), torch.randn(4, 4)), torch.randn(4)

    def f(x):
        return torch.addmm(b, x, w.t(), beta=2.0), torch.addmm(b, x, w.t(), alpha=0.5)

    x = torch.randn(3, 4)
    jf = thunder_subclass.jit(f)
    for got, want in zip(jf(x), f(x)):
        _exact(got, want)
    assert _execution_text(jf).count("aten_addmm_default(") == 4


def test_addmm_of_a_matrix_that_is_not_a_transpose_is_exact():
    w, b = TwoTensor(torch.randn(4, 5), torch.randn(4, 5)), torch.randn(5)

    def f(x):
        return torch.addmm(b, x, w)  # mat2 is not a transpose made in the trace: no linear

    x = torch.randn(3, 4)
    jf = thunder_subclass.jit(f)
    _exact(jf(x), f(x))


def test_linear_with_transposed_input_weight_and_backward_match_eager():
    w = TwoTensor(torch.randn(6, 4), torch.randn(6, 4)).requires_grad_()
    b = torch.randn(6, requires_grad=True)

    def f(x):
        return torch.nn.functional.linear(x, w, b).sum()

    x = torch.randn(3, 4)
    jf = thunder_subclass.jit(f)
    out = jf(x)
    out.backward()
    gw, gb = w.grad, b.grad
    w.grad = b.grad = None
    expected = f(x)
    expected.backward()
    _exact(out.detach(), expected.detach())
    _exact(gw, w.grad)
    _exact(gb, b.grad)


def test_bmm_on_twotensor_is_matmul_with_eager_values():
    def f(a, c):
        return torch.bmm(a, c)

    a = TwoTensor(torch.randn(2, 3, 4), torch.randn(2, 3, 4))
    c = TwoTensor(torch.randn(2, 4, 5), torch.randn(2, 4, 5))
    jf = thunder_subclass.jit(f)
    _exact(jf(a, c), f(a, c))
    assert "aten_bmm" not in _execution_text(jf)


# ---------------------------------------------------------------------------------------------------------------
# the fused prologue: one check, the same guards
# ---------------------------------------------------------------------------------------------------------------


def _fused(jf):
    final = thunder.last_prologue_traces(jf)[-1]
    return [b for b in final.bound_symbols if b.sym.id == check_prologue.id]


def test_prologue_checks_are_fused_into_one():
    m = _linear_stack()
    jm = thunder_subclass.jit(m)
    with torch.no_grad():
        jm(torch.randn(2, 16))
    (fused,) = _fused(jm)
    text = str(thunder.last_prologue_traces(jm)[-1])
    for name in ("check_subclass(", "check_tensor_metadata(", "check_number_type_and_value(", "check_plain_tensor("):
        assert name not in text
    if thunder_subclass._thunder_internals.dict_version_reader() is not None:
        assert "= read_module(module0, " in text  # the module's reads: once per write (guards/unpack_cache.py)
    else:  # no dict version tags (not CPython 3.11): thunder's unpacking, unchanged
        assert "module.get_parameter('0.weight')" in text
    checks = fused.args[1]
    assert len(checks.conditions) > 20 and "def fused_prologue_checks" in checks.source


def _miss_after(jf, first_call, second_call):
    first_call()
    misses = thunder.cache_misses(jf)
    second_call()
    return thunder.cache_misses(jf) - misses


@pytest.mark.parametrize("change", ["training", "in_features", "bias_requires_grad", "weight_inner_requires_grad",
                                    "parameter_attribute"])
def test_changed_module_state_is_a_miss(change):
    m = _linear_stack(layers=2)
    jm = thunder_subclass.jit(m)
    x = torch.randn(2, 16)
    with torch.no_grad():
        jm(x)
        jm(x)
        assert thunder.cache_misses(jm) == 1
        if change == "training":
            m.eval()
        elif change == "in_features":
            m[0].in_features = 17  # read by nn.Linear.forward? no, but checked as thunder does
        elif change == "bias_requires_grad":
            m[0].bias.requires_grad_(True)
        elif change == "weight_inner_requires_grad":  # in place: the jitted module holds the same objects
            m[1].weight.a.requires_grad_(True)
            m[1].weight.b.requires_grad_(True)
        elif change == "parameter_attribute":
            m[1].weight.__dict__["_thunder_subclass_test_attr"] = 1
        out, expected = jm(x), m(x)
    if change in ("in_features", "parameter_attribute"):
        # a module attribute thunder checks / an instance attribute the trace does not read
        assert thunder.cache_misses(jm) == (2 if change == "in_features" else 1)
    else:
        assert thunder.cache_misses(jm) == 2
    _exact(out, expected)


def test_changed_subclass_argument_is_a_miss():
    def f(x, w):
        return torch.nn.functional.linear(x, w)

    jf = thunder_subclass.jit(f)
    x, w = torch.randn(2, 4), torch.randn(3, 4)
    cases = [TwoTensor(w, w * 2), w, TwoTensor(w.double(), w.double())]
    for i, wi in enumerate(cases):
        xi = x.double() if wi.dtype == torch.float64 else x
        _exact(jf(xi, wi), f(xi, wi))
        assert thunder.cache_misses(jf) == i + 1
    _exact(jf(x, cases[0]), f(x, cases[0]))
    assert thunder.cache_misses(jf) == 3


def test_changed_input_metadata_and_type_are_misses():
    m = _linear_stack(layers=2)
    jm = thunder_subclass.jit(m)
    with torch.no_grad():
        jm(torch.randn(2, 16))
        jm(torch.randn(3, 16))
        assert thunder.cache_misses(jm) == 2
        x = TwoTensor(torch.randn(2, 16), torch.randn(2, 16))
        _exact(jm(x), m(x))
        assert thunder.cache_misses(jm) == 3
        jm(torch.randn(2, 16))
        assert thunder.cache_misses(jm) == 3  # the first entry again


def test_grad_mode_autocast_and_default_dtype_are_guarded():
    m = _linear_stack(layers=2)
    jm = thunder_subclass.jit(m)
    x = torch.randn(2, 16)
    with torch.no_grad():
        jm(x)
    jm(x)  # grad enabled: another entry
    assert thunder.cache_misses(jm) == 2
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = jm(x)
    assert thunder.cache_misses(jm) == 3
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = m(x)
    assert out.dtype == expected.dtype == torch.bfloat16
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        with torch.no_grad():
            jm(x)
    finally:
        torch.set_default_dtype(default)
    assert thunder.cache_misses(jm) == 4
    with torch.no_grad():
        jm(x)
    assert thunder.cache_misses(jm) == 4


def test_flatten_context_change_is_a_miss_through_the_fused_check():
    def f(x):
        return x * x.constant_attribute

    jf = thunder_subclass.jit(f)
    c = ConstantExtraMetadataTensor(torch.randn(3))
    _exact(jf(c), f(c))
    assert len(_fused(jf)) == 1
    c2 = ConstantExtraMetadataTensor(torch.randn(3))
    c2.constant_attribute = 5
    _exact(jf(c2), f(c2))
    assert thunder.cache_misses(jf) == 2


def test_aliased_arguments_still_grouped():
    def f(a, b):
        a.add_(1)
        return a + b

    jf = thunder_subclass.jit(f)
    x, y = torch.randn(3), torch.randn(3)
    jf(x.clone(), y)
    base = torch.randn(3)
    got = jf(base, base)
    assert thunder.cache_misses(jf) == 2  # alias indices changed
    base2 = base.clone() - 1
    # eager on the same values: base is base2 + 1 after the in-place add
    torch.testing.assert_close(got, (base2 + 1) * 2)


def test_fused_check_failure_names_the_check():
    m = _linear_stack(layers=1)
    jm = thunder_subclass.jit(m)
    with torch.no_grad():
        jm(torch.randn(2, 16))
    (fused,) = _fused(jm)
    values, checks = fused.args
    bad = ((1, 2),) + (None,) * (len(values) - 1)  # args of the wrong length: the first check fails
    assert checks.fn(*bad) is False
    message = checks.failure(bad)
    assert message.startswith("prologue check `(len(v0) ==") and message.endswith("failed")
    with torch.no_grad():
        jm(torch.randn(2, 16))  # and the real values pass
    assert thunder.cache_misses(jm) == 1


def _tensor_guard(jf):
    (fused,) = _fused(jf)
    return fused.args[1].fn.__globals__["_tensor_guard"]


def test_tensor_metadata_runs_as_torch_cpp_guard_after_the_first_hit():
    from thunder_subclass.guards.prologue import _no_guard

    m = _linear_stack(layers=2)
    jm = thunder_subclass.jit(m)
    x = torch.randn(2, 16)
    with torch.no_grad():
        jm(x)
        guard = _tensor_guard(jm)
        assert guard is not _no_guard and type(guard).__name__ == "builtin_function_or_method"  # TensorGuards.check
        _exact(jm(x), m(x))
        # metadata that the C++ guard sees changed in place on a parameter's inner tensor: a miss, eager's values
        m[1].weight.a.requires_grad_(True)
        m[1].weight.b.requires_grad_(True)
        _exact(jm(x), m(x))
        assert thunder.cache_misses(jm) == 2
        m[1].weight.a.requires_grad_(False)
        m[1].weight.b.requires_grad_(False)
        _exact(jm(x), m(x))
        assert cache_counts(jm) == (2, 2)  # the first entry again


def test_tensors_the_cpp_guard_rejects_but_thunder_accepts_still_hit():
    # an inference tensor has other dispatch keys than a normal one: the C++ guard says no, the Python checks (the
    # guards thunder has) say yes, so it is a hit, as before the C++ guard; alternating with normal tensors, more
    # times than the guard is made again
    m = _linear_stack(layers=2)
    jm = thunder_subclass.jit(m)
    with torch.inference_mode():
        xi = torch.randn(2, 16)
    with torch.no_grad():
        for _ in range(6):
            x = torch.randn(2, 16)
            _exact(jm(x), m(x))
            _exact(jm(xi), m(xi))
    assert cache_counts(jm) == (1, 11)


def test_a_tensor_reached_twice_keeps_the_cpp_guard_and_untying_is_seen():
    # tied weights: one object reached from two modules. torch's C++ guard refuses a tensor passed twice, so it
    # gets each object once and the repeat is checked by identity
    m = _linear_stack(layers=2, bias=False)
    m[1].weight = m[0].weight
    jm = thunder_subclass.jit(m)
    x = torch.randn(2, 16)
    with torch.no_grad():
        _exact(jm(x), m(x))
        _exact(jm(x), m(x))
        assert getattr(_tensor_guard(jm), "__name__", None) == "tensor_guard"
        w = m[0].weight
        m[1].weight = nn.Parameter(TwoTensor(w.a * 3, w.b * 3), requires_grad=False)  # untied, same metadata
        _exact(jm(x), m(x))
        _exact(jm(x), m(x))
    assert thunder.cache_misses(jm) == 1 and thunder.cache_hits(jm) == 3


def _checked_values(jm, x):
    """The values the fused check of ``jm``'s prologue gets for a call ``jm(x)`` (no grad)."""
    (fused,) = _fused(jm)
    checks, captured = fused.args[1], []
    real = checks.fn
    checks.fn = lambda *values: captured.append(values) or real(*values)
    try:
        with torch.no_grad():
            jm(x)
    finally:
        checks.fn = real
    return list(captured[0])


def test_a_failing_tensor_check_is_named():
    m = _linear_stack(layers=1)
    jm = thunder_subclass.jit(m)
    x = torch.randn(2, 16)
    with torch.no_grad():
        jm(x)
    (fused,) = _fused(jm)
    values, checks = fused.args
    index = [getattr(p, "name", None) for p in values].index("input")
    bad = _checked_values(jm, x)
    assert checks.fn(*bad) is True
    bad[index] = torch.randn(3, 16)
    assert checks.fn(*bad) is False
    message = checks.failure(tuple(bad))
    assert message.startswith(f"prologue check `(isinstance(v{index}, _Tensor) and v{index}.shape ==")
    assert message.endswith("failed")
    bad[index] = torch.randn(2, 16).double()
    assert "v%d.dtype is" % index in checks.failure(tuple(bad))


def test_module_hooks_added_after_compiling_are_misses_and_run():
    m = _linear_stack(layers=2)
    jm = thunder_subclass.jit(m)
    x = torch.randn(2, 16)
    seen = []
    with torch.no_grad():
        jm(x)
        handle = m[1].register_forward_hook(lambda mod, args, out: seen.append("own"))
        _exact(jm(x), m(x))
        assert thunder.cache_misses(jm) == 2 and seen == ["own", "own"]
        handle.remove()
        handle = torch.nn.modules.module.register_module_forward_hook(lambda mod, args, out: seen.append("global"))
        try:
            jm(x)
        finally:
            handle.remove()
        assert "global" in seen and thunder.cache_misses(jm) == 3
        jm(x)
        assert thunder.cache_misses(jm) == 3  # the first entry again


def test_unfusable_checks_are_kept():
    # symbolic-value shapes (NumberProxy) are not fused: the original check stays in the prologue
    jf = thunder_subclass.jit(lambda t: t * 2, cache="symbolic values")
    x = torch.randn(3)
    torch.testing.assert_close(jf(x), x * 2)
    y = torch.randn(5)
    torch.testing.assert_close(jf(y), y * 2)
    text = str(thunder.last_prologue_traces(jf)[-1])
    assert "check_tensor_metadata" in text or "check_prologue" in text


def test_fuse_prologue_checks_leaves_a_trace_without_checks_unchanged():
    jf = thunder_subclass.jit(lambda: torch.ones(2))
    jf()
    first = thunder.last_prologue_traces(jf)[0]
    assert fuse_prologue_checks(first) is first or len(_fused(jf)) <= 1


# ---------------------------------------------------------------------------------------------------------------
# the shorter path to cache hits (no grad mode): thunder's statistics and guards as before
# ---------------------------------------------------------------------------------------------------------------


def test_fast_cache_hits_keep_thunder_statistics_and_traces():
    m = _linear_stack(layers=2)
    jm = thunder_subclass.jit(m)
    assert record_of(jm).fast_call
    x = torch.randn(2, 16)
    with torch.no_grad():
        for _ in range(3):
            _exact(jm(x), m(x))
    cs = thunder.compile_stats(jm)
    assert (cs.calls, thunder.cache_hits(jm), thunder.cache_misses(jm)) == (3, 2, 1)
    assert thunder.last_traces(jm)[-1] is cs.interpreter_cache[-1].computation_traces[-1]
    with torch.no_grad():
        jm(torch.randn(5, 16))  # a miss through the fast path: thunder traces, counted once
    assert (cs.calls, thunder.cache_hits(jm), thunder.cache_misses(jm)) == (4, 2, 2)
    with torch.no_grad():
        jm(x)  # the older entry still hits
    assert (cs.calls, thunder.cache_hits(jm), thunder.cache_misses(jm)) == (5, 3, 2)


def test_fast_cache_hits_for_functions_and_grad_mode_calls():
    w = TwoTensor(torch.randn(4, 4), torch.randn(4, 4))

    def f(x):
        return torch.nn.functional.linear(x, w) * 2

    jf = thunder_subclass.jit(f)
    assert record_of(jf).fast_call and thunder.compile_stats(jf) is not None
    x = torch.randn(3, 4)
    with torch.no_grad():
        _exact(jf(x), f(x))
        _exact(jf(x), f(x))
    assert (thunder.cache_hits(jf), thunder.cache_misses(jf)) == (1, 1)
    # grad mode on: a new entry for the grad mode (a miss, through thunder's fn_), then hits on the fast path too,
    # connected to autograd as thunder connects them (thunder's fn_ would set its call timer, the fast path does not)
    xr = torch.randn(3, 4, requires_grad=True)
    out = jf(xr)
    out.sum().backward()
    assert xr.grad is not None and thunder.cache_misses(jf) == 2
    cs = thunder.compile_stats(jf)
    timer = cs.last_trace_host_start
    for _ in range(2):
        xr2 = xr.detach().clone().requires_grad_()
        xe = xr.detach().clone().requires_grad_()
        out, expected = jf(xr2), f(xe)
        _exact(out, expected)
        out.sum().backward()
        expected.sum().backward()
        torch.testing.assert_close(xr2.grad, xe.grad)
    assert (thunder.cache_hits(jf), thunder.cache_misses(jf)) == (3, 2) and cs.last_trace_host_start == timer
    with torch.no_grad():
        jf(x)
    assert (thunder.cache_hits(jf), thunder.cache_misses(jf)) == (4, 2)


def test_fast_cache_hits_leave_grad_mode_as_thunder_does():
    def f(x):
        with torch.no_grad():  # (grad mode left changed at return is a graph break: UnsupportedGlobalStateError)
            y = x * 2
        return y

    x = torch.randn(3)
    after = {}
    for name in ("fast", "thunder"):
        jf = thunder_subclass.jit(f, disk_cache=False)  # both miss by tracing (the second would load the first's entry)
        call = jf if name == "fast" else jf.__wrapped__  # thunder's own fn_
        modes = []
        for grad in (True, True, True):  # a miss, then hits
            with torch.set_grad_enabled(grad):
                call(x)
                modes.append(torch.is_grad_enabled())
        after[name] = modes
        assert thunder.cache_misses(jf) == 1 and thunder.cache_hits(jf) == 2
    assert after["fast"] == after["thunder"] == [True] * 3  # as eager leaves it


def _per_call_frames(call) -> list[str]:
    """The Python functions of the per-call layers (the plugin's runtime, thunder's trace context, torch's grad-mode
    classes) that ``call()`` runs, in order: what a hit costs outside the entry's prologue, computation and epilogue."""
    import sys

    watched = ("thunder_subclass/_thunder_internals/runtime.py", "thunder_subclass/_thunder_internals/plugin_state.py",
               "thunder_subclass/_thunder_internals/module_bindings.py",
               "thunder_subclass/runtime/cache_policy.py", "thunder/core/trace.py", "torch/autograd/grad_mode.py")
    seen = []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.replace("\\", "/").endswith(watched):
            seen.append(frame.f_code.co_qualname.rpartition("<locals>.")[2])

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return seen


def test_a_cache_hit_runs_one_flat_per_call_function():
    # a hit: the fast call itself (the remembered call folded in, thunder's trace context read directly, grad mode
    # restored through torch's C setter), the entry index, the module tables' check and the common cache info; not
    # the populate_cache_info / remembered_call / is_tracing / set_grad_enabled layers around them
    m = _linear_stack(layers=2)
    jm = thunder_subclass.jit(m)
    x = torch.randn(2, 16)
    with torch.no_grad():
        jm(x)
        jm(x)
        frames = _per_call_frames(lambda: jm(x))
        _exact(jm(x), m(x))
    assert frames == ["fast_call", "ModuleBindings.refresh", "common_cache_info", "_plain_strided_tensors",
                      "data_parallel", "default_device", "EntryIndex.key", "EntryIndex.bucket"], frames
    assert thunder.cache_misses(jm) == 1 and thunder.cache_hits(jm) == 3
    with torch.enable_grad():  # grad mode on, no input requiring grad: a new entry, then the same frames
        jm(x)
        jm(x)
        assert _per_call_frames(lambda: jm(x)) == frames  # (not thunder's no_grad decorators either)
        out = jm(x)
        assert torch.is_grad_enabled() and not out.requires_grad
    _exact(out, m(x).detach())
    assert thunder.cache_misses(jm) == 2


def test_data_parallel_flags_set_after_compiling_reach_thunders_cache_info():
    # thunder's populate_cache_info reads getattr(fn, "use_ddp"/"use_fsdp", False) every call (its DDP/FSDP
    # transforms set them on the module); the common cache info reads them from the instance's dict: a flag set after
    # compiling still sends the call to thunder's function
    m = _linear_stack(layers=1)
    jm = thunder_subclass.jit(m)
    common = thunder.compile_data(jm).populate_cache_info.common_cache_info
    x = torch.randn(2, 16)
    with torch.no_grad():
        _exact(jm(x), m(x))
        assert common((x,), {}, False) == {
            "default_dtype": torch.float32, "default_device": torch.device("cpu"), "is_autocast_enabled": False,
            "alias_tensor_indices": "", "is_grad_enabled": False, "no_grad_sync": False}
        m.use_ddp = True
        assert common((x,), {}, False) is None  # thunder's function decides (its no_grad_sync)
        del m.use_ddp
        assert common((x,), {}, False) is not None
        m.register_buffer("use_fsdp", torch.ones(1))  # what nn.Module.__getattr__ would return for the name
        assert common((x,), {}, False) is None
        assert common((x, x), {}, False) is None  # two plain tensors may alias: thunder's grouping

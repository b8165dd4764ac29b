"""check_subclass, the contract checker for subclass authors: every real subclass we support passes (or its finding is
a true bug filed in docs/limits.md); a subclass broken in one rule is flagged by that rule's check with a message that
says the fix; the report, the error and the command line."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch
from torch.utils._pytree import tree_map

import thunder_subclass
from thunder_subclass import SubclassContractError, SubclassReport, check_subclass

import check_samples
from subclasses import ElemTensor, TwoTensor

aten = torch.ops.aten


def _finding(report: SubclassReport, check: str, match: str) -> None:
    """Exactly the findings of ``check``, at least one of them matching ``match`` (raised as the error's message so
    that ``pytest.raises(..., match=)`` reads it)."""
    assert {f.check for f in report.findings} == {check}, str(report)
    # one message per line: `^` starts a message, `.` does not cross into the next
    with pytest.raises(SubclassContractError, match=f"(?m){match}"):
        raise SubclassContractError("\n".join(f.message for f in report.findings), report=report)


def _elem_sample(cls, rows=(4, 6), cols=3):
    def make(seed):
        g = torch.Generator().manual_seed(seed)
        return cls(torch.randn(rows[seed % 2], cols, generator=g))

    return make


# ---------------------------------------------------------------------------------------------------------------
# Real subclasses
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("factory", ["two_tensor", "python_device", "float8_training", "nf4"])
def test_real_subclass_passes(factory):
    if factory != "two_tensor" and factory != "python_device":
        pytest.importorskip("torchao")
    stats = thunder_subclass.disk_cache_stats()
    report = check_subclass(getattr(check_samples, factory))
    assert report.ok, str(report)
    assert report.verdict("ops") == "ok" and "programs equal eager compiled" in str(report)
    after = thunder_subclass.disk_cache_stats()  # every program traced; nothing left in the on-disk cache
    assert (after["hits"], after["stores"]) == (stats["hits"], stats["stores"])
    assert sum(report.seconds.values()) < 60, report.seconds  # 0.5-4 s measured on a shared 2-core CPU
    if factory == "nf4":  # its context holds its shape: another size is rightly a new trace
        assert "as it must be: the flatten contexts differ beyond sizes" in report.notes["dynamic"][0]


def test_dtensor_on_one_rank_passes(mesh):
    report = check_subclass(check_samples.dtensor)
    assert report.ok, str(report)
    assert "gradients compared" in " ".join(report.notes["grads"])


# torchao 0.18: Float8Tensor.to(float32) keeps bfloat16, Int8Tensor.to(float64) keeps float32, Float8Tensor's
# transpose reports contiguous outer strides over a transposed qdata (docs/limits.md); every other check passes
TORCHAO_METADATA_BUGS = {
    "float8_inference": [("to(dtype)", "dtype torch.bfloat16", "torch.float32"),
                         ("transpose(0, 1)", r"stride \(8, 1\)", r"\(1, 16\)")],
    "int8": [("to(dtype)", "dtype torch.float32", "torch.float64")],
}


@pytest.mark.parametrize("factory", sorted(TORCHAO_METADATA_BUGS))
def test_torchao_inference_tensors_report_their_known_metadata_bugs(factory):
    pytest.importorskip("torchao")
    report = check_subclass(getattr(check_samples, factory))
    bugs = TORCHAO_METADATA_BUGS[factory]
    assert len(report.findings) == len(bugs), str(report)
    for program, claims, expected in bugs:
        _finding(report, "metadata", rf"^{re.escape(program)}: .*{claims} \(expected {expected}\)")
    assert sum(report.seconds.values()) < 60, report.seconds


def test_jagged_nested_tensor_passes_and_reuses_the_trace_for_another_batch():
    # every check passes; a new batch size and other lengths reuse the trace (symbolic sizes, frontend.jagged)
    report = check_subclass(check_samples.nested_jagged)
    assert report.ok, str(report)
    assert any("share one trace" in n for n in report.notes["dynamic"]), report.notes["dynamic"]
    assert any("depends on tensor values" in n for n in report.notes["fake"])  # x[0]: not flagged
    assert check_subclass(check_samples.nested_jagged, dynamic=False).ok


# ---------------------------------------------------------------------------------------------------------------
# One broken rule each
# ---------------------------------------------------------------------------------------------------------------


class NamesANumber(ElemTensor):
    def __init__(self, elem):
        self.elem, self.scale = elem, 2.0

    def __tensor_flatten__(self):
        return ["elem", "scale"], None


def test_flatten_naming_a_non_tensor():
    report = check_subclass(_elem_sample(NamesANumber))
    _finding(report, "flatten", r"names 'scale', which holds a float.*Move 'scale' into the context")
    assert all(report.verdict(c) == "skipped" for c in ("guards", "ops", "grads"))


class HidesATensor(ElemTensor):
    def __init__(self, elem):
        self.elem, self.bias = elem, torch.ones(elem.shape[-1])


def test_flatten_missing_a_tensor_attribute():
    report = check_subclass(_elem_sample(HidesATensor), ops=["clone"], grads=False, dynamic=False)
    _finding(report, "flatten", r"attribute 'bias' that __tensor_flatten__ does not name.*Add 'bias'")


class WithFactor(ElemTensor):
    @staticmethod
    def __new__(cls, elem, factor=1.0):
        return torch.Tensor._make_wrapper_subclass(cls, elem.shape, dtype=elem.dtype, device=elem.device)


class LosesItsFactor(WithFactor):
    def __init__(self, elem, factor=1.0):
        self.elem, self.factor = elem, factor

    def __tensor_flatten__(self):
        return ["elem"], self.factor

    @classmethod
    def __tensor_unflatten__(cls, inner, ctx, outer_size, outer_stride):
        return cls(inner["elem"])  # drops ctx


def test_unflatten_not_rebuilding_the_context():
    make = lambda seed: LosesItsFactor(torch.randn(4, 3), factor=3.0)
    _finding(check_subclass(make, ops=[], dynamic=False), "flatten",
             r"must rebuild an equal LosesItsFactor.*flatten context 1.0 \(expected 3.0\)")


class IgnoresOuterStride(ElemTensor):
    """Honours strides when dispatch gives them (its views are strided as eager's), but __tensor_unflatten__ drops
    the outer stride: a transposed instance comes back contiguous."""

    @staticmethod
    def __new__(cls, elem, stride=None):
        return torch.Tensor._make_wrapper_subclass(cls, elem.shape, strides=stride, dtype=elem.dtype,
                                                   device=elem.device)

    def __init__(self, elem, stride=None):
        self.elem = elem

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        args, kwargs = cls.unwrap(args, kwargs)
        out = func(*args, **kwargs)
        return tree_map(lambda o: cls(o, o.stride()) if isinstance(o, torch.Tensor) else o, out)


def test_unflatten_ignoring_a_views_outer_stride():
    make = lambda seed: IgnoresOuterStride(torch.randn(4, 3), (3, 1))
    report = check_subclass(make, ops=[], dynamic=False)
    _finding(report, "flatten", r"^__tensor_unflatten__ must rebuild .* for the view x.transpose\(0, 1\).*"
                                r"stride \(4, 1\) \(expected \(1, 3\)\).*"
                                r"strides=outer_stride")


class Meta:
    """A context object without __eq__: compared by identity."""

    def __init__(self, factor):
        self.factor = factor


class IdentityContext(ElemTensor):
    def __tensor_flatten__(self):
        return ["elem"], Meta(1.0)


def test_guards_context_compared_by_identity():
    report = check_subclass(_elem_sample(IdentityContext), ops=["clone"], grads=False, dynamic=False)
    _finding(report, "guards", r"two flattens of one IdentityContext must give contexts that compare equal.*__eq__")
    assert report.verdict("ops") == "skipped" and report.verdict("fake") == "ok"


class AlwaysEqual(Meta):
    def __eq__(self, other):
        return True

    __hash__ = object.__hash__


class FactorTensor(WithFactor):
    """``elem * factor`` with the factor in an always-equal context: a trace for one factor serves any other."""

    def __init__(self, elem, factor=1.0):
        self.elem, self.factor = elem, factor

    def __tensor_flatten__(self):
        return ["elem"], AlwaysEqual(self.factor)

    @classmethod
    def __tensor_unflatten__(cls, inner, ctx, outer_size, outer_stride):
        return cls(inner["elem"], ctx.factor)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        args, kwargs = tree_map(lambda a: a.elem * a.factor if isinstance(a, FactorTensor) else a, (args, kwargs or {}))
        return func(*args, **kwargs)


def test_guards_context_equal_to_another_value():
    make = lambda seed: FactorTensor(torch.randn(4, 3, generator=torch.Generator().manual_seed(seed)), 1.0 + seed)
    report = check_subclass(make, ops=["x * 2"], grads=False, dynamic=False)
    _finding(report, "guards", r"contexts with other values must compare unequal.*compares equal to make_sample\(1\)")


class TensorInContext(ElemTensor):
    def __init__(self, elem):
        self.elem = elem

    def __tensor_flatten__(self):
        return ["elem"], {"scale": self.elem.abs().amax()}  # a tensor where plain values belong


def test_guards_tensor_in_the_context():
    report = check_subclass(_elem_sample(TensorInContext), ops=[], grads=False, dynamic=False)
    _finding(report, "guards", r"^TensorInContext's flatten context holds a tensor.*Name that tensor in "
                               r"__tensor_flatten__")


class ReadsItsData(ElemTensor):
    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        args, kwargs = cls.unwrap(args, kwargs)
        if func is aten.mul.Tensor:
            peak = float(args[0].abs().max())  # a Python number from tensor data
            return cls(args[0] * args[1] * (1.0 if peak < 1e9 else 0.0))
        return tree_map(lambda o: cls(o) if isinstance(o, torch.Tensor) else o, func(*args, **kwargs))


def test_fake_dispatch_reading_tensor_data():
    report = check_subclass(_elem_sample(ReadsItsData), ops=["x * 2"], grads=False, dynamic=False)
    line = ReadsItsData.__torch_dispatch__.__func__.__code__.co_firstlineno + 4
    _finding(report, "fake", rf"^x \* 2: .*reads tensor data as Python numbers at .*test_check_subclass.py:{line} "
                             rf"\(peak = float")


class ClaimsInputSize(ElemTensor):
    """Wraps every result with its input's outer size (so ``sum()`` claims to be 2-D)."""

    @staticmethod
    def __new__(cls, elem, size=None):
        return torch.Tensor._make_wrapper_subclass(cls, size if size is not None else elem.shape, dtype=elem.dtype,
                                                   device=elem.device)

    def __init__(self, elem, size=None):
        self.elem = elem

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        size = args[0].shape
        args, kwargs = cls.unwrap(args, kwargs)
        return cls(func(*args, **kwargs), size)


def test_metadata_result_claiming_the_inputs_size():
    report = check_subclass(_elem_sample(ClaimsInputSize), ops=["sum(0)"], grads=False, dynamic=False)
    _finding(report, "metadata", r"^sum\(0\): .*size \(4, 3\) \(expected \(3,\)\).*not the input's")


class MutatesInput(ElemTensor):
    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if func is aten.mul.Tensor:
            args[0].elem.mul_(args[1])  # a functional op writing into its input
            return cls(args[0].elem.clone())
        return super().__torch_dispatch__(func, types, args, kwargs)


def test_ops_functional_op_changing_its_input():
    report = check_subclass(_elem_sample(MutatesInput), ops=["x * 2"], grads=False, dynamic=False)
    _finding(report, "ops", r"^x \* 2: a functional operation must leave its input unchanged.*inner tensor 'elem'")


class CountsCalls(ElemTensor):
    """A Python side effect in dispatch that changes results: each call adds how often dispatch ran before."""

    calls = 0

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        args, kwargs = cls.unwrap(args, kwargs)
        CountsCalls.calls += 1
        out = func(*args, **kwargs)
        return cls(out + CountsCalls.calls) if func is aten.add.Tensor else cls(out)


def test_ops_compiled_differs_from_eager():
    report = check_subclass(_elem_sample(CountsCalls), ops=["x + 1"], grads=False, dynamic=False)
    _finding(report, "ops", r"^x \+ 1: compiled, the result must equal eager's .*the result.elem has other values")


class StopsGradients(ElemTensor):
    """Implements ``mul`` in ``__torch_function__`` on detached inner data: the result never requires grad."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is torch.Tensor.mul or func is torch.Tensor.__mul__:
            return cls(args[0].elem.detach() * args[1])
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))


def test_grads_stopping_at_the_subclass():
    report = check_subclass(_elem_sample(StopsGradients), ops=["x * 2", "clone"], dynamic=False)
    _finding(report, "grads", r"^x \* 2: .*does not require grad in eager: gradients stop.*grads=False")


class ReadsItsSize(ElemTensor):
    """Dispatch reads the outer size as a Python int: the size is pinned, each size a new trace."""

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if func is aten.mul.Tensor:
            rows = int(args[0].elem.shape[0])
            return cls(args[0].elem.reshape(rows, -1) * args[1])
        return super().__torch_dispatch__(func, types, args, kwargs)


def test_dynamic_size_read_as_a_number_in_dispatch():
    report = check_subclass(_elem_sample(ReadsItsSize), ops=["x * 2"], grads=False)
    _finding(report, "dynamic", r"^x \* 2: with dynamic=True a sample of another size \(\(4, 3\) then \(6, 3\)\) "
                                r"must reuse the trace.*do not branch on sizes")


# ---------------------------------------------------------------------------------------------------------------
# fn, the report, the error, the command line
# ---------------------------------------------------------------------------------------------------------------


def test_fn_is_checked_like_the_defaults():
    report = check_subclass(check_samples.two_tensor, lambda t: (t.sin() * t).sum(-1), ops=[])
    assert report.ok, str(report)
    assert report.notes["ops"] == ["1 of 1 programs equal eager compiled"]
    assert "fn: sizes (8, 4) and (16, 4) share one trace" in report.notes["dynamic"]
    def cos_of_transpose(t):
        return t.t().cos()

    report = check_subclass(check_samples.two_tensor, ops=["x * 2", cos_of_transpose], grads=False, dynamic=False)
    assert report.ok and report.notes["ops"] == ["2 of 2 programs equal eager compiled"]
    report = check_subclass(check_samples.two_tensor, lambda t: t.nonexistent(), ops=[])
    _finding(report, "ops", r"fn must run in eager on make_sample\(0\).*AttributeError")


def test_report_table_and_raise_on_failure():
    report = check_subclass(_elem_sample(ClaimsInputSize), ops=["sum(0)"], grads=False, dynamic=False)
    lines = str(report).splitlines()
    assert lines[0] == "check_subclass(ClaimsInputSize): 1 finding"
    assert lines[1].split() == ["check", "verdict", "detail"]
    assert [line.split()[:2] for line in lines[3:] if line[:1] != " "] == [
        ["flatten", "ok"], ["guards", "ok"], ["fake", "ok"], ["metadata", "FAIL"], ["ops", "ok"],
        ["grads", "skipped"], ["dynamic", "skipped"]]
    with pytest.raises(SubclassContractError, match=r"metadata +FAIL +sum\(0\)") as info:
        check_subclass(_elem_sample(ClaimsInputSize), ops=["sum(0)"], grads=False, dynamic=False,
                       raise_on_failure=True)
    assert info.value.report.findings[0].check == "metadata"
    assert isinstance(info.value, thunder_subclass.SubclassProtocolError)
    with pytest.raises(ValueError, match=r"unknown programs \['cos'\]"):
        check_subclass(check_samples.two_tensor, ops=["cos"])
    with pytest.raises(TypeError, match="must return an instance of a tensor subclass"):
        check_subclass(lambda seed: torch.ones(2))


@pytest.mark.slow
def test_command_line_exits_nonzero_on_findings():
    tests = os.path.dirname(__file__)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(tests), tests]), PYTHONWARNINGS="ignore")
    run = lambda target, *flags: subprocess.run(
        [sys.executable, "-m", "thunder_subclass.check", target, *flags], cwd=tests, env=env, capture_output=True,
        text=True, timeout=300)
    good = run("check_samples:two_tensor", "--no-grads")
    assert good.returncode == 0, good.stdout + good.stderr
    assert "check_subclass(TwoTensor): ok" in good.stdout and "grads     skipped" in good.stdout
    bad = run("test_check_subclass:ClaimsInputSize.broken_sample", "--no-dynamic")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "metadata  FAIL" in bad.stdout and "sum(0)" in bad.stdout


ClaimsInputSize.broken_sample = staticmethod(_elem_sample(ClaimsInputSize))

"""Typed errors: protocol violations and exceptions inside __torch_dispatch__ (issue 2)."""

import pytest
import torch

import thunder_subclass
from thunder_subclass import SubclassDispatchError, SubclassProtocolError, TensorSubclassError
from subclasses import NoFlattenTensor, TwoTensor


class FailingMatmulTensor(TwoTensor):
    """A TwoTensor whose matmul raises inside __torch_dispatch__."""

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.mm.default:
            raise ValueError("FailingMatmulTensor does not support mm")
        return super().__torch_dispatch__(func, types, args, kwargs)

    @staticmethod
    def __tensor_unflatten__(inner, meta, outer_size, outer_stride):
        return FailingMatmulTensor(inner["a"], inner["b"], outer_size, outer_stride)


def test_subclass_without_flatten_protocol_is_a_typed_error():
    x = NoFlattenTensor(torch.randn(2, 2))
    jf = thunder_subclass.jit(lambda t: t + 1)
    with pytest.raises(SubclassProtocolError, match=r"NoFlattenTensor .*__tensor_flatten__ and __tensor_unflatten__"):
        jf(x)


def test_exception_inside_dispatch_names_subclass_op_and_user_line():
    x = FailingMatmulTensor(torch.randn(2, 2), torch.randn(2, 2))

    def f(t):
        u = t + 1
        return u @ u  # the failing line (aten.mm inside dispatch)

    jf = thunder_subclass.jit(f)
    line = f.__code__.co_firstlineno + 2
    with pytest.raises(SubclassDispatchError, match=rf"torch\.Tensor\.matmul on FailingMatmulTensor failed while tracing at .*test_errors\.py:{line}: ValueError: FailingMatmulTensor does not support mm") as info:
        jf(x)
    assert isinstance(info.value.__cause__, ValueError)
    assert isinstance(info.value, TensorSubclassError)

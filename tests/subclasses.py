"""Fixture tensor subclasses written for the tests (plus torch's TwoTensor)."""

from __future__ import annotations

import torch
from torch.testing._internal.two_tensor import TwoTensor
from torch.utils._pytree import tree_map

aten = torch.ops.aten

__all__ = [
    "TwoTensor", "QuantizedWeight", "ScaledTensor", "NoFlattenTensor", "ElemTensor", "nested_two_tensor", "quantize",
    "ViewKeepingWeight", "InnerOnlyLinearWeight",
]


class QuantizedWeight(torch.Tensor):
    """int8 data [out, in] + float32 per-row scale, presented as a ``bfloat16`` tensor.

    ``t`` / ``transpose`` keep it quantized (a flag in the flatten context); every other op dequantizes to
    **float32** and returns a plain tensor, so ``x @ w.t()`` is a plain float32 tensor although ``w.dtype`` is
    bfloat16: the dtype changes across dispatch.
    """

    @staticmethod
    def __new__(cls, data: torch.Tensor, scale: torch.Tensor, transposed: bool = False, outer_dtype=torch.bfloat16):
        shape = data.shape[::-1] if transposed else data.shape
        return torch.Tensor._make_wrapper_subclass(cls, shape, dtype=outer_dtype, device=data.device)

    def __init__(self, data, scale, transposed=False, outer_dtype=torch.bfloat16):
        self.data_int8 = data
        self.scale = scale
        self.transposed = transposed

    def __repr__(self):
        return f"QuantizedWeight(shape={tuple(self.shape)}, transposed={self.transposed})"

    def __tensor_flatten__(self):
        return ["data_int8", "scale"], (self.transposed, self.dtype)

    @staticmethod
    def __tensor_unflatten__(inner, ctx, outer_size, outer_stride):
        transposed, outer_dtype = ctx
        return QuantizedWeight(inner["data_int8"], inner["scale"], transposed, outer_dtype)

    def dequantize(self) -> torch.Tensor:
        w = self.data_int8.to(torch.float32) * self.scale[:, None]
        return w.t() if self.transposed else w

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (aten.t.default, aten.transpose.int):
            w = args[0]
            return QuantizedWeight(w.data_int8, w.scale, not w.transposed, w.dtype)
        if func in (aten.detach.default, aten.alias.default, aten.clone.default):
            w = args[0]
            return QuantizedWeight(func(w.data_int8), func(w.scale), w.transposed, w.dtype)
        args, kwargs = tree_map(lambda a: a.dequantize() if isinstance(a, QuantizedWeight) else a, (args, kwargs))
        return func(*args, **kwargs)


def quantize(w: torch.Tensor, outer_dtype=torch.bfloat16) -> QuantizedWeight:
    scale = w.abs().amax(dim=1).clamp(min=1e-8) / 127.0
    data = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return QuantizedWeight(data, scale.to(torch.float32), False, outer_dtype)


class ScaledTensor(torch.Tensor):
    """``data * factor`` where ``factor`` is a Python float in the flatten context (changes every result).

    ``tag`` is also in the context but does not affect results, and ``__metadata_guard__`` ignores it: changing the
    tag reuses the trace, changing the factor does not. ``clone``/``detach`` keep the subclass; ``mul`` by a Python
    number folds into the factor; every other op computes on ``data * factor`` and returns a plain tensor.
    """

    @staticmethod
    def __new__(cls, data: torch.Tensor, factor: float, tag: str = ""):
        return torch.Tensor._make_wrapper_subclass(cls, data.shape, dtype=data.dtype, device=data.device)

    def __init__(self, data, factor, tag=""):
        self.data_ = data
        self.factor = float(factor)
        self.tag = tag

    def __repr__(self):
        return f"ScaledTensor(factor={self.factor}, tag={self.tag!r})"

    def __tensor_flatten__(self):
        return ["data_"], {"factor": self.factor, "tag": self.tag}

    @staticmethod
    def __tensor_unflatten__(inner, ctx, outer_size, outer_stride):
        return ScaledTensor(inner["data_"], ctx["factor"], ctx["tag"])

    @classmethod
    def __metadata_guard__(cls, orig_ctx, new_ctx) -> bool:
        return orig_ctx["factor"] == new_ctx["factor"]

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (aten.clone.default, aten.detach.default):
            return ScaledTensor(func(args[0].data_), args[0].factor, args[0].tag)
        if func is aten.mul.Tensor and isinstance(args[0], ScaledTensor) and isinstance(args[1], (int, float)):
            return ScaledTensor(args[0].data_, args[0].factor * args[1], args[0].tag)
        args, kwargs = tree_map(lambda a: a.data_ * a.factor if isinstance(a, ScaledTensor) else a, (args, kwargs))
        return func(*args, **kwargs)


class NoFlattenTensor(torch.Tensor):
    """A wrapper subclass with ``__torch_dispatch__`` but without ``__tensor_flatten__``/``__tensor_unflatten__``."""

    @staticmethod
    def __new__(cls, elem):
        return torch.Tensor._make_wrapper_subclass(cls, elem.shape, dtype=elem.dtype, device=elem.device)

    def __init__(self, elem):
        self.elem = elem

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        args, kwargs = tree_map(lambda a: a.elem if isinstance(a, NoFlattenTensor) else a, (args, kwargs or {}))
        return func(*args, **kwargs)


class ElemTensor(torch.Tensor):
    """A wrapper around one tensor ``elem``: every op runs on ``elem`` and tensor results are wrapped again in the
    same class. Test subclasses derive from it to vary one behaviour."""

    @staticmethod
    def __new__(cls, elem):
        return torch.Tensor._make_wrapper_subclass(cls, elem.shape, dtype=elem.dtype, device=elem.device)

    def __init__(self, elem):
        self.elem = elem

    def __tensor_flatten__(self):
        return ["elem"], None

    @classmethod
    def __tensor_unflatten__(cls, inner, ctx, outer_size, outer_stride):
        return cls(inner["elem"])

    @staticmethod
    def unwrap(args, kwargs):
        return tree_map(lambda a: a.elem if isinstance(a, ElemTensor) else a, (args, kwargs or {}))

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        args, kwargs = cls.unwrap(args, kwargs)
        out = func(*args, **kwargs)
        return tree_map(lambda o: cls(o) if isinstance(o, torch.Tensor) else o, out)


def nested_two_tensor(*tensors: torch.Tensor) -> TwoTensor:
    a, b, c, d = tensors
    return TwoTensor(TwoTensor(a, b), TwoTensor(c, d))


class ViewKeepingWeight(torch.Tensor):
    """A training weight of the shape of torchao's int8 mixed-precision parameters: dispatch unwraps to ``data`` and
    returns the subclass only for ``t`` / ``detach`` (so ``F.linear``'s autograd saves a ``ViewKeepingWeight``
    transpose), plain tensors for every other op."""

    @staticmethod
    def __new__(cls, data: torch.Tensor):
        return torch.Tensor._make_wrapper_subclass(cls, data.shape, dtype=data.dtype, device=data.device,
                                                   requires_grad=data.requires_grad)

    def __init__(self, data):
        self.data_ = data

    def __repr__(self):
        return f"ViewKeepingWeight({self.data_})"

    def __tensor_flatten__(self):
        return ["data_"], None

    @staticmethod
    def __tensor_unflatten__(inner, ctx, outer_size, outer_stride):
        return ViewKeepingWeight(inner["data_"])

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        args, kwargs = tree_map(lambda a: a.data_ if isinstance(a, ViewKeepingWeight) else a, (args, kwargs or {}))
        out = func(*args, **kwargs)
        if func in (aten.t.default, aten.detach.default):
            return tree_map(lambda o: ViewKeepingWeight(o) if isinstance(o, torch.Tensor) else o, out)
        return out


class InnerOnlyLinearWeight(torch.Tensor):
    """int8 data + per-row scale whose ``F.linear`` (a ``__torch_function__`` override, as torchao's weights implement
    it) computes on the inner tensors only: its result does not require grad because of the weight, as in eager, even
    when the weight itself has ``requires_grad=True`` (what ``load_state_dict(..., assign=True)`` leaves)."""

    @staticmethod
    def __new__(cls, data: torch.Tensor, scale: torch.Tensor, requires_grad: bool = False):
        return torch.Tensor._make_wrapper_subclass(cls, data.shape, dtype=torch.float32, device=data.device,
                                                   requires_grad=requires_grad)

    def __init__(self, data, scale, requires_grad=False):
        self.qdata = data
        self.scale = scale

    def __repr__(self):
        return f"InnerOnlyLinearWeight(shape={tuple(self.shape)})"

    def __tensor_flatten__(self):
        return ["qdata", "scale"], None

    @staticmethod
    def __tensor_unflatten__(inner, ctx, outer_size, outer_stride):
        return InnerOnlyLinearWeight(inner["qdata"], inner["scale"])

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.nn.functional.linear:
            x, w, *rest = args
            bias = rest[0] if rest else kwargs.get("bias")
            with torch._C.DisableTorchFunctionSubclass():
                y = x @ (w.qdata.to(x.dtype) * w.scale[:, None]).t()
                return y + bias if bias is not None else y
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (aten.detach.default, aten.alias.default):
            w = args[0]
            return InnerOnlyLinearWeight(func(w.qdata), func(w.scale))
        args, kwargs = tree_map(
            lambda a: a.qdata.to(torch.float32) * a.scale[:, None] if isinstance(a, InnerOnlyLinearWeight) else a,
            (args, kwargs),
        )
        return func(*args, **kwargs)

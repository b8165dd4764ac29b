"""A tensor subclass used as a Python device backend, compiled end to end by thunder_subclass.

Backend authors can add an out-of-tree "device" in Python, without PrivateUse1 C++: a wrapper subclass whose data
lives in a plain CPU tensor, whose operations run the backend's kernels as ``torch.library`` custom ops (with fake
implementations, so compilers know result metadata), and an executor that claims those ops in thunder's traces.

* :class:`PyDeviceTensor` — the "device" tensor (``x.data_`` holds the storage); ``to_pydevice(t)`` /
  ``t.to_cpu()`` move values on and off, :func:`to_pydevice_module` moves a module's parameters.
* ``pydevice::mm``, ``pydevice::add``, ``pydevice::mul``, ``pydevice::relu``, ``pydevice::sum`` — the backend's
  kernels (here: torch CPU ops standing in for a real library), each with a fake implementation.
* :data:`pydevice_ex` — the backend's thunder executor. :func:`register` makes thunder_subclass record the
  backend's ops as this executor's symbols (``pydevice_mm`` ...), so traces show them claimed by it.

Example::

    import thunder_subclass, thunder
    from thunder_subclass.examples import python_device as pyd

    pyd.register()
    model = pyd.to_pydevice_module(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU()))
    jmodel = thunder_subclass.jit(model, executors=[pyd.pydevice_ex])
    y = jmodel(pyd.to_pydevice(torch.randn(4, 8)))      # a PyDeviceTensor
    print(thunder.last_traces(jmodel)[-1])               # pydevice_mm, pydevice_add, pydevice_relu
"""

from __future__ import annotations

import torch
from torch.utils._pytree import tree_map

from thunder.core.proxies import TensorProxy
from thunder.extend import OperatorExecutor

__all__ = ["PyDeviceTensor", "to_pydevice", "to_pydevice_module", "pydevice_ex", "register", "unregister"]

aten = torch.ops.aten

# ---------------------------------------------------------------------------------------------------------------
# The backend's kernels, as torch.library custom ops with fake implementations
# ---------------------------------------------------------------------------------------------------------------


@torch.library.custom_op("pydevice::mm", mutates_args=())
def _mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a @ b


@_mm.register_fake
def _(a, b):
    return a.new_empty((a.shape[0], b.shape[1]))


@torch.library.custom_op("pydevice::add", mutates_args=())
def _add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a + b


@_add.register_fake
def _(a, b):
    return torch.empty(torch.broadcast_shapes(a.shape, b.shape), dtype=a.dtype, device=a.device)


@torch.library.custom_op("pydevice::mul", mutates_args=())
def _mul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a * b


@_mul.register_fake
def _(a, b):
    return torch.empty(torch.broadcast_shapes(a.shape, b.shape), dtype=a.dtype, device=a.device)


@torch.library.custom_op("pydevice::relu", mutates_args=())
def _relu(a: torch.Tensor) -> torch.Tensor:
    return a.clamp_min(0)


@_relu.register_fake
def _(a):
    return torch.empty_like(a)


@torch.library.custom_op("pydevice::sum", mutates_args=())
def _sum(a: torch.Tensor) -> torch.Tensor:
    return a.sum()


@_sum.register_fake
def _(a):
    return a.new_empty(())


pydevice = torch.ops.pydevice

# ---------------------------------------------------------------------------------------------------------------
# The device tensor
# ---------------------------------------------------------------------------------------------------------------


class PyDeviceTensor(torch.Tensor):
    """A tensor on the Python "device": its storage is the CPU tensor ``data_``; every operation runs one of the
    backend's kernels (or a layout op on the storage). Operations the backend lacks raise ``NotImplementedError``."""

    @staticmethod
    def __new__(cls, data: torch.Tensor):
        return torch.Tensor._make_wrapper_subclass(
            cls, data.shape, strides=data.stride(), dtype=data.dtype, device=data.device,
            requires_grad=data.requires_grad,
        )

    def __init__(self, data: torch.Tensor):
        self.data_ = data

    def __repr__(self) -> str:
        return f"PyDeviceTensor({self.data_})"

    def __tensor_flatten__(self):
        return ["data_"], None

    @staticmethod
    def __tensor_unflatten__(inner, ctx, outer_size, outer_stride):
        return PyDeviceTensor(inner["data_"])

    def to_cpu(self) -> torch.Tensor:
        return self.data_.detach().clone()

    # layout operations act on the storage directly; arithmetic goes to the backend's kernels
    _LAYOUT = {
        aten.t.default, aten.transpose.int, aten.view.default, aten._unsafe_view.default, aten.reshape.default,
        aten.expand.default, aten.detach.default, aten.clone.default, aten.alias.default, aten.unsqueeze.default,
        aten.squeeze.dim, aten.permute.default, aten.contiguous.default, aten.ones_like.default,
        aten.zeros_like.default, aten.empty_like.default, aten.sum.dim_IntList, aten.threshold_backward.default,
        aten.le.Scalar, aten.where.self, aten.new_zeros.default, aten.fill_.Scalar, aten.copy_.default,
    }

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        raw_args, raw_kwargs = tree_map(lambda a: a.data_ if isinstance(a, PyDeviceTensor) else a, (args, kwargs))
        if func is aten.mm.default:
            out = pydevice.mm(*raw_args)
        elif func is aten.addmm.default:
            bias, a, b = raw_args[:3]
            out = pydevice.add(pydevice.mm(a, b), bias)
        elif func is aten.add.Tensor and raw_kwargs.get("alpha", 1) == 1 and isinstance(raw_args[1], torch.Tensor):
            out = pydevice.add(*raw_args[:2])
        elif func is aten.mul.Tensor and isinstance(raw_args[1], torch.Tensor):
            out = pydevice.mul(*raw_args[:2])
        elif func is aten.relu.default:
            out = pydevice.relu(raw_args[0])
        elif func is aten.sum.default:
            out = pydevice.sum(raw_args[0])
        elif func in cls._LAYOUT:
            out = func(*raw_args, **raw_kwargs)
        else:
            raise NotImplementedError(f"PyDeviceTensor: the pydevice backend has no kernel for {func}")
        return tree_map(lambda o: PyDeviceTensor(o) if isinstance(o, torch.Tensor) else o, out)


def to_pydevice(t: torch.Tensor) -> PyDeviceTensor:
    """A copy of ``t`` on the Python device."""
    return PyDeviceTensor(t.detach().clone()).requires_grad_(t.requires_grad)


def to_pydevice_module(module: torch.nn.Module) -> torch.nn.Module:
    """Move ``module``'s parameters onto the Python device (in place); returns the module."""
    for sub in module.modules():
        for name, p in list(sub.named_parameters(recurse=False)):
            setattr(sub, name, torch.nn.Parameter(to_pydevice(p.detach()), requires_grad=p.requires_grad))
    return module


# ---------------------------------------------------------------------------------------------------------------
# The backend's thunder executor
# ---------------------------------------------------------------------------------------------------------------

pydevice_ex = OperatorExecutor("pydevice")


def _like_meta(shape_fn):
    def meta(*args):
        first = args[0]
        return TensorProxy(like=first, shape=shape_fn(*args))

    return meta


def _broadcast(a, b):
    return tuple(torch.broadcast_shapes(tuple(a.shape), tuple(b.shape)))


_SYMBOLS = {
    pydevice.mm.default: pydevice_ex.register_operator(
        "pydevice_mm", meta=_like_meta(lambda a, b: (a.shape[0], b.shape[1])), fn=pydevice.mm.default
    ),
    pydevice.add.default: pydevice_ex.register_operator("pydevice_add", meta=_like_meta(_broadcast), fn=pydevice.add.default),
    pydevice.mul.default: pydevice_ex.register_operator("pydevice_mul", meta=_like_meta(_broadcast), fn=pydevice.mul.default),
    pydevice.relu.default: pydevice_ex.register_operator(
        "pydevice_relu", meta=_like_meta(lambda a: tuple(a.shape)), fn=pydevice.relu.default
    ),
    pydevice.sum.default: pydevice_ex.register_operator(
        "pydevice_sum", meta=_like_meta(lambda a: ()), fn=pydevice.sum.default
    ),
}

_removers: list = []


def register() -> None:
    """Have thunder_subclass record the backend's custom ops as :data:`pydevice_ex`'s symbols (idempotent)."""
    from thunder_subclass.frontend.aten_symbols import register_aten_symbol

    if not _removers:
        _removers.extend(register_aten_symbol(op, sym) for op, sym in _SYMBOLS.items())


def unregister() -> None:
    while _removers:
        _removers.pop()()

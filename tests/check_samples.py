"""``make_sample(seed)`` factories of the real subclasses thunder_subclass supports, for ``check_subclass``: seed 1
gives another size (other values for every seed), small enough for the checker to run in seconds."""

from __future__ import annotations

import torch
from torch.testing._internal.two_tensor import TwoTensor

__all__ = ["two_tensor", "float8_training", "float8_inference", "int8", "nf4", "dtensor", "nested_jagged",
           "python_device"]


def _randn(seed: int, *shape, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _rows(seed: int) -> int:
    return 8 + 8 * (seed % 2)


def two_tensor(seed: int) -> TwoTensor:
    return TwoTensor(_randn(seed, _rows(seed), 4), _randn(seed + 100, _rows(seed), 4))


def float8_training(seed: int):
    from torchao.float8.float8_training_tensor import hp_tensor_and_scale_to_float8

    w = _randn(seed, _rows(seed), 16)
    scale = (448.0 / w.abs().amax()).to(torch.float32)
    return hp_tensor_and_scale_to_float8(w, scale, torch.float8_e4m3fn)


def float8_inference(seed: int):
    from torchao.quantization.quantize_.workflows.float8.float8_tensor import Float8Tensor

    return Float8Tensor.from_hp(_randn(seed, _rows(seed), 16, dtype=torch.bfloat16))


def int8(seed: int):
    from torchao.quantization.granularity import PerRow
    from torchao.quantization.quantize_.workflows.int8.int8_tensor import Int8Tensor

    return Int8Tensor.from_hp(_randn(seed, _rows(seed), 16), PerRow())


def nf4(seed: int):
    try:
        from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import to_nf4
    except ImportError:
        from torchao.dtypes.nf4tensor import to_nf4
    return to_nf4(_randn(seed, 2 * _rows(seed), 32, dtype=torch.bfloat16), block_size=32, scaler_block_size=16)


def dtensor(seed: int):
    """A replicated DTensor on a one-process gloo mesh (the process group must be initialised: the tests' ``mesh``
    fixture, or :func:`init_one_rank`)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, distribute_tensor

    mesh = init_device_mesh("cpu", (1,))
    return distribute_tensor(_randn(seed, _rows(seed), 4), mesh, [Replicate()])


def nested_jagged(seed: int):
    lengths = (2, 3) if seed % 2 == 0 else (3, 2, 4)  # (lengths >= 2: the ShapeEnv specialises 1, as torch.compile)
    return torch.nested.nested_tensor([_randn(seed + i, n, 4) for i, n in enumerate(lengths)], layout=torch.jagged)


def python_device(seed: int):
    from thunder_subclass.examples.python_device import to_pydevice

    return to_pydevice(_randn(seed, _rows(seed), 4))

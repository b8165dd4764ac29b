"""A tensor subclass as a Python device backend (thunder_subclass.examples.python_device), issue 6."""

import copy

import pytest
import thunder
import torch

import thunder_subclass
from thunder_subclass.examples import python_device as pyd


@pytest.fixture
def registered():
    pyd.register()
    yield
    pyd.unregister()


def _models():
    cpu = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    return cpu, pyd.to_pydevice_module(copy.deepcopy(cpu))


def test_model_on_python_device_compiles_with_backend_executor(registered):
    cpu, model = _models()
    x = torch.randn(5, 8)
    jmodel = thunder_subclass.jit(model, executors=[pyd.pydevice_ex])
    out = jmodel(pyd.to_pydevice(x))
    assert type(out) is pyd.PyDeviceTensor
    torch.testing.assert_close(out.data_, cpu(x))
    claimed = {b.sym.name: b.sym.executor.name for b in thunder.last_traces(jmodel)[-1].bound_symbols
               if b.sym.name.startswith("pydevice_")}
    assert claimed == {"pydevice_mm": "pydevice", "pydevice_add": "pydevice", "pydevice_relu": "pydevice"}

    out.sum().backward()
    cpu(x).sum().backward()
    for p, cp in zip(model.parameters(), cpu.parameters()):
        assert type(p.grad) is pyd.PyDeviceTensor
        torch.testing.assert_close(p.grad.data_, cp.grad)
    assert "pydevice_mm" in [b.sym.name for b in thunder.last_backward_traces(jmodel)[-1].bound_symbols]


def test_without_registration_backend_ops_run_as_generic_symbols():
    cpu, model = _models()
    x = torch.randn(2, 8)
    jmodel = thunder_subclass.jit(model)
    torch.testing.assert_close(jmodel(pyd.to_pydevice(x)).data_, cpu(x))
    assert "pydevice_mm_default" in [b.sym.name for b in thunder.last_traces(jmodel)[-1].bound_symbols]


def test_backend_without_a_kernel_gives_typed_error(registered):
    x = pyd.to_pydevice(torch.randn(3))
    with pytest.raises(thunder_subclass.SubclassDispatchError, match=r"torch\.Tensor\.sin on PyDeviceTensor failed .*"
                       r"no kernel for aten\.sin\.default"):
        thunder_subclass.jit(lambda t: t.sin())(x)

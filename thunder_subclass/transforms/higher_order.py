"""Stage 5 (autograd) at run time: a backward with ``create_graph=True`` (gradient penalties, Hessian-vector products).

In: a compiled function's thunder backward called with grad mode on (``torch.autograd.grad(..., create_graph=True)``,
``.backward(create_graph=True)``), the call its forward ran for (``plugin_state.RememberedCall``, kept weakly on the
autograd node) and the incoming gradients.
What happens: thunder's compiled backward is differentiable once only (its gradients carry no autograd history), so
the input gradients are computed instead by PyTorch's autograd on an eager recomputation of the call: the user's
function or module runs again, under grad mode, on the same argument objects, and ``torch.autograd.grad`` with
``create_graph=True`` differentiates its outputs with the incoming gradients. The gradients then carry history, and
any order of derivative is eager's, for subclasses too (their ``__torch_dispatch__`` runs eagerly).
Out: the gradient of each of the forward's flat arguments (None where none), or a
:class:`~thunder_subclass.errors.HigherOrderGradientError` where the recomputation could differ from the forward
that ran.

The recomputation is eager's result only where running the function again gives what the compiled forward gave and
changes nothing; each of these is checked on every such backward (else the error, never a silent difference):

* the call is known: the innermost compiled call of the thread when the forward ran, of the same jit (its compile
  data), with a function to run eagerly (``thunder_subclass.jit``; not the ``thunder.compile`` plugin entry);
* every tensor of the arguments and every flat argument is still alive (held weakly: the recomputation keeps nothing
  alive between forward and backward) and has the version counter it had after the forward (not changed in place
  since);
* the forward trace writes no tensor in place that outlives it (no ``copy_`` into an input, a parameter or a buffer:
  BatchNorm's running statistics in training would be updated twice) and draws no random numbers (dropout would draw
  another mask);
* the recomputation returns as many tensors as the forward did, with the same shapes and dtypes;
* Python state the function writes (attributes of the module and its submodules; for a function, its globals and the
  cells of its closure; one container or object deep) is put back afterwards, and its output to ``sys.stdout`` /
  ``sys.stderr`` is dropped: the compiled forward already stands for the call's effects.
"""

from __future__ import annotations

import contextlib
import io

import torch
import optree

from thunder.core.pytree import OPTREE_NAMESPACE

from thunder_subclass.transforms.backward_effects import Snapshot
from thunder_subclass.errors import HigherOrderGradientError
from thunder_subclass._thunder_internals import NOT_HANDLED
from thunder_subclass.transforms.tangents import forward_effects, variants_in

__all__ = ["create_graph_backward"]


def _what(fn) -> str:
    if isinstance(fn, torch.nn.Module):
        return f"the compiled module {type(fn).__qualname__}"
    return f"the compiled function {getattr(fn, '__qualname__', type(fn).__qualname__)}"


def _effects(variants) -> str | None:
    """What the forward writes in place or draws (``tangents.forward_effects``; a loaded entry keeps it)."""
    return variants.effects if variants.joint is None else forward_effects(variants.joint)


def _resolve(call):
    """The call's arguments and flat arguments with live tensors, or None if one was freed or changed in place since
    the forward."""
    return call.live(check_versions=True)


def _snapshot_of(fn) -> Snapshot:
    snapshot = Snapshot()
    if isinstance(fn, torch.nn.Module):
        for name, m in fn.named_modules():
            snapshot.watch(m, f"module {name or type(fn).__qualname__}")
    else:
        code = getattr(fn, "__code__", None)
        if getattr(fn, "__globals__", None) is not None:
            snapshot.watch(fn.__globals__, "globals")
        for name, cell in zip(getattr(code, "co_freevars", ()), getattr(fn, "__closure__", None) or ()):
            snapshot.watch(cell, f"the closure variable {name!r}")
    return snapshot


def create_graph_backward(compiled_backward, call, grads):
    """The ``ThunderFunction.backward`` hook's handler for a backward run with ``create_graph=True`` (see the module
    docstring): the input gradients, ``NOT_HANDLED`` for another jit's backward (thunder's behaviour), or a
    :class:`HigherOrderGradientError`."""
    variants = variants_in(compiled_backward)
    if variants is None:
        return NOT_HANDLED
    fn = getattr(variants.compile_data, "fn", None)
    reason = None
    resolved = None
    if call is None or call.cd is not variants.compile_data or call.eager is None:
        reason = "the call it came from is not known (a function compiled by thunder.compile's plugin entry, or a region)"
    elif variants.mutated_inputs or _effects(variants):
        reason = f"its forward {_effects(variants) or 'changes an input in place'}"
    else:
        resolved = _resolve(call)
        if resolved is None:
            reason = "an argument was freed or changed in place since the forward"
    if resolved is not None:
        args, kwargs, flat_args = resolved
        snapshot = _snapshot_of(call.eager)
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), \
                    torch.enable_grad():
                out = call.eager(*args, **kwargs)
        finally:
            snapshot.restore()
        # in the order of thunder's flat outputs (thunder.core.pytree: optree, dict keys sorted)
        outs = [o for o in optree.tree_leaves(out, none_is_leaf=True, namespace=OPTREE_NAMESPACE)
                if isinstance(o, torch.Tensor)]
        if len(outs) != len(grads) or any(
                g is not None and (o.shape != g.shape or o.dtype != g.dtype) for o, g in zip(outs, grads)):
            reason = "running it again returned other outputs than the forward"
        else:
            pairs = [(o, g) for o, g in zip(outs, grads) if g is not None and o.requires_grad]
            targets = [(i, a) for i, a in enumerate(flat_args) if isinstance(a, torch.Tensor) and a.requires_grad]
            if not pairs or not targets:
                return [None] * len(flat_args)
            computed = torch.autograd.grad([o for o, _ in pairs], [a for _, a in targets], [g for _, g in pairs],
                                           create_graph=True, allow_unused=True)
            result = [None] * len(flat_args)
            for (i, _), g in zip(targets, computed):
                result[i] = g
            return result
    raise HigherOrderGradientError(
        f"{_what(fn)} was differentiated with create_graph=True (torch.autograd.grad(..., create_graph=True) or "
        ".backward(create_graph=True)): its compiled backward is differentiable once only, so the call is "
        f"recomputed eagerly for that backward, which is not possible here: {reason}. Compute higher-order "
        "gradients with the uncompiled function or module, or drop create_graph=True if no second-order gradient is "
        "needed."
    )

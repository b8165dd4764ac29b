"""Stages 5-7, the transforms of the traced program, one a module.

* ``autograd`` (stage 5): subclass operations differentiate above ``__torch_dispatch__``, as in PyTorch;
  ``backward_effects`` (side effects of a custom ``autograd.Function.backward``), ``higher_order``
  (``create_graph=True``), ``random_ops`` (dropout drawn as eager draws it), ``overwrites`` (the zero gradient of a
  value ``copy_``/``zero_`` overwrote), ``nll_loss`` (its backward as eager computes it),
  ``fallback_grads`` (operations thunder cannot differentiate: PyTorch's autograd on fakes);
* ``flatten`` (stage 6): subclasses leave the program before executors claim operations;
* ``tangents`` (stage 7): incoming gradients of another kind than the compiled backward expects.

Imports the frontend and the guards, never the runtime (``tests/test_layering.py``).
"""

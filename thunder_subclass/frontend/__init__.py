"""Stage 4 (interpretation), and the representation of values: what runs while thunder interprets the user's code.

* ``proxy``: how a subclass is represented in traces (``SubclassTensorProxy``), for inputs (stage 3) and results;
* ``fake``: fake tensors for the proxies, the ``FakeTensorMode`` per thread;
* ``interpretation``: torch operations on subclass proxies unrolled through ``__torch_dispatch__``;
* ``recording``: the recorder that runs an operation on fakes and binds its aten calls as one symbol;
* ``aten_symbols``: an aten op becomes a thunder symbol; ``subclass_symbols``: ``flatten_<Cls>`` / ``unflatten_<Cls>``;
* ``torch_function``: subclasses that override only ``__torch_function__``;
* ``module_calls``: ``nn.Module`` calls with their forward hooks, read once and guarded;
* ``native_effects``, ``checkpoints``, ``grad_modes``: native calls that change Python state, reentrant checkpoints,
  grad-mode changes: traced as eager runs them, or a graph break.

Imports only the guards (stage 3) and the modules below them; the guards use only ``proxy`` and ``fake`` of it
(``tests/test_layering.py``).
"""

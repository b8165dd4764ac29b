"""Stage 3 (inputs and guards), inputs and prologue guards: how an input becomes a proxy, and when a cached trace may be
reused.

In: the inputs of a plugin jit as the interpreter meets them, and what traced code reads from them. What happens:
each value read gets the guards of its kind (below). Out: constraints
on thunder's jit context that ``unpack_inputs`` turns into prologue checks (fused by
``thunder_subclass.guards.prologue``), and epilogue write-backs of the input containers the traced code changed. A
failing check makes the prologue raise :class:`SubclassGuardFailure`, which thunder treats as a cache miss: a new trace,
never a stale one.

Every check is one guard kind, a small class following :class:`~thunder_subclass.guards.protocol.Guard`
(``matches``, ``expression``, ``explain``, ``disk_state``), with its check symbol registered by
:func:`~thunder_subclass.guards.protocol.register_check`. Adding a guard kind touches the file of its concern:

* ``protocol``: the ``Guard`` protocol, the check registration, :class:`SubclassGuardFailure`;
* ``values``: snapshots of functions and object state, and their comparisons;
* ``tensors``: the tensor checks (subclass specs, plain tensors, strides, typed inputs, dispatch modes, ragged sizes,
  input values, buffer flags);
* ``objects``: the object checks (``ObjectSpec``'s kinds, module hooks, missing attributes, torch state, dict-key
  paths);
* ``layouts``: the layout check of an input whose strides were read under symbolic sizes;
* ``inputs``: tensor inputs become proxies with their guards (:func:`proxify_input`);
* ``object_reads``: which guard an object read while tracing gets, and when it gets stricter;
* ``write_backs``: input lists and dicts the traced code changed, written back by the epilogue.
"""

from thunder_subclass.guards import inputs, layouts, object_reads, objects, protocol, tensors, values, write_backs
from thunder_subclass.guards.protocol import *  # noqa: F401,F403
from thunder_subclass.guards.values import *  # noqa: F401,F403
from thunder_subclass.guards.tensors import *  # noqa: F401,F403
from thunder_subclass.guards.layouts import *  # noqa: F401,F403
from thunder_subclass.guards.objects import *  # noqa: F401,F403
from thunder_subclass.guards.inputs import *  # noqa: F401,F403
from thunder_subclass.guards.object_reads import *  # noqa: F401,F403
from thunder_subclass.guards.write_backs import *  # noqa: F401,F403

_STATE_LIMIT = values.STATE_LIMIT  # (the names this package had as one module)
_check_attribute_absent_impl = protocol.check_function(objects.check_attribute_absent)

__all__ = [name for part in (protocol, values, tensors, layouts, objects, inputs, object_reads, write_backs)
           for name in part.__all__]

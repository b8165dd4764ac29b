"""Stage 3, inputs and prologue guards: how an input becomes a proxy, and when a cached trace may be reused.

In: the inputs of a plugin jit as the interpreter meets them, and what traced code reads from them. Out: constraints
on thunder's jit context that ``unpack_inputs`` turns into prologue checks (fused by ``thunder_subclass.prologue``),
and epilogue write-backs of the input containers the traced code changed. A failing check makes the prologue raise
:class:`SubclassGuardFailure`, which thunder treats as a cache miss: a new trace, never a stale one.

Every check is one guard kind, a small class following :class:`~thunder_subclass.guards.protocol.Guard`
(``matches``, ``expression``, ``explain``, ``disk_state``), with its check symbol registered by
:func:`~thunder_subclass.guards.protocol.register_check`. Adding a guard kind touches the file of its concern:

* ``protocol``: the ``Guard`` protocol, the check registration, :class:`SubclassGuardFailure`;
* ``values``: snapshots of functions and object state, and their comparisons;
* ``tensors``: the tensor checks (subclass specs, plain tensors, strides, typed inputs, dispatch modes, ragged sizes,
  input values, buffer flags);
* ``objects``: the object checks (``ObjectSpec``'s kinds, module hooks, missing attributes, torch state, dict-key
  paths);
* ``inputs``: tensor inputs become proxies with their guards (:func:`proxify_input`);
* ``object_reads``: which guard an object read while tracing gets, and when it gets stricter;
* ``write_backs``: input lists and dicts the traced code changed, written back by the epilogue.
"""

from thunder_subclass.guards.protocol import (
    MISSING,
    Guard,
    SubclassGuardFailure,
    check_function,
    guard_of,
    is_same_value,
    register_check,
)
from thunder_subclass.guards.values import STATE_LIMIT, same_state, state_difference, state_snapshot
from thunder_subclass.guards.tensors import (
    InputValuesSpec,
    NestedSizesSpec,
    SubclassSpec,
    TensorTypeSpec,
    TraceFlags,
    check_buffer_flag,
    check_input_values,
    check_nested_sizes,
    check_no_dispatch_mode,
    check_plain_tensor,
    check_subclass,
    check_tensor_strides,
    check_tensor_type,
    inline_tensor_check,
    is_contiguous_layout,
)
from thunder_subclass.guards.objects import (
    ConstantPath,
    ModuleHooksSpec,
    ObjectSpec,
    TorchStateQuery,
    check_attribute_absent,
    check_constant_path,
    check_module_hooks,
    check_object,
    check_torch_state,
)
from thunder_subclass.guards.inputs import (
    add_nested_sizes_guard,
    add_plain_tensor_guard,
    add_subclass_guards,
    add_tensor_type_guard,
    guard_buffer_flag,
    guard_python_attribute,
    guard_tensor_type_attribute,
    mark_involves_subclasses,
    proxify_input,
    require_no_dispatch_mode,
)
from thunder_subclass.guards.object_reads import (
    add_module_hooks_guard,
    guard_attribute_absent,
    guard_compared_objects,
    guard_input_object,
    guard_native_call_arguments,
    guard_object_by_identity,
    guard_object_by_value,
    guard_torch_state_query,
    is_guardable_provenance,
    object_guard_kind,
)
from thunder_subclass.guards.write_backs import write_back_container, write_back_input_containers

_STATE_LIMIT = STATE_LIMIT  # (the names this package had as one module)
_check_attribute_absent_impl = check_function(check_attribute_absent)

__all__ = ["Guard", "register_check", "guard_of", "check_function", "SubclassSpec", "add_subclass_guards",
           "check_subclass", "proxify_input", "add_module_hooks_guard", "ObjectSpec", "check_object",
           "guard_input_object", "guard_object_by_value", "guard_object_by_identity", "guard_native_call_arguments",
           "guard_compared_objects", "is_guardable_provenance", "write_back_input_containers", "write_back_container",
           "check_attribute_absent", "guard_attribute_absent"]

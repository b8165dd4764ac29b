"""The layer that reaches into thunder and torch internals: the bottom layer, importing no stage of the plugin.

Everything thunder_subclass needs from thunder 0.2.6 (and torch) that has no public extension point is in this
package, one module per concern, each opening with the part of the hook map that concerns it (the thunder paths it
hooks or reads, and what each does for the plugin):

=========================  =====================================================================================
module                     concern
=========================  =====================================================================================
:mod:`.versions`           the supported stack (torch >= 2.10, < 2.16; thunder 0.2.6) and the shims that make
                           thunder importable under it (:func:`ensure_thunder_importable`)
:mod:`.thunder_state`      accessors for thunder's private state: compile data, symbol table, traces and their
                           producers, the interpreter (source lines, interpreted calls), the jit context
:mod:`.torch_state`        accessors for torch's private state: opaque objects, nested ints, the fake mode class,
                           dispatch modes, the C++ tensor guard, module hook dictionaries, fake-tensor
                           data-dependence exceptions
:mod:`.plugin_state`       what every hook shares: the installed :class:`Handlers`, :func:`is_plugin_active`
:mod:`.tracing`            tracing hooks: proxify, ``Symbol.__call__``, the lookaside, in-place aliases, the
                           interpreter's frames and bytecode decoding
:mod:`.fixes`              where thunder's interpreter runs ordinary Python unlike CPython (found with Hugging Face):
                           the parts' lookaside tables merged, their hook targets; the parts, one per concern:
                           :mod:`.fixes.attributes`, :mod:`.fixes.iteration`, :mod:`.fixes.torch_calls`,
                           :mod:`.fixes.epilogue`, :mod:`.fixes.comparisons`, :mod:`.fixes.exceptions`,
                           :mod:`.fixes.constant_keys`
:mod:`.fixes.dicts`        ``dict(iterable)`` raises what iterating its argument raises (thunder dropped it)
:mod:`.symbolic_values`    ``cache="symbolic values"``: number pins and thunder's own fixes under that option
:mod:`.autograd_hooks`     the flatten point before executors, gradients of inputs changed in place,
                           ``ThunderFunction`` forward/backward
:mod:`.jit_record`         the plugin's per-jit state: one typed record on a jit's compile data
:mod:`.runtime`            the per-call path, thunder's side: cache info and the fast way to a cache hit; its
                           decisions come from above through a :class:`CallPort`
                           (``thunder_subclass.runtime.cache_policy``)
:mod:`.module_dispatch`    per-thread module dispatch: submodules run a compiled ``forward`` while a graph-break
                           program runs their parent eagerly, without changing the user's modules
:mod:`.executors`          thunder's torch_compile executor and the plugin's inductor regions
:mod:`.dict_versions`    CPython's dict version tags (through torch's reader): the prologue's watched objects
:mod:`.dtensor_masks`      DTensor's ``_MaskPartial`` mask buffers: fake runs leave them as they found them; a
                           traced value keeps its own
:mod:`.missing_grads`      operations thunder cannot differentiate (``flip``, ``lerp``, ``remainder``...): found while
                           tracing and given the plugin's grad rule through thunder's ``_grad_fn_map``
:mod:`.operator_refusals`  thunder's operators refusing an argument eager accepts (``generator=``, ``out=``,
                           ``ceil_mode=True``): told apart from other errors, for graph breaks
:mod:`.install`            :func:`install` / :func:`uninstall`: the table of hook targets
=========================  =====================================================================================

Hooks are installed idempotently by :func:`install` (called through ``thunder_subclass.hooks`` by
``thunder_subclass.jit`` and by the plugin when a model is compiled, never at import time), are removed by
:func:`uninstall`, and act only while a jit that uses the plugin is tracing or transforming (its executor list holds
``thunder_subclass``'s executor); every other ``thunder.jit`` in the process behaves as if they were absent. What a
hook does for the plugin is a :class:`Handlers` callback that ``thunder_subclass.hooks`` (the layer above the stages)
passes to :func:`install`; this package only knows thunder's side of each hook.

The stages import what they need from this package (the names below); within it, no module imports another's
private names (``tests/test_layering.py``).
"""

from thunder_subclass._thunder_internals.autograd_hooks import (  # noqa: F401
    MUTATED_INPUTS_KEY,
    grads_for_mutated_inputs,
    newest_version,
)
from thunder_subclass._thunder_internals.dict_versions import class_dict, dict_version_reader  # noqa: F401
from thunder_subclass._thunder_internals.operator_refusals import refused_by_thunder_operator  # noqa: F401
from thunder_subclass._thunder_internals.missing_grads import lacks_gradient, register_grad_fallback  # noqa: F401
from thunder_subclass._thunder_internals.dtensor_masks import (  # noqa: F401
    detach_dtensor,
    holds_mask,
    isolated_mask_buffers,
    own_mask_buffers,
)
from thunder_subclass._thunder_internals.executors import (  # noqa: F401
    allow_torch_compile_fusion,
    compile_with_inductor,
    has_int8_weight_only_mm,
    int8_weight_only_mm,
    region_callable,
    register_torch_compile_fusible,
    torch_compile_fusible_symbols,
    unregister_torch_compile_fusible,
)
from thunder_subclass._thunder_internals.install import (  # noqa: F401
    install,
    is_installed,
    uninstall,
)
from thunder_subclass._thunder_internals.fixes import (  # noqa: F401
    exception_source_lines,
    interpreter_fix_lookaside,
    is_hashable,
)
from thunder_subclass._thunder_internals.jit_record import JitRecord, jit_record, record_of  # noqa: F401
from thunder_subclass._thunder_internals.plugin_state import (  # noqa: F401
    NOT_HANDLED,
    Handlers,
    current_call_has_grad_inputs,
    is_plugin_active,
    remember_symbol_origin,
    symbol_implementation,
    symbol_origin,
)
from thunder_subclass._thunder_internals.runtime import (  # noqa: F401
    TRACING_LOCK,
    CacheLimitReached,
    CallPort,
    ModuleBindings,
    current_trace_reader,
    fast_call_path,
    remembering_calls,
    trace_anew,
    with_call,
)
from thunder_subclass._thunder_internals.state_reads import caller_module_name, state_path_of  # noqa: F401
from thunder_subclass._thunder_internals.symbolic_values import (  # noqa: F401
    ShapeSymbols,
    SymbolicSizeError,
    add_size_guards,
    guard_equal_sizes,
    relate_size_by_offset,
    pin_input_numbers,
    pin_numbers,
    size_computation,
    symbolic_values_active,
    symbolic_values_lookaside,
)
from thunder_subclass._thunder_internals.transform_speed import meta_signature, printed_trace  # noqa: F401
from thunder_subclass._thunder_internals.thunder_state import (  # noqa: F401
    checkpoint_scopes,
    trace_recorded,
    trace_wrote_integer_tensors,
    SetItems,
    attribute_provenance,
    input_size_numbers,
    is_argument_provenance,
    size_provenance,
    call_in_epilogue,
    constant_rooted_path,
    hooked_module_provenance,
    module_slot_of,
    user_module,
    thunder_module_lookup,
    compile_data_context,
    current_compile_data,
    input_attribute,
    input_proxy_name,
    interpret_call,
    interpret_native_call,
    thunder_lookaside,
    is_called_from_user_code,
    is_interpreting,
    is_torch_level_symbol,
    is_unpackable_provenance,
    jit_context,
    jit_state,
    new_trace,
    operator_implementation,
    pending_python_writes,
    raise_in_interpreter,
    rebind_wrapped_value,
    register_input_proxy,
    source_location,
    super_arguments,
    tensor_producer,
    thunder_resolves_method,
    trace_state,
    torch_to_thunder_symbols,
    trace_producers,
    traced_autocast_states,
    undo_if_trace_fails,
    undoing_on_trace_failure,
    view_symbols,
)
from thunder_subclass._thunder_internals.module_dispatch import PASS as DISPATCH_PASS  # noqa: F401
from thunder_subclass._thunder_internals.module_dispatch import dispatching  # noqa: F401
from thunder_subclass._thunder_internals.torch_state import (  # noqa: F401
    active_dispatch_modes,
    at_end_of_backward,
    is_user_dispatch_mode_active,
    data_dependent_exception_types,
    fake_run_replacement,
    fake_tensor_mode_class,
    has_no_global_module_hooks,
    has_value_symbols,
    holes_lengths,
    inference_mode_class,
    is_nested_int,
    is_plain_state_value,
    is_torch_state_query,
    is_torch_state_setter,
    jagged_numel,
    is_fake_tensor,
    is_opaque_reference_object,
    module_call_impl,
    module_forward_hooks,
    module_has_backward_hooks,
    module_has_no_own_hooks_expression,
    new_nested_int,
    opaque_attributes_supported,
    opaque_attributes_unavailable,
    opaque_guard_fn,
    real_script_object,
    register_plugin_operators,
    RaggedSymbolicSize,
    registered_nested_int,
    set_fake_nested_int,
    tensor_metadata_guard,
    value_symbol_fake_mode,
)
from thunder_subclass._thunder_internals.tracing import (  # noqa: F401
    is_pybind11_class,
    recording_interpreted_code,
    runs_natively,
    sum_to_scalar_grad,
)
from thunder_subclass._thunder_internals.versions import (  # noqa: F401
    OPAQUE_ATTRIBUTES_TORCH,
    SHIMS,
    SUPPORTED_THUNDER,
    TORCH_SUPPORTED,
    Shim,
    check_versions,
    ensure_thunder_importable,
    format_version,
    torch_version,
)

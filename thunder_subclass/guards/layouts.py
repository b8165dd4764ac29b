"""Stage 3 (inputs and guards), the layout check of a plain tensor input whose strides traced code read under
symbolic sizes.

In: the order of a dense input's dims from innermost to outermost stride, when ``x.stride()`` was read with its sizes
symbolic (``thunder_subclass.frontend.symbolic_strides``). What happens: the order becomes a guard of the prologue.
Out: :class:`TensorLayout`, checked by ``check_tensor_layout(x, order)``: the call's tensor has the dense strides of that order over its own sizes (contiguous, or a transposed or
permuted layout), the strides the trace computed from its size numbers.
"""

from __future__ import annotations

from thunder_subclass.guards.protocol import Guard, register_check

__all__ = ["TensorLayout", "check_tensor_layout", "dense_strides"]


def dense_strides(shape, order: tuple[int, ...]) -> tuple[int, ...]:
    """The strides of a dense tensor of sizes ``shape`` whose dims, innermost first, are ``order`` (torch's rule: a
    dim of size 0 counts as 1 for the dims outside it)."""
    strides = [0] * len(order)
    acc = 1
    for d in order:
        strides[d] = acc
        acc *= max(shape[d], 1)
    return tuple(strides)


class TensorLayout(Guard):
    """A plain tensor input is dense with its dims in ``order`` (innermost first): its strides are
    ``dense_strides(x.shape, order)``."""

    __slots__ = ("order",)

    def __init__(self, order: tuple[int, ...]):
        self.order = tuple(order)

    def __repr__(self) -> str:
        return f"TensorLayout({self.order})"

    def __eq__(self, other) -> bool:
        return type(other) is TensorLayout and other.order == self.order

    def __hash__(self) -> int:
        return hash(self.order)

    def matches(self, t) -> bool:
        return t.dim() == len(self.order) and t.stride() == dense_strides(t.shape, self.order)

    def expression(self, v: str, const) -> str:
        return f"({v}.dim() == {len(self.order)} and {v}.stride() == {const(dense_strides)}({v}.shape, " \
               f"{const(self.order)}))"

    def explain(self, t) -> str:
        return f"expected the strides of a dense tensor with dims {self.order} innermost first, got {t.stride()}"


check_tensor_layout = register_check("check_tensor_layout", ("t", "order"), TensorLayout)

"""Differential fuzzing against eager (issue 9): random programs over subclass inputs, compiled vs eager.

Programs are chains of pointwise, reduction, view, matmul and multi-output ops over a pool that starts with a
``TwoTensor``, a nested ``TwoTensor``, a plain tensor (all requiring grad), a ``QuantizedWeight`` and a
``ScaledTensor`` (constants). Values, output types and gradients must match eager. CI runs a bounded number of
examples (``THUNDER_SUBCLASS_FUZZ_EXAMPLES``, default 20); set it to 2000 for a long run.
``THUNDER_SUBCLASS_FUZZ_EXECUTOR=torch_compile`` compiles with thunder's torch_compile executor first (slower: one
torch.compile per region).
"""

import os

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import thunder_subclass
from subclasses import ScaledTensor, TwoTensor, nested_two_tensor, quantize
from test_training import assert_same

EXAMPLES = int(os.environ.get("THUNDER_SUBCLASS_FUZZ_EXAMPLES", "20"))
EXECUTOR = os.environ.get("THUNDER_SUBCLASS_FUZZ_EXECUTOR", "default")


def _executors():
    if EXECUTOR == "default":
        return None
    if EXECUTOR == "torch_compile":
        from thunder.executors.torch_compile import torch_compile_ex

        return [torch_compile_ex]
    raise ValueError(f"THUNDER_SUBCLASS_FUZZ_EXECUTOR must be 'default' or 'torch_compile', got {EXECUTOR!r}")


def _cat_chunks(a):
    c0, c1 = a.chunk(2, dim=0)
    return torch.cat([c1, c0], dim=0)


def _split_mix(a):
    p, q = a.split(2, dim=1)
    return torch.cat([p * 2, q], dim=1)


def _unbind_stack(a):
    return torch.stack([r.sin() for r in a.unbind(0)], dim=0)


# (name, arity, function); every op maps [4, 4] operands to a [4, 4] result, so any chain is well formed
UNARY = [
    ("sin", lambda a: a.sin()),
    ("tanh", lambda a: torch.tanh(a)),
    ("relu", lambda a: torch.relu(a)),
    ("neg", lambda a: -a),
    ("exp-bounded", lambda a: torch.exp(torch.tanh(a))),
    ("scale", lambda a: a * 0.5 + 1),
    ("t", lambda a: a.t()),
    ("transpose", lambda a: a.transpose(0, 1)),
    ("reshape-roundtrip", lambda a: a.reshape(16).reshape(4, 4)),
    ("view-roundtrip", lambda a: a.contiguous().view(2, 8).view(4, 4)),
    ("slice-pad", lambda a: torch.cat([a[1:], a[:1]], dim=0)),
    ("chunk-cat", _cat_chunks),
    ("split-cat", _split_mix),
    ("unbind-stack", _unbind_stack),
    ("sum-keepdim", lambda a: a - a.sum(dim=1, keepdim=True) / 4),
    ("mean-broadcast", lambda a: a * a.mean(dim=0)),
    # ops recorded as thunder equivalents of aten ops (issue 7): clamp, abs, reciprocal, amax, where/comparisons,
    # dtype round trips, unsqueeze/expand/permute views
    ("clamp-abs", lambda a: a.clamp(-0.5, 0.5) + a.abs() * 0.1),
    ("amax-norm", lambda a: a / (1 + a.abs().amax(dim=1, keepdim=True))),
    ("where-gt", lambda a: torch.where(a > 0, a, a * 0.1)),
    ("dtype-roundtrip", lambda a: a.to(torch.float64).sin().to(torch.float32)),
    ("expand-sum", lambda a: a.unsqueeze(0).expand(2, 4, 4).permute(0, 2, 1).sum(0) * 0.5),
]
BINARY = [
    ("add", lambda a, b: a + b),
    ("sub", lambda a, b: a - b),
    ("mul", lambda a, b: a * b),
    ("div", lambda a, b: a / (1 + b * b)),
    ("matmul", lambda a, b: (a @ b) * 0.25),
]
CONSTANT_RHS = [
    ("qmatmul", lambda a, q: a @ q.t()),  # QuantizedWeight: bf16-presenting int8 weight, float32 result
    ("scaled-add", lambda a, s: a + s),  # ScaledTensor: context-carrying, plain results
]

step = st.one_of(
    st.tuples(st.just("u"), st.integers(0, len(UNARY) - 1), st.integers(0, 20)),
    st.tuples(st.just("b"), st.integers(0, len(BINARY) - 1), st.integers(0, 20), st.integers(0, 20)),
    st.tuples(st.just("c"), st.integers(0, len(CONSTANT_RHS) - 1), st.integers(0, 20)),
)


def run_program(program, x, n, p, q, s):
    pool = [x, n, p]
    for instr in program:
        if instr[0] == "u":
            pool.append(UNARY[instr[1]][1](pool[instr[2] % len(pool)]))
        elif instr[0] == "b":
            pool.append(BINARY[instr[1]][1](pool[instr[2] % len(pool)], pool[instr[3] % len(pool)]))
        else:
            pool.append(CONSTANT_RHS[instr[1]][1](pool[instr[2] % len(pool)], (q, s)[instr[1]]))
    out = pool[-1]
    return out, (out * out).sum() + sum(v.sum() for v in pool[3:-1]) * 0.1


def _inputs():
    x = TwoTensor(torch.randn(4, 4), torch.randn(4, 4)).requires_grad_()
    n = nested_two_tensor(*(torch.randn(4, 4) for _ in range(4))).requires_grad_()
    p = torch.randn(4, 4, requires_grad=True)
    q = quantize(torch.randn(4, 4), outer_dtype=torch.float32)
    s = ScaledTensor(torch.randn(4, 4), 0.5, "fuzz")
    return x, n, p, q, s


def _detached_copy(t):
    if isinstance(t, (TwoTensor,)):
        return t.detach().clone().requires_grad_(t.requires_grad)
    if t.__class__ is torch.Tensor:
        return t.detach().clone().requires_grad_(t.requires_grad)
    return t  # constants (QuantizedWeight, ScaledTensor) are shared, never mutated


def describe(program):
    names = []
    for instr in program:
        table = {"u": UNARY, "b": BINARY, "c": CONSTANT_RHS}[instr[0]]
        names.append(table[instr[1]][0])
    return " -> ".join(names)


def check_program(program):
    torch.manual_seed(0)
    inputs = _inputs()
    eager_inputs = [_detached_copy(t) for t in inputs]
    jit_inputs = [_detached_copy(t) for t in inputs]
    expected, eloss = run_program(program, *eager_inputs)
    jf = thunder_subclass.jit(lambda *a: run_program(program, *a), executors=_executors())
    actual, loss = jf(*jit_inputs)
    assert_same(actual.detach(), expected.detach())
    assert_same(loss.detach(), eloss.detach())
    eloss.backward()
    loss.backward()
    for e, a in zip(eager_inputs[:3], jit_inputs[:3]):
        assert_same(a.grad, e.grad)


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(step, min_size=1, max_size=6))
def test_random_programs_match_eager(program):
    try:
        check_program(program)
    except Exception as e:
        raise AssertionError(f"program {program} ({describe(program)}) differs from eager: {e}") from e

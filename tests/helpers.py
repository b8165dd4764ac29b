"""Helpers the test files share: subclass factories, "same as eager" comparisons, cache counts, tiny HF models.

Imported as ``from helpers import ...`` (``conftest.py`` puts this folder on ``sys.path``, as for ``subclasses``)."""

import torch

import thunder_subclass  # noqa: F401 (before thunder)
import thunder
from subclasses import TwoTensor


def two(*shape, requires_grad: bool = False, **randn_kwargs) -> TwoTensor:
    """A TwoTensor of two random tensors of ``shape`` (``randn_kwargs``: their dtype, device), requiring grad as a
    whole when ``requires_grad``."""
    return TwoTensor(torch.randn(*shape, **randn_kwargs), torch.randn(*shape, **randn_kwargs)).requires_grad_(
        requires_grad)


def assert_same(actual, expected) -> None:
    """``actual`` is what eager gave (``expected``): the same types all the way down (a tensor subclass's inner
    tensors too, by ``__tensor_flatten__``), equal values (``torch.testing.assert_close``) and dtypes; lists, tuples
    and dicts item by item; anything else ``==``."""
    assert type(actual) is type(expected), (type(actual), type(expected))
    if isinstance(expected, torch.Tensor):
        if type(expected) not in (torch.Tensor, torch.nn.Parameter) and hasattr(expected, "__tensor_flatten__"):
            names, _ = expected.__tensor_flatten__()
            for name in names:
                assert_same(getattr(actual, name), getattr(expected, name))
        else:
            torch.testing.assert_close(actual, expected)
        assert actual.dtype == expected.dtype and actual.shape == expected.shape
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert_same(a, e)
    elif isinstance(expected, dict):
        assert actual.keys() == expected.keys()
        for k in expected:
            assert_same(actual[k], expected[k])
    else:
        assert actual == expected


def cache_counts(jf) -> tuple[int, int]:
    """``(cache misses, cache hits)`` of compiled function ``jf``."""
    return thunder.cache_misses(jf), thunder.cache_hits(jf)


_HF_CONFIGS = {  # architecture -> (config class, model class) of transformers
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),  # q/k/v Linears with bias
    "mistral": ("MistralConfig", "MistralForCausalLM"),  # sliding-window cache layers
}


def tiny_causal_lm(arch: str = "llama", num_hidden_layers: int = 1, **config):
    """A tiny randomly initialised transformers causal LM of ``arch`` (hidden size 64, 4 heads of which 2 key/value
    heads, vocabulary 256; ``config`` overrides), in eval mode, the same weights every time."""
    import transformers

    config_cls, model_cls = (getattr(transformers, n) for n in _HF_CONFIGS[arch])
    config = config_cls(**{"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": num_hidden_layers,
                           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, **config})
    torch.manual_seed(0)
    return model_cls(config).eval()


HF_ARCHITECTURES = tuple(_HF_CONFIGS)


def _sizes_cached() -> bool:
    nt = torch.nested.nested_tensor([torch.ones(2, 1), torch.ones(3, 1)], layout=torch.jagged)
    return nt.size(1) is nt.size(1)


_NESTED_INT_OBJECTS_CACHED = _sizes_cached()


def same_nested_int(a, b) -> bool:
    """``a`` is nested int ``b``: the same object where torch caches a NestedTensor's sizes (2.11 and later: eager's
    ``nt.size(1) is nt.size(1)``), else equal (torch 2.10 makes a new SymInt of the same node per call)."""
    if _NESTED_INT_OBJECTS_CACHED:
        return a is b
    return type(a) is torch.SymInt and type(b) is torch.SymInt and a == b

"""Hugging Face transformers models holding torchao subclasses, called as their users call them (tiny random
configs, no download): the forward at default arguments, greedy generate with the compiled forward, float8
training. Values and tokens against eager."""

import pytest
import torch

import thunder
import thunder_subclass

transformers = pytest.importorskip("transformers")
tq = pytest.importorskip("torchao.quantization")

_CONFIGS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),  # q/k/v Linears with bias
    "mistral": ("MistralConfig", "MistralForCausalLM"),  # sliding-window cache layers
}


def _model(arch, num_hidden_layers=1):
    config_cls, model_cls = (getattr(transformers, n) for n in _CONFIGS[arch])
    config = config_cls(hidden_size=64, intermediate_size=128, num_hidden_layers=num_hidden_layers,
                        num_attention_heads=4, num_key_value_heads=2, vocab_size=256)
    torch.manual_seed(0)
    return model_cls(config).eval()


def _quantized(arch, config_name):
    model = _model(arch)
    tq.quantize_(model, getattr(tq, config_name)())
    return model


def _input_ids(batch=2, seq=8):
    return torch.randint(0, 256, (batch, seq), generator=torch.Generator().manual_seed(1))


def _left_padding_mask(ids):
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    return mask


@pytest.mark.parametrize(
    "arch, config_name, weight_types, masks",
    [
        # torchao 0.18's weight types; torchao 0.16 (the torch 2.10 stack) makes the older ones named second
        ("llama", "Int8WeightOnlyConfig", ("Int8Tensor", "AffineQuantizedTensor"), ("none", "left padding")),
        ("qwen2", "Int8DynamicActivationInt8WeightConfig", ("Int8Tensor", "LinearActivationQuantizedTensor"),
         ("none",)),
        ("mistral", "Float8WeightOnlyConfig", ("Float8Tensor",), ("ones",)),
    ],
)
def test_quantized_forward_at_default_arguments(arch, config_name, weight_types, masks):
    model = _quantized(arch, config_name)
    weight_type = type(model.model.layers[0].self_attn.q_proj.weight).__name__
    assert weight_type in weight_types
    ids = _input_ids()
    jmodel = thunder_subclass.jit(model)
    for mask in masks:
        kwargs = {
            "none": {},
            "ones": {"attention_mask": torch.ones_like(ids)},
            "left padding": {"attention_mask": _left_padding_mask(ids)},
        }[mask]
        with torch.no_grad():
            torch.testing.assert_close(jmodel(ids, **kwargs).logits, model(ids, **kwargs).logits)
    assert f"{weight_type}[" in str(thunder.last_traces(jmodel)[0])  # the weights are subclass proxies


def test_thunder_compile_with_the_hf_recipe_and_the_plugin():
    # thunder's own recipe for these models (HFTransformers: its sdpa-mask symbol, in-place index_copy for
    # StaticCache) with nvFuser left out for CPU, plus the tensor-subclass plugin, at default arguments
    from thunder.recipes import HFTransformers

    try:
        recipe = HFTransformers()
    except AttributeError as e:  # transformers 5.x: masking_utils.sdpa_mask_recent_torch is gone
        pytest.skip(f"thunder 0.2.6's HFTransformers recipe cannot be built with transformers "
                    f"{transformers.__version__} ({e}); it declares support up to 4.55.4")
    model = _quantized("llama", "Int8WeightOnlyConfig")
    recipe.executor_names = [n for n in recipe.executor_names if n != "nvfuser"]
    compiled = thunder.compile(model, recipe=recipe, plugins="tensor-subclass")
    ids = _input_ids()
    for kwargs in ({}, {"attention_mask": _left_padding_mask(ids)}):
        with torch.no_grad():
            torch.testing.assert_close(compiled(ids, **kwargs).logits, model(ids, **kwargs).logits)
    assert "Int8Tensor[" in str(thunder.last_traces(compiled)[0])


def _generate_compiled(arch, jit_kwargs=None, **generate_kwargs):
    """Greedy generate with eager's forward, then with the compiled forward plugged in (``model.forward =
    thunder_subclass.jit(model.forward)``); asserts equal tokens and returns the compiled forward."""
    model = _quantized(arch, "Int8WeightOnlyConfig")
    ids = _input_ids()
    if generate_kwargs.pop("padding", False):
        generate_kwargs["attention_mask"] = _left_padding_mask(ids)
    kwargs = dict(do_sample=False, pad_token_id=0, **generate_kwargs)
    with torch.no_grad():
        expected = model.generate(ids, **kwargs)
        model.forward = jforward = thunder_subclass.jit(model.forward, **(jit_kwargs or {}))
        tokens = model.generate(ids, **kwargs)
    assert torch.equal(tokens, expected)
    return jforward


def test_generate_with_static_cache_compiles_prefill_and_decode_once():
    jforward = _generate_compiled("llama", max_new_tokens=16, cache_implementation="static")
    # one trace for the prefill, one for every decode step (the static cache keeps every shape fixed)
    assert thunder.cache_misses(jforward) == 2
    assert thunder.cache_hits(jforward) == 14


def test_generate_with_dynamic_cache_and_padding():
    jforward = _generate_compiled("mistral", max_new_tokens=2, padding=True)
    # the DynamicCache grows by one position per token: a trace per step (subclass operations are unrolled on
    # fakes of the current sizes)
    assert thunder.cache_misses(jforward) == 2


@pytest.mark.parametrize("arch", ["llama", "mistral"])  # mistral: sliding-window cache layers
def test_generate_with_dynamic_cache_at_default_settings_stops_retracing(arch):
    # automatic dynamic shapes: the first decode step misses on sizes only, so its trace makes them symbolic
    jforward = _generate_compiled(arch, max_new_tokens=16, padding=True)
    assert thunder.cache_misses(jforward) == 2
    assert thunder.cache_hits(jforward) == 14


def test_generate_with_dynamic_cache_and_symbolic_values_compiles_prefill_and_decode_once():
    jforward = _generate_compiled("llama", {"cache": "symbolic values"}, max_new_tokens=4, padding=True)
    # the cache length grows but never reaches a subclass operation: it stays symbolic
    assert thunder.cache_misses(jforward) == 2
    assert thunder.cache_hits(jforward) == 2


def test_float8_training_two_steps():
    from torchao.float8 import convert_to_float8_training

    def build():
        model = _model("llama").train()
        convert_to_float8_training(model)
        return model

    eager, model = build(), build()
    model.load_state_dict(eager.state_dict())
    assert type(model.model.layers[0].mlp.up_proj).__name__ == "Float8Linear"
    jmodel = thunder_subclass.jit(model)
    ids = _input_ids(2, 16)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (eager, model)]
    for _ in range(2):
        for opt in optimizers:
            opt.zero_grad()
        expected = eager(ids, labels=ids).loss
        expected.backward()
        loss = jmodel(ids, labels=ids).loss
        loss.backward()
        torch.testing.assert_close(loss, expected)
        for (name, p), q in zip(model.named_parameters(), eager.parameters()):
            torch.testing.assert_close(p.grad, q.grad, msg=name)
        for opt in optimizers:
            opt.step()
    for p, q in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(p, q)
    assert thunder.cache_misses(jmodel) == 1

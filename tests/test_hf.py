"""Hugging Face transformers models holding torchao subclasses, called as their users call them (tiny random
configs, no download): the forward at default arguments, greedy generate with the compiled forward, float8
training. Values and tokens against eager."""

import pytest
import torch

import thunder
import thunder_subclass
from helpers import tiny_causal_lm

transformers = pytest.importorskip("transformers")
tq = pytest.importorskip("torchao.quantization")

def _model(arch, num_hidden_layers=1):
    return tiny_causal_lm(arch, num_hidden_layers)


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
    # (torchao 0.18's weight type; 0.16, the torch 2.10 stack's, makes AffineQuantizedTensor)
    assert any(f"{t}[" in str(thunder.last_traces(compiled)[0]) for t in ("Int8Tensor", "AffineQuantizedTensor"))


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


@pytest.mark.slow
def test_generate_with_static_cache_compiles_prefill_and_decode_once():
    jforward = _generate_compiled("llama", max_new_tokens=16, cache_implementation="static")
    # one trace for the prefill, one for every decode step (the static cache keeps every shape fixed)
    assert thunder.cache_misses(jforward) == 2
    assert thunder.cache_hits(jforward) == 14


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["llama", "mistral"])  # mistral: sliding-window cache layers
def test_generate_with_dynamic_cache_at_default_settings_stops_retracing(arch):
    # automatic dynamic shapes: the first decode step misses on sizes only, so its trace makes them symbolic
    # (left padding: an attention mask; the DynamicCache grows by one position per token)
    jforward = _generate_compiled(arch, max_new_tokens=16, padding=True)
    assert thunder.cache_misses(jforward) == 2
    assert thunder.cache_hits(jforward) == 14


@pytest.mark.slow
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


# families whose code reaches thunder 0.2.6 interpreter gaps (_thunder_internals.interpreter_fixes); plain models
# from tiny random configs, against eager


def _gemma(config_name, model_name, **config):
    torch.manual_seed(0)
    config = getattr(transformers, config_name)(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
        head_dim=16, vocab_size=64, **config)
    return getattr(transformers, model_name)(config).eval()


def test_gemma_with_symbolic_values():
    # the embedding scale torch.tensor(config.hidden_size ** 0.5) of a number proxy: plain thunder 0.2.6 "NameError:
    # name 'n' is not defined"
    model = _gemma("GemmaConfig", "GemmaForCausalLM")
    jmodel = thunder_subclass.jit(model, cache="symbolic values")
    with torch.no_grad():
        for seq in (5, 7):
            ids = torch.randint(0, 64, (1, seq), generator=torch.Generator().manual_seed(seq))
            torch.testing.assert_close(jmodel(ids).logits, model(ids).logits)


# ---------------------------------------------------------------------------------------------------------------
# Model families, plain (tiny random configs, 1 layer): the forward at default arguments under every family, greedy
# generate with a dynamic and a static cache under the families whose cache layers or configs differ (sliding
# windows, hybrid layers, attribute_map configs, dynamic RoPE). Run under transformers 4.57 and 5.x (.ci/run).
# ---------------------------------------------------------------------------------------------------------------

_LLAMA_LIKE = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                   num_key_value_heads=2, vocab_size=64)
_FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", _LLAMA_LIKE),
    "llama3 rope": ("LlamaConfig", "LlamaForCausalLM", dict(_LLAMA_LIKE, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16})),
    "dynamic rope": ("LlamaConfig", "LlamaForCausalLM", dict(_LLAMA_LIKE, max_position_embeddings=8, rope_scaling={
        "rope_type": "dynamic", "factor": 2.0})),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", _LLAMA_LIKE),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(_LLAMA_LIKE, head_dim=8)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(_LLAMA_LIKE, sliding_window=4)),
    "phi": ("PhiConfig", "PhiForCausalLM", dict(_LLAMA_LIKE, num_key_value_heads=4)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(_LLAMA_LIKE, pad_token_id=0)),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", dict(_LLAMA_LIKE, head_dim=8)),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(_LLAMA_LIKE, head_dim=8, sliding_window=4)),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(_LLAMA_LIKE, head_dim=8, sliding_window=4)),
    "olmo": ("OlmoConfig", "OlmoForCausalLM", _LLAMA_LIKE),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", _LLAMA_LIKE),
    "starcoder2": ("Starcoder2Config", "Starcoder2ForCausalLM", _LLAMA_LIKE),
    "granite": ("GraniteConfig", "GraniteForCausalLM", _LLAMA_LIKE),
    "cohere": ("CohereConfig", "CohereForCausalLM", _LLAMA_LIKE),
    "stablelm": ("StableLmConfig", "StableLmForCausalLM", _LLAMA_LIKE),
    # GPT-2: PretrainedConfig.__getattribute__ (attribute_map: num_hidden_layers -> n_layer) read by
    # DynamicCache(config=...) built inside forward: plain thunder 0.2.6 "AttributeError: num_hidden_layers"
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(n_layer=1, n_embd=32, n_head=2, vocab_size=64)),
    "gpt-neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", dict(hidden_size=32, intermediate_size=64,
                                                             num_hidden_layers=1, num_attention_heads=4,
                                                             vocab_size=64)),
    "gpt-j": ("GPTJConfig", "GPTJForCausalLM", dict(n_embd=32, n_layer=1, n_head=4, vocab_size=64, rotary_dim=4)),
    "opt": ("OPTConfig", "OPTForCausalLM", dict(hidden_size=32, ffn_dim=64, num_hidden_layers=1,
                                                 num_attention_heads=4, vocab_size=64, word_embed_proj_dim=32)),
    "bloom": ("BloomConfig", "BloomForCausalLM", dict(hidden_size=32, n_layer=1, n_head=4, vocab_size=64)),
    "falcon": ("FalconConfig", "FalconForCausalLM", dict(hidden_size=32, num_hidden_layers=1,
                                                         num_attention_heads=4, vocab_size=64)),
    "bert": ("BertConfig", "BertModel", dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                             num_attention_heads=4, vocab_size=64)),
    "roberta": ("RobertaConfig", "RobertaModel", dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                                      num_attention_heads=4, vocab_size=64)),
    "distilbert": ("DistilBertConfig", "DistilBertModel", dict(dim=32, hidden_dim=64, n_layers=1, n_heads=4,
                                                               vocab_size=64)),
    "vit": ("ViTConfig", "ViTModel", dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                          num_attention_heads=4, image_size=16, patch_size=8)),
}
# generate under these (a dynamic and a static cache): the families whose caches or configs differ
_GENERATING = ("llama", "dynamic rope", "mistral", "gemma2", "gemma3", "gpt2", "phi3")


def _family(name):
    config_name, model_name, config = _FAMILIES[name]
    if not hasattr(transformers, model_name):
        pytest.skip(f"transformers {transformers.__version__} has no {model_name}")
    torch.manual_seed(0)
    return getattr(transformers, model_name)(getattr(transformers, config_name)(**config)).eval()


@pytest.mark.parametrize("name", list(_FAMILIES))
def test_family_forward_at_default_arguments(name):
    model = _family(name)
    jmodel = thunder_subclass.jit(model)
    if name == "vit":
        inputs = (torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1)),)
    else:
        inputs = (torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1)),)
    with torch.no_grad():
        out, expected = jmodel(*inputs), model(*inputs)
    key = "logits" if "logits" in expected else "last_hidden_state"
    torch.testing.assert_close(out[key], expected[key])
    assert thunder.cache_misses(jmodel) == 1


@pytest.mark.slow
@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("name", _GENERATING)
def test_family_generate(name, cache):
    # past the sliding windows (4) and, for dynamic RoPE, past max_position_embeddings (8): the RoPE table grows.
    # Gemma2/Gemma3 with a static cache: once the window is full, StaticSlidingWindowLayer.update rolls with
    # torch.tensor([-1], dtype=int) (plain thunder 0.2.6 "<class 'int'> had an unexpected type")
    model = _family(name)
    ids = torch.randint(1, 64, (1, 4), generator=torch.Generator().manual_seed(1))
    kwargs = dict(do_sample=False, max_new_tokens=8, pad_token_id=0)
    if cache == "static":
        kwargs["cache_implementation"] = "static"
    with torch.no_grad():
        expected = model.generate(ids, **kwargs)
        model.forward = jforward = thunder_subclass.jit(model.forward)
        tokens = model.generate(ids, **kwargs)
    assert torch.equal(tokens, expected)
    assert tokens.shape[1] == ids.shape[1] + kwargs["max_new_tokens"]  # no early stop: past the windows above
    per_token = name == "gpt2" and cache == "dynamic" and transformers.__version__.startswith("4.")
    if name != "dynamic rope" and not per_token:
        # (dynamic RoPE's growth is data-dependent: the RoPE module runs eagerly on those steps; GPT-2's DynamicCache
        # under transformers 4.x retraces per token, see docs/huggingface.md)
        # the prefill, the first decode step, a symbolic decode step: not a trace per token
        assert thunder.cache_misses(jforward) <= 3, thunder_subclass.explain_recompiles(jforward)

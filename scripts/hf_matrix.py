"""Hugging Face x torchao x thunder_subclass matrix for the transformers installed in the running interpreter.

Run once per transformers version (each in its own environment), e.g.

    python scripts/hf_matrix.py                      # forward, generate, training; prints one table row per case
    /path/to/venv/bin/python scripts/hf_matrix.py --only forward

Cases (tiny random configs, 2 layers, no download): the forward `model(input_ids)` at default arguments with no mask,
a mask of ones and left padding, for Llama / Qwen2 / Mistral x no quantization / int8 weight-only / float8
weight-only / int8 dynamic; greedy `generate` (16 tokens) with the compiled forward and a StaticCache or a
DynamicCache (4 tokens; 16 with cache="symbolic values"); float8 training (2 SGD steps). Each case prints its result against eager (max abs
difference, tokens equal), the cache misses of the compiled function and the time of the compiled calls.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), os.pardir))
sys.path.insert(0, ROOT)

import thunder_subclass  # noqa: E402  (before thunder)
import thunder  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

ARCHS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
}
QUANT = {
    "none": None,
    "int8wo": "Int8WeightOnlyConfig",
    "fp8wo": "Float8WeightOnlyConfig",
    "int8dyn": "Int8DynamicActivationInt8WeightConfig",
}


def model_for(arch: str, quant: str, layers: int = 2):
    config_cls, model_cls = (getattr(transformers, n) for n in ARCHS[arch])
    config = config_cls(hidden_size=64, intermediate_size=128, num_hidden_layers=layers, num_attention_heads=4,
                        num_key_value_heads=2, vocab_size=256)
    torch.manual_seed(0)
    model = model_cls(config).eval()
    if QUANT[quant] is not None:
        import torchao.quantization as tq

        tq.quantize_(model, getattr(tq, QUANT[quant])())
    return model


def input_ids(batch=2, seq=16):
    return torch.randint(0, 256, (batch, seq), generator=torch.Generator().manual_seed(1))


def mask_kwargs(ids, mask: str) -> dict:
    if mask == "none":
        return {}
    attention_mask = torch.ones_like(ids)
    if mask == "leftpad":
        attention_mask[0, :3] = 0
    return {"attention_mask": attention_mask}


def forward_case(arch, quant, mask):
    model = model_for(arch, quant)
    ids = input_ids()
    kwargs = mask_kwargs(ids, mask)
    with torch.no_grad():
        expected = model(ids, **kwargs).logits
        jmodel = thunder_subclass.jit(model)
        start = time.perf_counter()
        logits = jmodel(ids, **kwargs).logits
        elapsed = time.perf_counter() - start
    torch.testing.assert_close(logits, expected)
    return f"OK maxdiff={(logits - expected).abs().max().item():.3g} misses={thunder.cache_misses(jmodel)} first_call={elapsed:.1f}s"


def generate_case(arch, quant, cache_kind, **jit_kwargs):
    model = model_for(arch, quant)
    ids = input_ids(2, 8)
    kwargs = dict(max_new_tokens=16 if cache_kind == "static" or jit_kwargs else 4, do_sample=False, pad_token_id=0)
    if cache_kind == "static":
        kwargs["cache_implementation"] = "static"
    with torch.no_grad():
        expected = model.generate(ids, **kwargs)
        model.forward = jforward = thunder_subclass.jit(model.forward, **jit_kwargs)
        start = time.perf_counter()
        tokens = model.generate(ids, **kwargs)
        elapsed = time.perf_counter() - start
    equal = torch.equal(tokens, expected)
    return (f"{'EQUAL' if equal else 'DIFFERENT'} tokens={kwargs['max_new_tokens']} "
            f"misses={thunder.cache_misses(jforward)} hits={thunder.cache_hits(jforward)} time={elapsed:.1f}s")


def train_case(arch):
    from torchao.float8 import convert_to_float8_training

    def build():
        model = model_for(arch, "none").train()
        convert_to_float8_training(model)
        return model

    eager, model = build(), build()
    model.load_state_dict(eager.state_dict())
    jmodel = thunder_subclass.jit(model)
    ids = input_ids()
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (eager, model)]
    grad_diff = 0.0
    for _ in range(2):
        for opt in optimizers:
            opt.zero_grad()
        expected = eager(ids, labels=ids).loss
        expected.backward()
        loss = jmodel(ids, labels=ids).loss
        loss.backward()
        torch.testing.assert_close(loss, expected)
        for p, q in zip(model.parameters(), eager.parameters()):
            torch.testing.assert_close(p.grad, q.grad)
            grad_diff = max(grad_diff, (p.grad - q.grad).abs().max().item())
        for opt in optimizers:
            opt.step()
    param_diff = max((p - q).abs().max().item() for p, q in zip(model.parameters(), eager.parameters()))
    return f"OK grad_maxdiff={grad_diff:.3g} param_maxdiff={param_diff:.3g} misses={thunder.cache_misses(jmodel)}"


def cases(only: set[str], archs: list[str], quants: list[str], masks: list[str]):
    if "forward" in only:
        for arch in archs:
            for quant in quants:
                for mask in masks:
                    yield f"forward {arch} {quant} mask={mask}", lambda a=arch, q=quant, m=mask: forward_case(a, q, m)
    if "generate" in only:
        for arch in archs:
            for quant in (q for q in quants if q != "none"):
                yield f"generate {arch} {quant} cache=static", lambda a=arch, q=quant: generate_case(a, q, "static")
        yield "generate llama int8wo cache=dynamic", lambda: generate_case("llama", "int8wo", "dynamic")
        for arch in archs:
            yield (f"generate {arch} int8wo cache=dynamic jit(cache='symbolic values')",
                   lambda a=arch: generate_case(a, "int8wo", "dynamic", cache="symbolic values"))
    if "train" in only:
        for arch in archs:
            yield f"train float8 {arch}", lambda a=arch: train_case(a)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="forward,generate,train", help="comma-separated: forward,generate,train")
    parser.add_argument("--archs", default=",".join(ARCHS))
    parser.add_argument("--quants", default=",".join(QUANT))
    parser.add_argument("--masks", default="none,ones,leftpad")
    args = parser.parse_args()
    assert thunder_subclass.__file__.startswith(ROOT), thunder_subclass.__file__
    print(f"| transformers | case | result |", flush=True)
    print("|---|---|---|", flush=True)
    selection = (args.archs.split(","), args.quants.split(","), args.masks.split(","))
    for name, run in cases(set(args.only.split(",")), *selection):
        try:
            result = run()
        except Exception as e:  # a failing case is a row of the table
            result = "FAIL " + f"{type(e).__name__}: {e}".replace("\n", " ").replace("|", "/")[:300]
        print(f"| {transformers.__version__} | {name} | {result} |", flush=True)


if __name__ == "__main__":
    main()

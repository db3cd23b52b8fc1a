#!/usr/bin/env python3
"""The HF transformers baseline of issue 14: transformers' `qwen4_exp` reference model in bf16 on
the GPU with the released Qwen 3.8 Flash Next shapes (layers reduced, PLE off by default; random
weights from HF's own init), timed for batch-1 greedy decode and prefill. Prints one JSON object
(and writes it with --json).

    python3 tools/bench/hf_baseline.py --layers 8 --json hf.json [--compile]

--compile wraps the model's forward in torch.compile; run it under `timeout`, compilation of this
model may take minutes (gpu_bench.sh gives it a fixed budget and reports when it ran out).
"""
import argparse
import json
import sys
import time

import torch


def config_dict(layers, ple):
    # The shapes of src/bench/bench_config.cpp (arch-qwen.md section 1, the released model).
    types = ["qwen_sparse_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)]
    return dict(
        vocab_size=248320, hidden_size=2560, num_hidden_layers=layers, num_attention_heads=24,
        num_key_value_heads=2, head_dim=256, hidden_act="silu", rms_norm_eps=1e-6,
        tie_word_embeddings=False, attention_bias=False, max_position_embeddings=262144,
        rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
        linear_conv_kernel_dim=4, linear_key_head_dim=128, linear_value_head_dim=128,
        linear_num_key_heads=16, linear_num_value_heads=48, num_experts=512, num_experts_per_tok=10,
        moe_intermediate_size=640, shared_expert_intermediate_size=640, norm_topk_prob=True,
        hc_count=4, hc_lowrank=320, ple_layer_ids=[2] if ple else [], ple_embed_dim=2560,
        ple_conv_kernel_size=4, ngram_size=3, heads_per_ngram=8, split_ngram_parts=1,
        indexer_n_heads=4, indexer_kv_heads=1, indexer_head_dim=128, indexer_budget=2048,
        indexer_compress_ratio=4, output_gate_type="sigmoid", eos_token_id=248044,
        layer_types=types)


def sync():
    torch.cuda.synchronize()


def forward(model, ids, cache):
    try:
        return model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
    except TypeError:
        return model(input_ids=ids, past_key_values=cache, use_cache=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--ple", action="store_true", help="PLE on layer 2 (its table is 100+ GB)")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--decode-tokens", type=int, default=24)
    ap.add_argument("--prefill", type=int, default=4096)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args()

    import transformers
    from transformers.models.qwen4_exp import modeling_qwen4_exp as Q
    from transformers.models.qwen4_exp.configuration_qwen4_exp import Qwen4ExpTextConfig

    t0 = time.time()
    try:
        cfg = Qwen4ExpTextConfig(**config_dict(a.layers, a.ple))
    except (ValueError, TypeError) as e:  # an empty PLE list refused: leave the field unset
        print(f"hf: config with ple_layer_ids=[] refused ({e}); trying None", file=sys.stderr)
        d = config_dict(a.layers, a.ple)
        d["ple_layer_ids"] = None
        cfg = Qwen4ExpTextConfig(**d)
    print(f"hf: ple_layer_ids {getattr(cfg, 'ple_layer_ids', None)}", file=sys.stderr, flush=True)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = Q.Qwen4ExpForCausalLM(cfg)
    model.eval()
    params = sum(p.numel() for p in model.parameters())
    build_s = time.time() - t0
    print(f"hf: {a.layers} layers, {params / 1e9:.2f} B parameters, built in {build_s:.1f} s",
          file=sys.stderr, flush=True)
    if a.compile:
        model.forward = torch.compile(model.forward)
    V = cfg.vocab_size
    g = torch.Generator(device="cuda").manual_seed(1)
    out = {"transformers": transformers.__version__, "torch": torch.__version__,
           "layers": a.layers, "ple": a.ple, "dtype": "bf16", "attn": "eager",
           "compile": a.compile, "parameters": params, "build_s": build_s,
           "device": torch.cuda.get_device_name()}
    with torch.no_grad():
        # Decode after a prefilled context (warm-up steps first; compile happens there).
        ids = torch.randint(1, V, (1, a.context), device="cuda", generator=g)
        t = time.time()
        o = forward(model, ids, None)
        sync()
        out["context_prefill_s"] = time.time() - t
        cache = o.past_key_values
        tok = o.logits[:, -1:].argmax(-1)
        warm = 3
        for i in range(warm + a.decode_tokens):
            if i == warm:
                sync()
                t = time.time()
            o = forward(model, tok, cache)
            cache = o.past_key_values
            tok = o.logits[:, -1:].argmax(-1)
        sync()
        dt = time.time() - t
        out["decode"] = {"context": a.context, "tokens": a.decode_tokens, "seconds": dt,
                         "tokens_per_s": a.decode_tokens / dt}
        print(f"hf: decode {a.decode_tokens / dt:.2f} tok/s", file=sys.stderr, flush=True)
        del cache, o
        # Prefill: a short warm-up, then the timed length.
        forward(model, torch.randint(1, V, (1, 256), device="cuda", generator=g), None)
        sync()
        ids = torch.randint(1, V, (1, a.prefill), device="cuda", generator=g)
        t = time.time()
        forward(model, ids, None)
        sync()
        dt = time.time() - t
        out["prefill"] = {"tokens": a.prefill, "seconds": dt, "tokens_per_s": a.prefill / dt}
        print(f"hf: prefill {a.prefill} tokens {a.prefill / dt:.1f} tok/s", file=sys.stderr, flush=True)
    out["peak_memory_bytes"] = torch.cuda.max_memory_allocated()
    text = json.dumps(out)
    print(text)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()

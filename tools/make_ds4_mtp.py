#!/usr/bin/env python3
"""Adds a random DeepSeek V4 MTP block ("mtp.0.*", arch-dsv4.md 4) to a deepseek_v4 model folder.

HF's DeepseekV4 has no MTP module (it ignores mtp.* on load), so there is no reference to train
or check against; these weights exist so that the MTP invariants (greedy MTP == autoregressive,
the state after every exit path, the sampled distribution) can be tested on the tiny fixture.
The block is flashserve's src/model/deepseek_v4/schema.cpp deepseek_v4_mtp_tensors: enorm, hnorm,
e_proj, h_proj, one decoder layer (sliding attention, score-routed MoE) named as the trunk's
layers, hc_head and norm. Standard library only (no numpy, no torch).

  tools/make_ds4_mtp.py --model DIR --out DIR [--seed N]
"""
import argparse
import json
import os
import random
import struct

from safetensors_io import read_safetensors, write_safetensors


def mtp_shapes(c):
    H, hc, D, Hq = c["hidden_size"], c.get("hc_mult", 4), c["head_dim"], c["num_attention_heads"]
    Rq, G, Ro = c["q_lora_rank"], c["o_groups"], c["o_lora_rank"]
    E, I = c["n_routed_experts"], c["moe_intermediate_size"]
    Is = I * c.get("n_shared_experts", 1)
    mix = (2 + hc) * hc
    s = {
        "enorm.weight": ([H], "norm"), "hnorm.weight": ([H], "norm"),
        "e_proj.weight": ([H, H], "matrix"), "h_proj.weight": ([H, H], "matrix"),
        "input_layernorm.weight": ([H], "norm"), "post_attention_layernorm.weight": ([H], "norm"),
        "self_attn.q_a_proj.weight": ([Rq, H], "matrix"), "self_attn.q_a_norm.weight": ([Rq], "norm"),
        "self_attn.q_b_proj.weight": ([Hq * D, Rq], "matrix"),
        "self_attn.kv_proj.weight": ([D, H], "matrix"), "self_attn.kv_norm.weight": ([D], "norm"),
        "self_attn.o_a_proj.weight": ([G * Ro, Hq * D // G], "matrix"),
        "self_attn.o_b_proj.weight": ([H, G * Ro], "matrix"), "self_attn.sinks": ([Hq], "bias"),
        "mlp.gate.weight": ([E, H], "matrix"), "mlp.gate.e_score_correction_bias": ([E], "bias"),
        "mlp.experts.gate_up_proj": ([E, 2 * I, H], "matrix"),
        "mlp.experts.down_proj": ([E, H, I], "matrix"),
        "mlp.shared_experts.gate_proj.weight": ([Is, H], "matrix"),
        "mlp.shared_experts.up_proj.weight": ([Is, H], "matrix"),
        "mlp.shared_experts.down_proj.weight": ([H, Is], "matrix"),
        "hc_head.hc_fn": ([hc, hc * H], "matrix"), "hc_head.hc_base": ([hc], "bias"),
        "hc_head.hc_scale": ([1], "scale"), "norm.weight": ([H], "norm"),
    }
    for site in ("attn_hc.", "ffn_hc."):
        s[site + "fn"] = ([mix, hc * H], "matrix")
        s[site + "base"] = ([mix], "bias")
        s[site + "scale"] = ([3], "scale")
    return s


def values(rng, shape, kind):
    n = 1
    for d in shape:
        n *= d
    # As the fixture recipe (arch-dsv4.md 8): matrices N(0, 0.15), 1-D parameters noised around
    # their initial values so that norms, sinks, biases and scales are not trivially 0 or 1.
    if kind == "matrix":
        return [rng.gauss(0.0, 0.15) for _ in range(n)]
    if kind == "norm" or kind == "scale":
        return [1.0 + rng.gauss(0.0, 0.3) for _ in range(n)]
    return [rng.gauss(0.0, 0.3) for _ in range(n)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=4)
    a = ap.parse_args()
    with open(os.path.join(a.model, "config.json")) as f:
        config = json.load(f)
    if config.get("model_type") != "deepseek_v4":
        raise SystemExit(a.model + " is not a deepseek_v4 folder")
    metadata, tensors = read_safetensors(os.path.join(a.model, "model.safetensors"))
    rng = random.Random(a.seed)
    for name, (shape, kind) in sorted(mtp_shapes(config).items()):
        v = values(rng, shape, kind)
        tensors["mtp.0." + name] = ("F32", shape, struct.pack("<%df" % len(v), *v))
    os.makedirs(a.out, exist_ok=True)
    config["num_nextn_predict_layers"] = 1
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    write_safetensors(os.path.join(a.out, "model.safetensors"), tensors, metadata)


if __name__ == "__main__":
    main()

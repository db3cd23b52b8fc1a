#!/usr/bin/env python3
"""Adds an MTP layer with random weights to a glm5_next checkpoint (torch-free).

HF's glm5_next has no MTP module (it drops the keys `layers.<num_hidden_layers>.*`), so a test
model with an MTP head cannot come from the reference: this writes one in the layout
src/model/glm5/mtp.h reads (enorm, hnorm, eh_proj [D, 2D], a DSA block with its own indexer, the
MoE with its shared expert, shared_head.norm), next to the trunk's tensors, as float32.

  tools/glm5_mtp_weights.py --model DIR --out DIR2 [--seed N]

DIR2 gets config.json (with num_nextn_predict_layers = 1) and model.safetensors (the trunk's
tensors unchanged plus the MTP layer's). Values are uniform in +-1/sqrt(fan_in) for matrices,
1 +- 0.1 for norm weights, +-0.1 for biases, from Python's seeded generator, so a seed gives the
same file on every machine.
"""
import argparse
import array
import json
import os
import random
import struct
import sys

from safetensors_io import read_safetensors, write_safetensors


def mtp_specs(c):
    """(name, shape, kind) of the MTP layer; kind: matrix (fan_in = last dim), norm or bias."""
    D, L = c["hidden_size"], c["num_hidden_layers"]
    Hq, q, kv = c["num_attention_heads"], c["q_lora_rank"], c["kv_lora_rank"]
    nope, v, rope = c["qk_nope_head_dim"], c["v_head_dim"], c.get("qk_rope_head_dim", 0)
    nI, dI, kp = c["index_n_heads"], c["index_head_dim"], c["index_kpool"]
    E, I = c["n_routed_experts"], c["moe_intermediate_size"]
    Is = I * c.get("n_shared_experts", 1)
    p = f"model.language_model.layers.{L}."
    a, m = p + "self_attn.", p + "mlp."
    out = [
        (p + "enorm.weight", [D], "norm"),
        (p + "hnorm.weight", [D], "norm"),
        (p + "eh_proj.weight", [D, 2 * D], "matrix"),
        (p + "input_layernorm.weight", [D], "norm"),
        (p + "post_attention_layernorm.weight", [D], "norm"),
        (a + "q_a_proj.weight", [q, D], "matrix"),
        (a + "q_a_layernorm.weight", [q], "norm"),
        (a + "q_b_proj.weight", [Hq * (nope + rope), q], "matrix"),
        (a + "kv_a_proj_with_mqa.weight", [kv + rope, D], "matrix"),
        (a + "kv_a_layernorm.weight", [kv], "norm"),
        (a + "kv_b_proj.weight", [Hq * (nope + v), kv], "matrix"),
        (a + "o_proj.weight", [D, Hq * v], "matrix"),
        (a + "indexer.wq_b.weight", [nI * dI, q], "matrix"),
        (a + "indexer.wk.weight", [dI, D], "matrix"),
        (a + "indexer.k_norm.weight", [dI], "norm"),
        (a + "indexer.k_norm.bias", [dI], "bias"),
        (a + "indexer.weights_proj.weight", [nI, D], "matrix"),
        (a + "indexer.index_kpool_compress_ape", [kp, dI], "bias"),
        (a + "indexer.index_kpool_compress_gate", [dI, D], "matrix"),
        (m + "gate.weight", [E, D], "matrix"),
        (m + "gate.e_score_correction_bias", [E], "bias"),
        (m + "experts.gate_up_proj", [E, 2 * I, D], "matrix"),
        (m + "experts.down_proj", [E, D, I], "matrix"),
        (m + "shared_experts.gate_proj.weight", [Is, D], "matrix"),
        (m + "shared_experts.up_proj.weight", [Is, D], "matrix"),
        (m + "shared_experts.down_proj.weight", [D, Is], "matrix"),
        (p + "shared_head.norm.weight", [D], "norm"),
    ]
    if c.get("attention_bias", False):
        out += [(a + "q_a_proj.bias", [q], "bias"), (a + "kv_a_proj_with_mqa.bias", [kv + rope], "bias"),
                (a + "o_proj.bias", [D], "bias")]
    return out


def values(rng, shape, kind):
    n = 1
    for s in shape:
        n *= s
    if kind == "norm":
        return [1.0 + rng.uniform(-0.1, 0.1) for _ in range(n)]
    if kind == "bias":
        return [rng.uniform(-0.1, 0.1) for _ in range(n)]
    bound = shape[-1] ** -0.5
    return [rng.uniform(-bound, bound) for _ in range(n)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    with open(os.path.join(args.model, "config.json")) as f:
        config = json.load(f)
    c = config.get("text_config", config)
    metadata, tensors = read_safetensors(os.path.join(args.model, "model.safetensors"))
    rng = random.Random(args.seed)
    for name, shape, kind in mtp_specs(c):
        if name in tensors:
            sys.exit(f"{args.model} already has {name}")
        tensors[name] = ("F32", shape, array.array("f", values(rng, shape, kind)).tobytes())
    os.makedirs(args.out, exist_ok=True)
    config["num_nextn_predict_layers"] = 1
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    write_safetensors(os.path.join(args.out, "model.safetensors"), tensors, metadata)


if __name__ == "__main__":
    main()

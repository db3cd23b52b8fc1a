#!/usr/bin/env python3
"""Trains flashserve's embedded default model: a small Qwen 3.8 Flash Next (qwen4_exp) with every
layer kind (GatedDeltaNet, QSA sparse attention, PLE n-gram embeddings, hyper-connections, MoE) and
a jointly trained MTP head, on the Python standard library's sources.

Runs on the H200 machine (PyTorch, HF tokenizers, transformers 5.17 with qwen4_exp):

    python3 tools/train_tiny.py OUT_DIR [--minutes 5.5] [--smoke]

Writes into OUT_DIR: the model shards (bf16 safetensors + index), and extras.tgz holding
config.json, tokenizer.json, tokenizer_config.json, generation_config.json, train_log.json,
loss.png and parity/ (held-out tokens with the training framework's float32 logits for the trunk
and the MTP head, computed with the reference modules from the saved bf16 weights).

The MTP head (flashserve's definition; HF has none for this family, see docs/MTP.md):
    n      = RMSNorm_(1+w), grouped by H, of the trunk's pre-mixer widened stream h_{t-1}  [hc*H]
    x      = fc_hidden(n_i) for each of the hc sub-streams + fc_embedding(RMSNorm(embed(x_t)))
    x      = one qwen_sparse_attention decoder layer (QSA + MoE + both hyper-connections), own cache
    logits = lm_head(hyper_connection_mixer(x)); x (pre-mixer) feeds the next depth
Row t of the MTP sequence (t >= 1) pairs h_{t-1} with x_t at position t-1 and predicts x_{t+1}.
"""
import argparse
import copy
import glob
import io
import json
import math
import os
import random
import sys
import sysconfig
import tarfile
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from transformers.models.qwen4_exp import modeling_qwen4_exp as Q
from transformers.models.qwen4_exp.configuration_qwen4_exp import Qwen4ExpTextConfig

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Qwen2/3's pre-tokenizer split: single digits, letters runs, punctuation runs, newline runs.
SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s+(?!\S)|\s+")
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")


def log(*a):
    print(f"[{time.strftime('%H:%M:%S')}]", *a, flush=True)


def corpus(heldout_fraction=0.03, max_bytes=80 << 20):
    """Python sources present on the machine: the standard library first, then the installed
    packages (torch, transformers, numpy, ...), up to max_bytes; files over 1 MB (generated
    tables) are skipped."""
    import site
    roots = [sysconfig.get_paths()["stdlib"]] + [p for p in site.getsitepackages() if os.path.isdir(p)]
    train, held, total, seen = [], [], 0, set()
    for root in roots:
        for f in sorted(glob.glob(os.path.join(root, "**", "*.py"), recursive=True)):
            if total >= max_bytes:
                break
            real = os.path.realpath(f)
            if real in seen or (root == roots[0] and ("site-packages" in f or "dist-packages" in f)):
                continue
            seen.add(real)
            try:
                if os.path.getsize(f) > (1 << 20):
                    continue
                text = open(f, encoding="utf-8").read()
            except (UnicodeDecodeError, OSError):
                continue
            total += len(text)
            # A stable split by path: held-out files never reach the tokenizer or the model.
            (held if (hash_path(f) % 1000) < heldout_fraction * 1000 else train).append(text)
    return ", ".join(roots), train, held


def hash_path(p):
    h = 1469598103934665603
    for ch in p.encode():
        h = ((h ^ ch) * 1099511628211) % (1 << 64)
    return h


def train_tokenizer(texts, vocab_size):
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    return tok


def model_config(vocab):
    return dict(
        vocab_size=vocab, hidden_size=256, num_hidden_layers=6,
        num_attention_heads=8, num_key_value_heads=2, head_dim=32,
        hidden_act="silu", rms_norm_eps=1e-6, max_position_embeddings=4096,
        tie_word_embeddings=False, attention_bias=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                         "mrope_section": [4, 2, 2], "mrope_interleaved": True},
        linear_conv_kernel_dim=4, linear_key_head_dim=32, linear_value_head_dim=32,
        linear_num_key_heads=4, linear_num_value_heads=8,
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64,
        shared_expert_intermediate_size=128, norm_topk_prob=True,
        hc_count=4, hc_lowrank=16,
        ple_layer_ids=[2], ple_embed_dim=128, ple_conv_kernel_size=4, ngram_size=3, heads_per_ngram=2,
        ngram_vocab_size_base=4001, make_ngram_vocab_size_divisible_by=64, split_ngram_parts=1, seed=1234,
        indexer_n_heads=16, indexer_kv_heads=1, indexer_head_dim=32, indexer_budget=64,
        indexer_compress_ratio=4, output_gate_type="sigmoid", eos_token_id=0,
        layer_types=["linear_attention", "linear_attention", "linear_attention", "qwen_sparse_attention",
                     "linear_attention", "qwen_sparse_attention"],
    )


def causal_float_mask(seq, dtype, device):
    m = torch.full((seq, seq), torch.finfo(dtype).min, dtype=dtype, device=device).triu(1)
    return m[None, None]


class MtpHead(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        mcfg = copy.deepcopy(cfg)
        mcfg.num_hidden_layers = 1
        mcfg.layer_types = ["qwen_sparse_attention"]
        mcfg.ple_layer_ids = []
        self.hc, self.H = cfg.hc_count, cfg.hidden_size
        self.hidden_norm = Q.Qwen4ExpTextRMSNorm(self.hc * self.H, group_size=self.H, eps=cfg.rms_norm_eps)
        self.embed_norm = Q.Qwen4ExpTextRMSNorm(self.H, eps=cfg.rms_norm_eps)
        self.fc_hidden = nn.Linear(self.H, self.H, bias=False)
        self.fc_embedding = nn.Linear(self.H, self.H, bias=False)
        self.layers = nn.ModuleList([Q.Qwen4ExpTextDecoderLayer(mcfg, 0)])
        self.hyper_connection_mixer = Q.Qwen4ExpTextGatedResidual(mcfg, use_combine=False)
        # The reference's init conventions: (1+w) norms start at zero, matrices small and random.
        for m in self.modules():
            if isinstance(m, Q.Qwen4ExpTextRMSNorm):
                nn.init.zeros_(m.weight)
        for name, p in self.named_parameters():
            if p.ndim >= 2:
                nn.init.normal_(p, std=cfg.initializer_range)

    def forward(self, stream, emb, position_embeddings, mask):
        n = self.hidden_norm(stream).unflatten(-1, (self.hc, self.H))
        x = self.fc_hidden(n) + self.fc_embedding(self.embed_norm(emb)).unsqueeze(-2)
        x = x.flatten(-2)
        for layer in self.layers:
            x = layer(x, position_embeddings=position_embeddings, attention_mask=mask, conv_mask=None,
                      past_key_values=None, ple_input_ids=None)
        return self.hyper_connection_mixer(x), x


def vectorized_indexer_forward(self, hidden_states, position_embeddings, attention_mask, past_key_values):
    """The QSA block indexer for full causal sequences without cache, without the per-query Python
    loop of the reference (same selection: top-k complete blocks by relu-summed scores of mean-pooled,
    normed, RoPE'd block keys, plus the unfinished tail). Used for training speed only; checked
    against the reference before training, and the parity logits use the reference."""
    assert past_key_values is None
    B, S, _ = hidden_states.shape
    c, dI = self.compress_ratio, self.index_head_dim
    cos, sin = position_embeddings
    qk = self.index_qk_proj(hidden_states)
    q, k = torch.split(qk, [self.index_n_heads * dI, self.index_kv_heads * dI], dim=-1)
    q = self.q_layernorm(q.reshape(B, S, -1, dI))
    q = Q.apply_rotary_pos_emb(q, cos=cos[:, -S:], sin=sin[:, -S:], unsqueeze_dim=2)
    nb = S // c
    allowed = torch.zeros(B, S, S, dtype=torch.bool, device=hidden_states.device)
    qi = torch.arange(S, device=hidden_states.device)
    complete = (qi + 1) // c  # complete blocks visible to query i
    if nb > 0:
        kb = k.reshape(B, S, dI)[:, : nb * c].reshape(B, nb, c, dI).float().mean(2).to(k.dtype)
        kb = self.k_layernorm(kb)
        starts = torch.arange(nb, device=hidden_states.device) * c
        kb = Q.apply_rotary_pos_emb(kb.unsqueeze(2), cos=cos[:, starts], sin=sin[:, starts], unsqueeze_dim=2).squeeze(2)
        scores = torch.einsum("bshd,bkd->bskh", q.float(), kb.float()).relu().sum(-1) / math.sqrt(dI)
        valid = torch.arange(nb, device=hidden_states.device)[None, :] < complete[:, None]  # [S, nb]
        scores = scores.masked_fill(~valid[None], float("-inf"))
        top = scores.topk(min(self.block_topk, nb), dim=-1).indices  # [B, S, k]
        chosen = torch.zeros(B, S, nb, dtype=torch.bool, device=hidden_states.device)
        chosen.scatter_(-1, top, True)
        chosen &= valid[None]
        allowed[:, :, : nb * c] = chosen.repeat_interleave(c, dim=-1)
    j = torch.arange(S, device=hidden_states.device)
    tail = (j[None, :] >= (complete * c)[:, None]) & (j[None, :] <= qi[:, None])
    allowed |= tail[None]
    mask = allowed.unsqueeze(1)
    if attention_mask.is_floating_point():
        mask = torch.where(mask, attention_mask.new_zeros(()), torch.finfo(attention_mask.dtype).min)
    return mask


def trunk_and_stream(model, ids):
    """Trunk logits and the pre-mixer widened stream (the MTP input)."""
    captured = {}
    handle = model.model.hyper_connection_mixer.register_forward_pre_hook(
        lambda mod, args: captured.__setitem__("stream", args[0]))
    logits = model(input_ids=ids, use_cache=False).logits
    handle.remove()
    return logits, captured["stream"]


def mtp_logits(model, mtp, ids, stream):
    """Rows t = 1..S-1: head(h_{t-1}, x_t) at position t-1, predicting x_{t+1}."""
    S = ids.shape[1] - 1
    emb = model.model.embed_tokens(ids[:, 1:])
    pos = torch.arange(S, device=ids.device)[None, None].expand(3, ids.shape[0], S)
    pe = model.model.rotary_emb(emb, pos)
    mask = causal_float_mask(S, torch.float32, ids.device)
    mixed, _ = mtp(stream[:, :-1], emb, pe, mask)
    return model.lm_head(mixed)


def shard_state(state, max_bytes):
    shards, cur, size = [], {}, 0
    for k in sorted(state):
        n = state[k].numel() * state[k].element_size()
        if cur and size + n > max_bytes:
            shards.append(cur)
            cur, size = {}, 0
        cur[k] = state[k]
        size += n
    shards.append(cur)
    return shards


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--minutes", type=float, default=5.5)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-3)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(0)
    random.seed(0)
    dev = "cuda"
    t0 = time.time()

    root, train_texts, held_texts = corpus()
    log(f"corpus: {len(train_texts)} train files, {len(held_texts)} held-out, from {root}")
    if args.smoke:
        train_texts = train_texts[:200]
    rng = random.Random(0)
    tok_sample, size = [], 0
    for t in rng.sample(train_texts, len(train_texts)):
        if size > (24 << 20):
            break
        tok_sample.append(t)
        size += len(t)
    tok = train_tokenizer(tok_sample, args.vocab)
    V = tok.get_vocab_size()
    eos = tok.token_to_id("<|endoftext|>")
    assert eos == 0, eos

    def encode_all(texts):
        ids = []
        for enc in tok.encode_batch(texts):
            ids.extend(enc.ids)
            ids.append(eos)
        return torch.tensor(ids, dtype=torch.long)

    train_ids, held_ids = encode_all(train_texts), encode_all(held_texts)
    log(f"tokenizer: vocab {V}; {train_ids.numel()} train tokens, {held_ids.numel()} held-out tokens")

    cfgd = model_config(V)
    cfg = Qwen4ExpTextConfig(**cfgd)
    cfg._attn_implementation = "eager"
    model = Q.Qwen4ExpForCausalLM(cfg).to(dev)
    mtp = MtpHead(cfg).to(dev)
    n_trunk = sum(p.numel() for p in model.parameters())
    n_mtp = sum(p.numel() for p in mtp.parameters())
    log(f"parameters: trunk {n_trunk/1e6:.2f}M, mtp {n_mtp/1e6:.2f}M")

    # The fast indexer must select exactly what the reference selects.
    with torch.no_grad():
        probe = train_ids[: 2 * 160].view(2, 160).to(dev)
        ref = model(input_ids=probe, use_cache=False).logits
        original = Q.Qwen4ExpTextQSAIndexer.forward
        Q.Qwen4ExpTextQSAIndexer.forward = vectorized_indexer_forward
        fast = model(input_ids=probe, use_cache=False).logits
        diff = (ref - fast).abs().max().item()
        log(f"vectorized indexer vs reference: max |dlogits| = {diff:.3g}")
        assert diff < 1e-3, diff

    torch.backends.cuda.matmul.allow_tf32 = True
    params = list(model.parameters()) + list(mtp.parameters())
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    budget_s = 20 if args.smoke else args.minutes * 60
    warmup = 100
    seq, batch = args.seq, args.batch
    n_windows = (train_ids.numel() - 1) // (seq + 1)
    windows = train_ids[: n_windows * (seq + 1)].view(n_windows, seq + 1)
    held_windows = held_ids[: (held_ids.numel() // (seq + 1)) * (seq + 1)].view(-1, seq + 1)[:16].to(dev)
    history = []
    step, start = 0, time.time()
    est_steps = None

    def evaluate():
        model.eval()
        mtp.eval()
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            tl, ml = 0.0, 0.0
            for i in range(0, held_windows.shape[0], 8):
                w = held_windows[i:i + 8]
                logits, stream = trunk_and_stream(model, w[:, :-1])
                tl += F.cross_entropy(logits.float().reshape(-1, V), w[:, 1:].reshape(-1)).item()
                ml_logits = mtp_logits(model, mtp, w[:, :-1], stream)
                ml += F.cross_entropy(ml_logits.float().reshape(-1, V), w[:, 2:].reshape(-1)).item()
            n = math.ceil(held_windows.shape[0] / 8)
        model.train()
        mtp.train()
        return tl / n, ml / n

    model.train()
    mtp.train()
    while True:
        elapsed = time.time() - start
        if elapsed > budget_s:
            break
        if step == 20:
            est_steps = int(budget_s / (elapsed / 20))
        total = est_steps or 10_000
        lr = args.lr * min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, step / total))))
        for g in opt.param_groups:
            g["lr"] = lr
        idx = torch.randint(0, n_windows, (batch,))
        w = windows[idx].to(dev, non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits, stream = trunk_and_stream(model, w[:, :-1])
            loss_trunk = F.cross_entropy(logits.float().reshape(-1, V), w[:, 1:].reshape(-1))
            ml = mtp_logits(model, mtp, w[:, :-1], stream)
            loss_mtp = F.cross_entropy(ml.float().reshape(-1, V), w[:, 2:].reshape(-1))
            loss = loss_trunk + 0.5 * loss_mtp
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step % 25 == 0:
            rec = {"step": step, "seconds": round(time.time() - start, 1), "lr": lr,
                   "tokens_per_s": round(step * batch * seq / max(time.time() - start, 1e-9)),
                   "train_loss": loss_trunk.item(), "train_mtp_loss": loss_mtp.item()}
            if step % 200 == 0:
                rec["heldout_loss"], rec["heldout_mtp_loss"] = evaluate()
            history.append(rec)
            log(json.dumps(rec))
        step += 1
    final_trunk, final_mtp = evaluate()
    log(f"done: {step} steps, {step * batch * seq / 1e6:.1f}M tokens; held-out loss {final_trunk:.3f}, "
        f"MTP held-out loss {final_mtp:.3f}")

    # Save bf16 weights (int64 buffers kept), sharded under the 16 MiB limit of the way back.
    Q.Qwen4ExpTextQSAIndexer.forward = original
    state = {}
    for k, v in model.state_dict().items():
        state[k] = v.detach().to("cpu")
    for k, v in mtp.state_dict().items():
        state["mtp." + k] = v.detach().to("cpu")
    state = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v).contiguous() for k, v in state.items()}
    from safetensors.torch import save_file
    shards = shard_state(state, 14 << 20)
    index = {"metadata": {"total_size": sum(v.numel() * v.element_size() for v in state.values())}, "weight_map": {}}
    for i, sh in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(sh, os.path.join(args.out, name), metadata={"format": "pt"})
        for k in sh:
            index["weight_map"][k] = name

    # Parity data: the reference modules in float32 on the saved bf16 weights, exact indexer.
    torch.backends.cuda.matmul.allow_tf32 = False
    ref_model = Q.Qwen4ExpForCausalLM(cfg).to(dev).float()
    ref_mtp = MtpHead(cfg).to(dev).float()
    ref_model.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in state.items()
                               if not k.startswith("mtp.")}, strict=True)
    ref_mtp.load_state_dict({k[4:]: v.float() for k, v in state.items() if k.startswith("mtp.")}, strict=True)
    ref_model.eval()
    ref_mtp.eval()
    parity_len = 96
    p_ids = held_ids[1000:1000 + parity_len].view(1, -1).to(dev)
    with torch.no_grad():
        p_logits, p_stream = trunk_and_stream(ref_model, p_ids)
        p_mtp = mtp_logits(ref_model, ref_mtp, p_ids, p_stream)

    cfg_json = dict(cfgd)
    cfg_json.update({"model_type": "qwen4_exp_text", "architectures": ["Qwen4ExpForCausalLM"],
                     "mtp_num_hidden_layers": 1, "torch_dtype": "bfloat16", "transformers_version": "5.17.0",
                     "bos_token_id": None, "pad_token_id": None,
                     "eos_token_id": 0})
    files = {
        "config.json": json.dumps(cfg_json, indent=2),
        "model.safetensors.index.json": json.dumps(index, indent=2),
        "tokenizer.json": tok.to_str(),
        "tokenizer_config.json": json.dumps({
            "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None, "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>", "unk_token": None, "model_max_length": 4096,
            "add_bos_token": False, "chat_template": CHAT_TEMPLATE}, indent=2),
        "generation_config.json": json.dumps({"eos_token_id": [tok.token_to_id("<|im_end|>"), eos],
                                              "pad_token_id": eos}, indent=2),
        "train_log.json": json.dumps({
            "steps": step, "batch": batch, "seq": seq, "tokens_seen": step * batch * seq,
            "train_tokens": int(train_ids.numel()), "heldout_tokens": int(held_ids.numel()),
            "train_files": len(train_texts), "heldout_files": len(held_texts), "corpus_root": root,
            "params_trunk": n_trunk, "params_mtp": n_mtp, "final_heldout_loss": final_trunk,
            "final_heldout_mtp_loss": final_mtp, "history": history,
            "torch": torch.__version__, "gpu": torch.cuda.get_device_name(0),
            "wall_seconds": round(time.time() - t0, 1)}, indent=1),
        "parity/tokens.json": json.dumps(p_ids[0].tolist()),
    }
    blobs = {
        "parity/trunk_logits.f32": p_logits[0].float().cpu().numpy().astype("<f4").tobytes(),
        "parity/mtp_logits.f32": p_mtp[0].float().cpu().numpy().astype("<f4").tobytes(),
    }
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(7, 4))
        ax.plot([h["step"] for h in history], [h["train_loss"] for h in history], label="train (next token)")
        ax.plot([h["step"] for h in history], [h["train_mtp_loss"] for h in history], label="train MTP (token after next)")
        ev = [h for h in history if "heldout_loss" in h]
        ax.plot([h["step"] for h in ev], [h["heldout_loss"] for h in ev], "o-", label="held-out (next token)")
        ax.plot([h["step"] for h in ev], [h["heldout_mtp_loss"] for h in ev], "s-", label="held-out MTP")
        ax.set_xlabel("step")
        ax.set_ylabel("cross-entropy (nats)")
        ax.legend()
        ax.grid(alpha=0.3)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
        blobs["loss.png"] = buf.getvalue()
    except ImportError:
        log("matplotlib missing: no loss.png")
    with tarfile.open(os.path.join(args.out, "extras.tgz"), "w:gz") as tar:
        for name, text in list(files.items()) + list(blobs.items()):
            data = text.encode() if isinstance(text, str) else text
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    log(f"wrote {len(shards)} shards and extras.tgz to {args.out} in {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()

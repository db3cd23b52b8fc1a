#!/usr/bin/env python3
"""Trains flashserve's embedded default model: a small Qwen 3.8 Flash Next (qwen4_exp) with every
layer kind (GatedDeltaNet, QSA sparse attention, PLE n-gram embeddings, hyper-connections, MoE) and
a jointly trained MTP head, on Python sources and on synthetic coding-agent conversations in the
Qwen3 chat format (tools/agent_chats.py: long system prompts, tool lists, tool calls, tool results
and answers that quote them), with windows up to 32,768 tokens.

Runs on the H200 machine (PyTorch, HF tokenizers, transformers 5.17 with qwen4_exp):

    python3 tools/train_tiny.py OUT_DIR [--minutes 5] [--smoke]
        [--phases 2048x32:0.45,8192x8:0.25,32768x2:0.3]

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

Long windows: the reference QSA layer builds S x S masks and loops over queries in Python; training
and evaluation use an equivalent that gathers each query's selected keys (the indexer's top blocks
plus the unfinished tail), checked against the reference before training. The reference indexer
gets no gradient (its top-k selection is not differentiable), so an auxiliary loss trains it: for
a sample of queries, the KL divergence from the main attention's dense distribution, summed per
block, to the softmax of the indexer's block scores (inputs detached, so only the indexer learns
from it). It changes no forward computation.
"""
import argparse
import copy
import glob
import io
import json
import math
import multiprocessing as mp
import os
import random
import sys
import sysconfig
import tarfile
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from transformers.models.qwen4_exp import modeling_qwen4_exp as Q
from transformers.models.qwen4_exp.configuration_qwen4_exp import Qwen4ExpTextConfig

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import agent_chats as AC  # noqa: E402
import agent_frames as AF  # noqa: E402

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Qwen3's tag tokens: single tokens, matched in text, but not special (decoding keeps them).
CHAT_TOKENS = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
# Qwen2/3's pre-tokenizer split: single digits, letters runs, punctuation runs, newline runs.
SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s+(?!\S)|\s+")
CODE, PROMPT, TARGET = 0, 1, 2  # what a token is: code (learned), chat prompt (weak), assistant reply
ROLE_WEIGHT = {CODE: 1.0, TARGET: 1.0, PROMPT: 0.1}


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
            (held if (AC.stable_hash(f) % 1000) < heldout_fraction * 1000 else train).append(text)
    return ", ".join(roots), train, held


def train_tokenizer(texts, vocab_size):
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS + CHAT_TOKENS,
                                  show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    j = json.loads(tok.to_str())
    for t in j["added_tokens"]:
        if t["content"] in CHAT_TOKENS:
            t["special"] = False
    return Tokenizer.from_str(json.dumps(j))


def model_config(vocab, max_positions, rope_theta):
    return dict(
        vocab_size=vocab, hidden_size=256, num_hidden_layers=6,
        num_attention_heads=8, num_key_value_heads=2, head_dim=32,
        hidden_act="silu", rms_norm_eps=1e-6, max_position_embeddings=max_positions,
        tie_word_embeddings=False, attention_bias=False,
        rope_parameters={"rope_type": "default", "rope_theta": rope_theta, "partial_rotary_factor": 0.5,
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


# ---------------------------------------------------------------------------------------------
# QSA for long windows: the reference's selection and attention without S x S tensors.

AUX = {"on": False, "queries": 64, "losses": [], "cover": []}


def index_keys(ix, raw_keys, cos, sin):
    """Block keys: (1+w)-normed mean of each complete block's raw keys, RoPE'd at its first token."""
    B, S, dI = raw_keys.shape
    c = ix.compress_ratio
    nb = S // c
    kb = raw_keys[:, : nb * c].reshape(B, nb, c, dI).float().mean(2).to(raw_keys.dtype)
    kb = ix.k_layernorm(kb)
    starts = torch.arange(nb, device=raw_keys.device) * c
    return Q.apply_rotary_pos_emb(kb.unsqueeze(2), cos=cos[:, starts], sin=sin[:, starts], unsqueeze_dim=2).squeeze(2)


def qsa_select(ix, hidden_states, cos, sin):
    """Each query's top-k complete blocks by sum_h relu(q_h . k_b) / sqrt(dI), in float32 as
    flashserve computes it; (blocks [B,S,k], valid [B,S,k]) or None before the first block."""
    B, S, _ = hidden_states.shape
    c, dI, nI = ix.compress_ratio, ix.index_head_dim, ix.index_n_heads
    nb = S // c
    if nb == 0:
        return None
    dev = hidden_states.device
    with torch.no_grad(), torch.autocast("cuda", enabled=False):
        h = hidden_states.float()
        cos, sin = cos.float(), sin.float()
        qk = ix.index_qk_proj(h)
        q, raw = torch.split(qk, [nI * dI, dI], dim=-1)
        q = ix.q_layernorm(q.reshape(B, S, nI, dI))
        q = Q.apply_rotary_pos_emb(q, cos=cos, sin=sin, unsqueeze_dim=2)
        kb = index_keys(ix, raw.contiguous(), cos, sin)  # [B, nb, dI]
        k = min(ix.block_topk, nb)
        blocks = torch.empty(B, S, k, dtype=torch.long, device=dev)
        valid = torch.empty(B, S, k, dtype=torch.bool, device=dev)
        jb = torch.arange(nb, device=dev)
        chunk = max(1, (1 << 27) // (B * nb * nI))
        for s0 in range(0, S, chunk):
            s1 = min(S, s0 + chunk)
            sc = torch.matmul(q[:, s0:s1].reshape(B, -1, dI), kb.transpose(1, 2))
            sc = sc.view(B, s1 - s0, nI, nb).relu_().sum(2) / math.sqrt(dI)
            complete = (torch.arange(s0, s1, device=dev) + 1) // c
            sc.masked_fill_(~(jb[None, :] < complete[:, None])[None], float("-inf"))
            top = sc.topk(k, dim=-1)
            blocks[:, s0:s1] = top.indices
            valid[:, s0:s1] = top.values > float("-inf")
    return blocks, valid


def qsa_token_index(sel, B, S, c, dev):
    """Key positions each query attends to: the selected blocks' tokens, then the tail (the tokens
    after the last complete block, up to the query itself); ([B,S,L] indices, [B,S,L] valid)."""
    i = torch.arange(S, device=dev)
    complete = (i + 1) // c
    tail = complete[:, None] * c + torch.arange(c - 1, device=dev)[None]
    tail_ok = tail <= i[:, None]
    idx, ok = tail[None].expand(B, -1, -1), tail_ok[None].expand(B, -1, -1)
    if sel is not None:
        blocks, valid = sel
        tok = (blocks.unsqueeze(-1) * c + torch.arange(c, device=dev)).flatten(-2)
        tok_ok = valid.unsqueeze(-1).expand(-1, -1, -1, c).flatten(-2)
        idx, ok = torch.cat([tok, idx], -1), torch.cat([tok_ok, ok], -1)
    return torch.where(ok, idx, torch.zeros_like(idx)), ok


def fast_attention_forward(self, hidden_states, position_embeddings, attention_mask=None,
                           past_key_values=None, **kwargs):
    """Qwen4ExpTextAttention.forward for a full causal sequence without cache and padding."""
    assert past_key_values is None
    B, S, _ = hidden_states.shape
    D, dev = self.head_dim, hidden_states.device
    cos, sin = position_embeddings
    ix = self.indexer
    c = ix.compress_ratio
    sel = qsa_select(ix, hidden_states, cos, sin)
    idx, ok = qsa_token_index(sel, B, S, c, dev)
    q, gate = torch.chunk(self.q_proj(hidden_states).view(B, S, -1, 2 * D), 2, dim=-1)
    gate = gate.reshape(B, S, -1)
    q = self.q_norm(q)
    k = self.k_norm(self.k_proj(hidden_states).view(B, S, -1, D))
    v = self.v_proj(hidden_states).view(B, S, -1, D)
    q, k = Q.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=2)
    Hq, Hkv = q.shape[2], k.shape[2]
    G, L = Hq // Hkv, idx.shape[-1]
    flat = (idx + (torch.arange(B, device=dev) * S)[:, None, None]).reshape(-1)
    kg = k.reshape(B * S, Hkv, D).index_select(0, flat).view(B, S, L, Hkv, D)
    vg = v.reshape(B * S, Hkv, D).index_select(0, flat).view(B, S, L, Hkv, D)
    qh = q.reshape(B, S, Hkv, G, D)
    att = torch.einsum("bshgd,bslhd->bshgl", qh, kg).float() * self.scaling
    att = att.masked_fill(~ok[:, :, None, None, :], float("-inf")).softmax(-1).to(v.dtype)
    o = torch.einsum("bshgl,bslhd->bshgd", att, vg).reshape(B, S, Hq * D)
    o = o * torch.sigmoid(gate)
    if self.training and AUX["on"] and sel is not None and S > c * (ix.block_topk + 1):
        indexer_aux(ix, hidden_states, cos, sin, qh, k, sel, self.scaling)
    return self.o_proj(o), None


def indexer_aux(ix, hidden_states, cos, sin, qh, k, sel, scaling):
    B, S = hidden_states.shape[:2]
    c, dI, nI = ix.compress_ratio, ix.index_head_dim, ix.index_n_heads
    dev, nb = hidden_states.device, S // c
    lo = c * (ix.block_topk + 1)
    nq = min(AUX["queries"], S - lo)
    with torch.no_grad():
        qs = torch.randint(lo, S, (nq,), device=dev)
        logits = torch.einsum("bqhgd,bshd->bqhgs", qh[:, qs].float(), k.float()) * scaling
        causal = torch.arange(S, device=dev)[None, :] <= qs[:, None]
        logits.masked_fill_(~causal[None, :, None, None, :], float("-inf"))
        p = logits.softmax(-1).mean((2, 3))  # [B, nq, S]: the dense attention, heads averaged
        okb = torch.arange(nb, device=dev)[None, :] < ((qs + 1) // c)[:, None]  # [nq, nb]
        pb = p[..., : nb * c].reshape(B, nq, nb, c).sum(-1) * okb[None]
        pb = pb / pb.sum(-1, keepdim=True).clamp_min(1e-9)
        blocks, valid = sel
        AUX["cover"].append((pb.gather(-1, blocks[:, qs]) * valid[:, qs]).sum(-1).mean())
    h = hidden_states.detach()
    w = ix.index_qk_proj.weight
    qq = F.linear(h[:, qs], w[: nI * dI]).reshape(B, nq, nI, dI)
    qq = Q.apply_rotary_pos_emb(ix.q_layernorm(qq), cos=cos[:, qs], sin=sin[:, qs], unsqueeze_dim=2)
    kb = index_keys(ix, F.linear(h, w[nI * dI:]), cos, sin)
    s = torch.einsum("bqhd,bkd->bqhk", qq, kb).float().relu().sum(2) / math.sqrt(dI)
    logp = s.masked_fill(~okb[None], -1e9).log_softmax(-1)
    kl = (pb * (torch.log(pb.clamp_min(1e-9)) - logp)).masked_fill(~okb[None], 0).sum(-1).mean()
    AUX["losses"].append(kl)


def trunk_and_stream(model, ids):
    """Trunk logits and the pre-mixer widened stream (the MTP input)."""
    captured = {}
    handle = model.model.hyper_connection_mixer.register_forward_pre_hook(
        lambda mod, args: captured.__setitem__("stream", args[0]))
    logits = model(input_ids=ids, use_cache=False).logits
    handle.remove()
    return logits, captured["stream"]


def mtp_logits(model, mtp, ids, stream, fast=True):
    """Rows t = 1..S-1: head(h_{t-1}, x_t) at position t-1, predicting x_{t+1}."""
    S = ids.shape[1] - 1
    emb = model.model.embed_tokens(ids[:, 1:])
    pos = torch.arange(S, device=ids.device)[None, None].expand(3, ids.shape[0], S)
    pe = model.model.rotary_emb(emb, pos)
    mask = None if fast else causal_float_mask(S, torch.float32, ids.device)
    mixed, _ = mtp(stream[:, :-1], emb, pe, mask)
    return model.lm_head(mixed)


# ---------------------------------------------------------------------------------------------
# Conversations, generated in worker processes (the tokenizer and a text bank in each).

_W = {}


def _worker_init(tok_json, prose, code):
    _W["tok"] = Tokenizer.from_str(tok_json)
    _W["bank"] = AC.TextBank(prose, code)


def _worker_gen(job):
    seed, lo, hi, max_total, min_total, n, cpt, max_tools = job
    rng = random.Random(seed)
    tok, bank, out, tries = _W["tok"], _W["bank"], [], 0
    while len(out) < n and tries < 40 * n:
        tries += 1
        st = rng.randint(lo, hi)
        conv = AC.conversation(rng, bank, AC.Spec(system_chars=int(st * cpt), max_tools=max_tools))
        prompt, completion = AC.training_pair(conv)
        p, c = tok.encode(prompt).ids, tok.encode(completion).ids
        if not (min_total <= len(p) + len(c) <= max_total):
            continue
        prev = conv["messages"][conv["target"] - 1]["role"]
        kind = "call" if completion.count("<tool_call>") else ("answer" if prev == "tool" else "plain")
        out.append((np.asarray(p + c, dtype=np.int32), len(p), kind))
    return out


def generate_pool(pool, jobs):
    out = []
    for part in pool.map(_worker_gen, jobs):
        out += part
    return out


def jobs_for(seed, n, lo, hi, max_total, cpt, min_total=0, per_job=50, max_tools=20):
    return [(seed * 100003 + j, lo, hi, max_total, min_total, min(per_job, n - j * per_job), cpt, max_tools)
            for j in range(math.ceil(n / per_job))]


class Batcher:
    """Training windows: code slices, or chat windows (a conversation at position 0, then more
    short conversations and code up to the window's length). Roles mark what each token is."""

    def __init__(self, code_ids, pools, rng):
        self.code, self.pools, self.rng = code_ids, pools, rng
        self.counts = {CODE: 0, PROMPT: 0, TARGET: 0}

    def code_slice(self, n):
        s = self.rng.randrange(0, len(self.code) - n - 1)
        return self.code[s:s + n]

    def window(self, L, first_pool, p_code):
        need = L + 1
        if self.rng.random() < p_code:
            ids = self.code_slice(need)
            return ids, np.zeros(need, dtype=np.int8)
        parts, roles, size = [], [], 0
        pool = self.pools[first_pool]
        if first_pool == "frames":
            # A frame must fit whole (its reply is at its end).
            pool = [x for x in pool if len(x[0]) < need] or self.pools["long"]
        while size < need:
            if size and self.rng.random() < 0.35:
                chunk = self.code_slice(min(need - size, self.rng.randint(256, 2048)))
                parts.append(np.append(chunk, 0))
                roles.append(np.zeros(len(chunk) + 1, dtype=np.int8))
            else:
                ids, n_prompt, _ = pool[self.rng.randrange(len(pool))]
                r = np.full(len(ids) + 1, PROMPT, dtype=np.int8)
                r[n_prompt:len(ids)] = TARGET
                parts.append(np.append(ids, 0))
                roles.append(r)
                pool = self.pools["short"]
            size += len(parts[-1])
        return np.concatenate(parts)[:need], np.concatenate(roles)[:need]

    def batch(self, L, B, first_pool, p_code, dev, frame_share=0.0):
        ws = [self.window(L, "frames" if self.rng.random() < frame_share else first_pool, p_code)
              for _ in range(B)]
        ids = torch.from_numpy(np.stack([w[0] for w in ws]).astype(np.int64))
        roles = torch.from_numpy(np.stack([w[1] for w in ws]))
        for k in self.counts:
            self.counts[k] += int((roles[:, 1:] == k).sum())
        return ids.to(dev, non_blocking=True), roles.to(dev, non_blocking=True)


def weighted_loss(logits, targets, roles, V):
    """Sum over roles of weight x mean cross-entropy of that role's tokens; per-role means too."""
    ce = F.cross_entropy(logits.float().reshape(-1, V), targets.reshape(-1), reduction="none")
    r = roles.reshape(-1)
    total, parts = 0.0, {}
    for role, w in ROLE_WEIGHT.items():
        m = (r == role).float()
        n = m.sum()
        term = (ce * m).sum() / n.clamp_min(1)
        parts[role] = term.detach()
        total = total + w * term * (n > 0)
    return total, parts


# ---------------------------------------------------------------------------------------------

def parse_phases(text):
    out = []
    for part in text.split(","):
        shape, frac = part.split(":")
        L, B = shape.split("x")
        out.append((int(L), int(B), float(frac)))
    return out


PHASE_POOL = {2048: "short", 8192: "mid", 32768: "long"}
PHASE_CODE = {2048: 0.4, 8192: 0.3, 32768: 0.25}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--phases", default="2048x32:0.45,8192x8:0.25,32768x2:0.3")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--rope-theta", type=float, default=1e6)
    ap.add_argument("--max-positions", type=int, default=65536)
    ap.add_argument("--aux-weight", type=float, default=1.0)
    ap.add_argument("--workers", type=int, default=max(1, min(14, (os.cpu_count() or 2) - 2)))
    # Fine-tuning: start from a trained model folder (its tokenizer and weights) instead of
    # from scratch.
    ap.add_argument("--init", default=None)
    # The real agents' prompt frames (tools/agent_frames.py capture) and the share of long windows
    # that start with one.
    ap.add_argument("--frames", default=None)
    ap.add_argument("--frame-share", type=float, default=0.7)
    ap.add_argument("--code-scale", type=float, default=1.0, help="multiplies the code share of every phase")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(0)
    random.seed(0)
    dev = "cuda"
    t0 = time.time()
    smoke = args.smoke
    phases = parse_phases(args.phases)

    root, train_texts, held_texts = corpus()
    log(f"corpus: {len(train_texts)} train files, {len(held_texts)} held-out, from {root}")
    if smoke:
        train_texts = train_texts[:300]
    rng = random.Random(0)
    train_bank = AC.TextBank.from_interpreter(held_out=False, max_code_files=0)
    held_bank = AC.TextBank.from_interpreter(held_out=True, max_code_files=0)
    train_bank.add_code(rng.sample(train_texts, min(800, len(train_texts))))
    held_bank.add_code(held_texts)
    log(f"prose: {len(train_bank.prose)} train passages, {len(held_bank.prose)} held-out")

    # The tokenizer: code plus rendered conversations (English, JSON, the chat format).
    tok_sample, size = [], 0
    for t in rng.sample(train_texts, len(train_texts)):
        if size > ((2 << 20) if smoke else (20 << 20)):
            break
        tok_sample.append(t)
        size += len(t)
    chat_sample, csize = [], 0
    crng = random.Random(1)
    while csize < ((1 << 20) if (smoke or args.init) else (10 << 20)):
        conv = AC.conversation(crng, train_bank, AC.Spec(system_chars=crng.randint(0, 6000)))
        p, c = AC.training_pair(conv)
        chat_sample.append(p + c)
        csize += len(p) + len(c)
    if args.init:
        tok = Tokenizer.from_file(os.path.join(args.init, "tokenizer.json"))
    else:
        tok = train_tokenizer(tok_sample + chat_sample, args.vocab)
    V = tok.get_vocab_size()
    eos, im_end = tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|im_end|>")
    assert eos == 0, eos
    enc = tok.encode_batch(chat_sample[:200])
    cpt = sum(len(s) for s in chat_sample[:200]) / sum(len(e.ids) for e in enc)
    log(f"tokenizer: vocab {V}, {cpt:.2f} chars per token on conversations, {time.time() - t0:.0f}s")

    def encode_all(texts):
        ids = []
        for e in tok.encode_batch(texts):
            ids.extend(e.ids)
            ids.append(eos)
        return np.asarray(ids, dtype=np.int32)

    train_ids, held_ids = encode_all(train_texts), encode_all(held_texts)
    log(f"code: {len(train_ids)} train tokens, {len(held_ids)} held-out tokens")

    # Conversation pools (system prompt sizes in tokens) and the held-out sets, in parallel.
    scale = 0.02 if smoke else 1.0
    tok_json = tok.to_str()
    ctx = mp.get_context("fork")
    with ctx.Pool(args.workers, _worker_init, (tok_json, train_bank.prose, train_bank.code)) as pool:
        pools = {
            "short": generate_pool(pool, jobs_for(1, int(8000 * scale) + 20, 0, 1500, 2048, cpt)),
            "mid": generate_pool(pool, jobs_for(2, int(1500 * scale) + 10, 1500, 7200, 8192, cpt, per_job=20)),
            "long": generate_pool(pool, jobs_for(3, int(400 * scale) + 4, 7000, 30500, 32768, cpt, per_job=5)),
        }
    eval_lengths = [512, 4096, 16384, 32768, 65536]
    eval_counts = {512: 48, 4096: 32, 16384: 16, 32768: 12, 65536: 4}
    with ctx.Pool(args.workers, _worker_init, (tok_json, held_bank.prose, held_bank.code)) as pool:
        held_chats = {}
        for i, L in enumerate(eval_lengths):
            n = 2 if smoke else eval_counts[L]
            lo, hi = (0, 120) if L == 512 else (int(0.55 * L), int(0.92 * L))
            held_chats[L] = generate_pool(pool, jobs_for(
                100 + i, n, lo, hi, L, cpt, min_total=L // 2 if L > 512 else 0,
                per_job=1 if L >= 16384 else 8, max_tools=2 if L == 512 else 20))
        held_short = generate_pool(pool, jobs_for(99, 8 if smoke else 48, 0, 1500, 2048, cpt))
    for k, v in list(pools.items()) + [(f"held {L}", held_chats[L]) for L in eval_lengths]:
        lens = [len(x[0]) for x in v]
        kinds = {kk: sum(1 for x in v if x[2] == kk) for kk in ("call", "answer", "plain")}
        log(f"pool {k}: {len(v)} conversations, tokens {min(lens) if lens else 0}..{max(lens) if lens else 0} "
            f"(mean {np.mean(lens) if lens else 0:.0f}), {kinds}")
    held_frames = []
    if args.frames:
        frames = json.load(open(args.frames))["frames"]
        frng, hrng = random.Random(7), random.Random(8)
        samples, held = [], []
        for f in frames:
            for stage in ("call", "answer"):
                samples += [AF.sample(f, frng, stage) + (f["agent"],) for _ in range(2 if smoke else 60)]
                held += [AF.sample(f, hrng, stage) + (f["agent"],) for _ in range(2 if smoke else 4)]

        def encode_frames(items):
            out = []
            ps = tok.encode_batch([x[0] for x in items])
            cs = tok.encode_batch([x[1] for x in items])
            for (_, _, stage, agent), p, c in zip(items, ps, cs):
                ids = np.asarray(p.ids + c.ids, dtype=np.int32)
                out.append((ids, len(p.ids), stage, agent))
            return out

        pools["frames"] = [(i, n, k) for i, n, k, _ in encode_frames(samples)]
        held_frames = [(i, n, f"{a}:{k}") for i, n, k, a in encode_frames(held)]
        log(f"agent frames: {len(frames)} frames, {len(pools['frames'])} samples, tokens "
            f"{min(len(x[0]) for x in pools['frames'])}..{max(len(x[0]) for x in pools['frames'])}")
    log(f"data ready at {time.time() - t0:.0f}s")

    cfgd = model_config(V, args.max_positions, args.rope_theta)
    cfg = Qwen4ExpTextConfig(**cfgd)
    cfg._attn_implementation = "eager"
    model = Q.Qwen4ExpForCausalLM(cfg).to(dev)
    mtp = MtpHead(cfg).to(dev)
    if args.init:
        from safetensors.torch import load_file
        init_state = {}
        for f in sorted(glob.glob(os.path.join(args.init, "*.safetensors"))):
            init_state.update(load_file(f))
        init_state = {k: v.float() if v.is_floating_point() else v for k, v in init_state.items()}
        model.load_state_dict({k: v for k, v in init_state.items() if not k.startswith("mtp.")}, strict=True)
        mtp.load_state_dict({k[4:]: v for k, v in init_state.items() if k.startswith("mtp.")}, strict=True)
        log(f"initialised from {args.init} ({len(init_state)} tensors)")
    n_trunk = sum(p.numel() for p in model.parameters())
    n_mtp = sum(p.numel() for p in mtp.parameters())
    log(f"parameters: trunk {n_trunk/1e6:.2f}M, mtp {n_mtp/1e6:.2f}M")

    # The fast QSA must compute what the reference computes (float32, sparse selection active).
    original_attention = Q.Qwen4ExpTextAttention.forward
    torch.backends.cuda.matmul.allow_tf32 = False
    with torch.no_grad():
        for S in (160, 400):
            probe = torch.from_numpy(train_ids[: 2 * S].astype(np.int64)).view(2, S).to(dev)
            Q.Qwen4ExpTextAttention.forward = original_attention
            ref = model(input_ids=probe, use_cache=False).logits
            Q.Qwen4ExpTextAttention.forward = fast_attention_forward
            fast = model(input_ids=probe, use_cache=False).logits
            d = (ref - fast).abs().amax(-1)
            log(f"fast QSA vs reference at {S} tokens: max |dlogits| = {d.max().item():.3g}, "
                f"{(d < 1e-3).float().mean().item() * 100:.2f}% of rows within 1e-3")
            assert (d < 1e-3).float().mean().item() > 0.99, d.max().item()
    torch.backends.cuda.matmul.allow_tf32 = True

    params = list(model.parameters()) + list(mtp.parameters())
    named = list(model.named_parameters()) + [("mtp." + n, p) for n, p in mtp.named_parameters()]
    idx_params = [p for n, p in named if ".indexer." in n]
    main_params = [p for n, p in named if ".indexer." not in n]
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    budget_s = (8 * len(phases) if smoke else args.minutes * 60)
    warmup = 10 if smoke else (20 if args.init else 50)
    batcher = Batcher(train_ids, pools, random.Random(2))

    def eval_chats(convs, max_batch_tokens=65536):
        """Mean cross-entropy of the reply tokens and greedy exact match (every reply token is the
        argmax under teacher forcing, so greedy decoding writes the reply), by kind."""
        res = {}
        for ids, n_prompt, kind in convs:
            x = torch.from_numpy(ids.astype(np.int64))[None].to(dev)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model(input_ids=x[:, :-1], use_cache=False).logits[0, n_prompt - 1:].float()
            tgt = x[0, n_prompt:]
            ce = F.cross_entropy(logits, tgt).item()
            exact = bool((logits.argmax(-1) == tgt).all().item())
            r = res.setdefault(kind, {"n": 0, "ce": 0.0, "exact": 0})
            r["n"] += 1
            r["ce"] += ce
            r["exact"] += exact
        out = {k: {"n": v["n"], "reply_ce": round(v["ce"] / v["n"], 4), "exact": v["exact"]} for k, v in res.items()}
        n = sum(v["n"] for v in res.values())
        if n:
            out["all"] = {"n": n, "reply_ce": round(sum(v["ce"] for v in res.values()) / n, 4),
                          "exact": sum(v["exact"] for v in res.values())}
        return out

    def eval_code(L, n):
        per = max(1, 32768 // L)
        total, mt, count = 0.0, 0.0, 0
        n = min(n, len(held_ids) // (L + 1))
        for i in range(0, n, per):
            rows = [held_ids[j * (L + 1):(j + 1) * (L + 1)] for j in range(i, min(n, i + per))]
            w = torch.from_numpy(np.stack(rows).astype(np.int64)).to(dev)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits, stream = trunk_and_stream(model, w[:, :-1])
                total += F.cross_entropy(logits.float().reshape(-1, V), w[:, 1:].reshape(-1)).item() * len(rows)
                ml = mtp_logits(model, mtp, w[:, :-1], stream)
                mt += F.cross_entropy(ml.float().reshape(-1, V), w[:, 2:].reshape(-1)).item() * len(rows)
            count += len(rows)
        return {"n": count, "code_ce": round(total / count, 4), "code_mtp_ce": round(mt / count, 4)}

    def quick_eval():
        model.eval()
        mtp.eval()
        with torch.no_grad():
            code = eval_code(512, 16)
            chats = eval_chats(held_short)
        model.train()
        mtp.train()
        return code, chats

    history, phase_log = [], []
    step, start = 0, time.time()
    AUX["on"] = args.aux_weight > 0
    model.train()
    mtp.train()
    last_eval = -1e9
    phase_idx, phase_start = 0, time.time()
    bounds = np.cumsum([f for _, _, f in phases]) / sum(f for _, _, f in phases)
    while True:
        elapsed = time.time() - start
        if elapsed > budget_s:
            break
        frac = elapsed / budget_s
        while phase_idx < len(phases) - 1 and frac > bounds[phase_idx]:
            phase_log.append({"seq": phases[phase_idx][0], "batch": phases[phase_idx][1], "end_step": step,
                              "seconds": round(time.time() - phase_start, 1)})
            phase_idx += 1
            phase_start = time.time()
            log(f"phase {phase_idx}: windows of {phases[phase_idx][0]} x {phases[phase_idx][1]}")
        L, B, _ = phases[phase_idx]
        lr = args.lr * min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))
        for g in opt.param_groups:
            g["lr"] = lr
        first_pool = PHASE_POOL.get(L, "long" if L >= 16384 else "short")
        w, roles = batcher.batch(L, B, first_pool, args.code_scale * PHASE_CODE.get(L, 0.25), dev,
                                 frame_share=args.frame_share if ("frames" in pools and L >= 16384) else 0.0)
        AUX["losses"].clear()
        AUX["cover"].clear()
        try:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits, stream = trunk_and_stream(model, w[:, :-1])
                loss_trunk, parts = weighted_loss(logits, w[:, 1:], roles[:, 1:], V)
                del logits
                ml = mtp_logits(model, mtp, w[:, :-1], stream)
                loss_mtp, mparts = weighted_loss(ml, w[:, 2:], roles[:, 2:], V)
                del ml
                loss = loss_trunk + 0.5 * loss_mtp
                aux = torch.stack(AUX["losses"]).mean() if AUX["losses"] else None
                if aux is not None:
                    loss = loss + args.aux_weight * aux
            opt.zero_grad(set_to_none=True)
            loss.backward()
        except torch.OutOfMemoryError:
            # Keep the run: halve this phase's batch (the step is lost, nothing else).
            opt.zero_grad(set_to_none=True)
            loss = logits = ml = stream = None
            torch.cuda.empty_cache()
            phases[phase_idx] = (L, max(1, B // 2), phases[phase_idx][2])
            log(f"out of memory at {L} x {B}: batch {phases[phase_idx][1]} from now on")
            if B == 1:
                break
            continue
        torch.nn.utils.clip_grad_norm_(main_params, 1.0)
        torch.nn.utils.clip_grad_norm_(idx_params, 1.0)
        opt.step()
        if step % 25 == 0 or smoke:
            torch.cuda.synchronize()
            rec = {"step": step, "seconds": round(time.time() - start, 1), "lr": lr, "seq": L, "batch": B,
                   "train_loss": loss_trunk.item(), "train_mtp_loss": loss_mtp.item(),
                   "train_code_ce": parts[CODE].item(), "train_reply_ce": parts[TARGET].item(),
                   "train_prompt_ce": parts[PROMPT].item(),
                   "gpu_mem_gb": round(torch.cuda.max_memory_allocated() / 2**30, 1)}
            if aux is not None:
                rec["indexer_kl"] = aux.item()
                rec["indexer_cover"] = torch.stack(AUX["cover"]).mean().item()
            if time.time() - last_eval > (0 if smoke else 45):
                code, chats = quick_eval()
                rec["heldout_loss"], rec["heldout_mtp_loss"] = code["code_ce"], code["code_mtp_ce"]
                rec["heldout_reply_ce"] = chats.get("all", {}).get("reply_ce")
                rec["heldout_exact"] = chats.get("all", {}).get("exact")
                last_eval = time.time()
            history.append(rec)
            log(json.dumps(rec))
        step += 1
    phase_log.append({"seq": phases[phase_idx][0], "batch": phases[phase_idx][1], "end_step": step,
                      "seconds": round(time.time() - phase_start, 1)})
    AUX["on"] = False
    train_seconds = time.time() - start
    final_code, final_chats = quick_eval()
    # The real agents' frames, held-out commands: whether greedy decoding writes the call with
    # the given arguments, and the answer quoting the result (what tests/agents checks).
    frame_eval = {}
    if held_frames:
        model.eval()
        try:
            with torch.no_grad():
                frame_eval = eval_chats(held_frames)
        except Exception as e:  # an evaluation must not lose the model
            frame_eval = {"error": repr(e)}
        model.train()
        log(f"held-out agent frames: {json.dumps(frame_eval)}")
    log(f"done: {step} steps in {train_seconds:.0f}s; phases {phase_log}; tokens by role {batcher.counts}; "
        f"held-out code {final_code}, held-out short chats {final_chats}")

    # Save bf16 weights (int64 buffers kept), sharded under the 16 MiB limit of the way back.
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
    Q.Qwen4ExpTextAttention.forward = original_attention
    torch.backends.cuda.matmul.allow_tf32 = False
    ref_model = Q.Qwen4ExpForCausalLM(cfg).to(dev).float()
    ref_mtp = MtpHead(cfg).to(dev).float()
    ref_model.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in state.items()
                               if not k.startswith("mtp.")}, strict=True)
    ref_mtp.load_state_dict({k[4:]: v.float() for k, v in state.items() if k.startswith("mtp.")}, strict=True)
    ref_model.eval()
    ref_mtp.eval()
    parity_len = 96
    p_ids = torch.from_numpy(held_ids[1000:1000 + parity_len].astype(np.int64)).view(1, -1).to(dev)
    with torch.no_grad():
        p_logits, p_stream = trunk_and_stream(ref_model, p_ids)
        p_mtp = mtp_logits(ref_model, ref_mtp, p_ids, p_stream, fast=False)
    del ref_model, ref_mtp
    torch.backends.cuda.matmul.allow_tf32 = True
    Q.Qwen4ExpTextAttention.forward = fast_attention_forward

    def write_extras(by_length, ctx_len):
        cfg_json = dict(cfgd)
        cfg_json.update({"model_type": "qwen4_exp_text", "architectures": ["Qwen4ExpForCausalLM"],
                         "mtp_num_hidden_layers": 1, "torch_dtype": "bfloat16", "transformers_version": "5.17.0",
                         "bos_token_id": None, "pad_token_id": None,
                         "eos_token_id": 0})
        total_counts = sum(batcher.counts.values())
        files = {
            "config.json": json.dumps(cfg_json, indent=2),
            "model.safetensors.index.json": json.dumps(index, indent=2),
            "tokenizer.json": tok.to_str(),
            "tokenizer_config.json": json.dumps({
                "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None, "eos_token": "<|im_end|>",
                "pad_token": "<|endoftext|>", "unk_token": None, "model_max_length": ctx_len,
                "add_bos_token": False, "chat_template": AC.CHAT_TEMPLATE}, indent=2),
            "generation_config.json": json.dumps({"eos_token_id": [im_end, eos], "pad_token_id": eos}, indent=2),
            "train_log.json": json.dumps({
                "steps": step, "phases": phase_log, "train_seconds": round(train_seconds, 1),
                "tokens_by_role": {"code": batcher.counts[CODE], "chat_prompt": batcher.counts[PROMPT],
                                   "assistant_reply": batcher.counts[TARGET], "total": total_counts},
                "role_weights": {"code": ROLE_WEIGHT[CODE], "chat_prompt": ROLE_WEIGHT[PROMPT],
                                 "assistant_reply": ROLE_WEIGHT[TARGET]},
                "phase_code_fraction": {str(k): v for k, v in PHASE_CODE.items()},
                "pools": {k: {"conversations": len(v), "tokens": int(sum(len(x[0]) for x in v)),
                              "kinds": {kk: sum(1 for x in v if x[2] == kk) for kk in ("call", "answer", "plain")}}
                          for k, v in pools.items()},
                "chars_per_token_chat": round(cpt, 3),
                "train_code_tokens": int(len(train_ids)), "heldout_code_tokens": int(len(held_ids)),
                "train_files": len(train_texts), "heldout_files": len(held_texts), "corpus_root": root,
                "params_trunk": n_trunk, "params_mtp": n_mtp, "lr": args.lr, "rope_theta": args.rope_theta,
                "aux_weight": args.aux_weight,
                "final_heldout_loss": final_code["code_ce"], "final_heldout_mtp_loss": final_code["code_mtp_ce"],
                "final_heldout_short_chats": final_chats, "heldout_by_length": by_length,
                "init": args.init, "heldout_agent_frames": frame_eval,
                "model_max_length": ctx_len, "history": history,
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
            fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4))
            st = [h["step"] for h in history]
            ax.plot(st, [h["train_code_ce"] for h in history], label="train code (next token)", lw=0.8)
            ax.plot(st, [h["train_reply_ce"] for h in history], label="train assistant replies", lw=0.8)
            ax.plot(st, [h["train_prompt_ce"] for h in history], label="train chat prompts", lw=0.8)
            ev = [h for h in history if "heldout_loss" in h]
            ax.plot([h["step"] for h in ev], [h["heldout_loss"] for h in ev], "o-", label="held-out code (512)")
            ax.plot([h["step"] for h in ev], [h["heldout_mtp_loss"] for h in ev], "s-", label="held-out code MTP")
            ax.plot([h["step"] for h in ev], [h["heldout_reply_ce"] or 0 for h in ev], "^-", label="held-out replies (<= 2k)")
            for p in phase_log[:-1]:
                ax.axvline(p["end_step"], color="grey", lw=0.5, ls="--")
            ax.set_xlabel("step (dashed: window length changes)")
            ax.set_ylabel("cross-entropy (nats)")
            ax.set_ylim(0, 8)
            ax.legend(fontsize=7)
            ax.grid(alpha=0.3)
            Ls = [L for L in eval_lengths if "code" in by_length.get(str(L), {})]
            ax2.plot(Ls, [by_length[str(L)]["code"]["code_ce"] for L in Ls], "o-", label="held-out code")
            ax2.plot(Ls, [by_length[str(L)]["agent"].get("all", {}).get("reply_ce", float("nan")) for L in Ls], "s-",
                     label="held-out agent replies")
            ax2.set_xscale("log", base=2)
            ax2.set_xlabel("window / prompt length (tokens)")
            ax2.set_ylabel("cross-entropy (nats)")
            ax2.legend(fontsize=7)
            ax2.grid(alpha=0.3)
            buf = io.BytesIO()
            fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
            blobs["loss.png"] = buf.getvalue()
        except Exception as e:
            log(f"no loss.png: {e!r}")
        path = os.path.join(args.out, "extras.tgz")
        with tarfile.open(path + ".part", "w:gz") as tar:
            for name, text in list(files.items()) + list(blobs.items()):
                data = text.encode() if isinstance(text, str) else text
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        os.replace(path + ".part", path)

    write_extras({}, 32768)
    log(f"wrote {len(shards)} shards and extras.tgz (before the length evaluations) at {time.time() - t0:.0f}s")

    # Held-out losses by window length (code, and agent conversations whose reply ends the window).
    model.eval()
    mtp.eval()
    by_length = {}
    for L in eval_lengths:
        try:
            with torch.no_grad():
                code = eval_code(L, 2 if smoke else {512: 64, 4096: 16, 16384: 8, 32768: 4, 65536: 2}[L])
                chats = eval_chats(held_chats[L])
            lens = [len(x[0]) for x in held_chats[L]]
            by_length[str(L)] = {"code": code, "agent": chats, "agent_tokens": [min(lens), max(lens)] if lens else None}
            log(f"held-out at {L}: {json.dumps(by_length[str(L)])}")
        except Exception as e:  # a failed long evaluation must not lose the model
            log(f"held-out at {L} failed: {e!r}")
            by_length[str(L)] = {"error": repr(e)}
        torch.cuda.empty_cache()
    ctx_len = 32768
    try:
        if by_length["65536"]["code"]["code_ce"] <= by_length["32768"]["code"]["code_ce"] + 0.05 and \
                by_length["65536"]["agent"]["all"]["reply_ce"] <= by_length["32768"]["agent"]["all"]["reply_ce"] + 0.1:
            ctx_len = 65536
    except (KeyError, TypeError):
        pass
    log(f"model_max_length {ctx_len}")

    write_extras(by_length, ctx_len)
    log(f"wrote {len(shards)} shards and extras.tgz to {args.out} in {time.time() - t0:.0f}s")


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


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Makes a tiny servable model folder of a family from its hf-tiny fixture (standard library only).

The hf-tiny fixtures (deepseek_v4, glm5_next) have the families' architecture but a 256-token
vocabulary and no tokenizer, so `run`, `generate` and `serve` cannot use them. This writes a folder
that they can: the fixture's trunk weights (HF's random initialisation), a byte-level BPE
tokenizer.json with the family's special tokens, a vocabulary the model covers (embedding,
output head and DeepSeek's hash-routing table resized to it, the new rows random), a random MTP
block (tools/make_ds4_mtp.py, tools/glm5_mtp_weights.py), tokenizer_config.json,
generation_config.json and a README.

The weights are random: the output is gibberish. The folder exists for protocol tests. So that the
gibberish is valid text, the output head's rows of the added tokens (the special tokens, <think>,
the tool-call tags) and of the byte tokens that are not printable ASCII are zero: such a token's
logit is 0 while the others spread around it, so greedy decoding writes printable ASCII and never
ends a turn or opens a tag by itself (an end of turn comes from max_tokens, a stop sequence or the
server). The merges are learnt from a small built-in text, so that common English words and code
are a token or a few.

  tools/make_tiny_servable.py --family deepseek_v4 --fixtures DIR --out models/deepseek-v4-tiny
  tools/make_tiny_servable.py --family glm5_next --fixtures DIR --out models/glm5-tiny
"""
import argparse
import array
import collections
import json
import math
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile

from safetensors_io import read_safetensors, write_safetensors

HERE = os.path.dirname(os.path.abspath(__file__))

# The families' added tokens, in id order from 0; (content, special). Special tokens are dropped
# when output is decoded for display; the tags a parser reads (<think>, the tool-call tags) are not
# special, so they reach the chat output parser.
ADDED = {
    "deepseek_v4": [
        ("<｜begin▁of▁sentence｜>", True),
        ("<｜end▁of▁sentence｜>", True),
        ("<｜▁pad▁｜>", True),
        ("<｜User｜>", True),
        ("<｜Assistant｜>", True),
        ("<think>", False),
        ("</think>", False),
        ("｜DSML｜", False),
        ("<tool_result>", False),
        ("</tool_result>", False),
    ],
    "glm5_next": [
        ("<|endoftext|>", True),
        ("[gMASK]", True),
        ("<sop>", True),
        ("<|system|>", True),
        ("<|user|>", True),
        ("<|assistant|>", True),
        ("<|observation|>", True),
        ("<think>", False),
        ("</think>", False),
        ("<tool_call>", False),
        ("</tool_call>", False),
        ("<arg_key>", False),
        ("</arg_key>", False),
        ("<arg_value>", False),
        ("</arg_value>", False),
        ("<tool_response>", False),
        ("</tool_response>", False),
    ],
}

# Text the merges are learnt from: plain English and a little Python, as a chat might carry.
CORPUS = """
The weather in Paris is mild today, with a light wind from the west and some rain in the evening.
You are a helpful assistant. Answer the question of the user in a few words, and call a tool when
the answer needs data that you do not have. The function returns the current weather in a given
location: the temperature in degrees and the sky. What is the weather like in Paris today? It is
cold and wet. Thank you, that is what I wanted to know. Hello, how are you? I am fine, thanks.
Please write a function that adds two numbers, then test it on a few cases and print the result.
def add(a, b):
    return a + b

def fib(n):
    if n < 2:
        return n
    return fib(n - 1) + fib(n - 2)

class Stack:
    def __init__(self):
        self.items = []

    def push(self, item):
        self.items.append(item)

    def pop(self):
        return self.items.pop()

import os
import sys

for line in open(path):
    print(line.strip())
{"location": "Paris, France", "unit": "celsius", "days": 2, "ok": true, "items": [1, 2, 3]}
"""


def bytes_to_unicode():
    """GPT-2's byte-level alphabet: each byte as a printable character (the tokenizer's
    ByteLevel pre-tokenizer and decoder use the same table)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def learn_merges(text, count, alphabet):
    """Plain BPE over space-led words (the runtime pre-tokenizer splits a little differently; a
    merge learnt here is still a valid merge there)."""
    words = collections.Counter()
    word = ""
    for ch in text:
        if ch.isalnum() or ch == "_":
            word += ch
            continue
        if word:
            words[word] += 1
        word = ch if ch == " " else ""
        if ch not in " ":
            words[ch] += 1
    if word:
        words[word] += 1
    seqs = {w: [alphabet[b] for b in w.encode()] for w in words}
    merges = []
    for _ in range(count):
        pairs = collections.Counter()
        for w, n in words.items():
            s = seqs[w]
            for a, b in zip(s, s[1:]):
                pairs[(a, b)] += n
        if not pairs:
            break
        (a, b), n = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        if n < 2:
            break
        merges.append((a, b))
        for w in words:
            s, out, i = seqs[w], [], 0
            while i < len(s):
                if i + 1 < len(s) and s[i] == a and s[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(s[i])
                    i += 1
            seqs[w] = out
    return merges


def tokenizer_json(added, alphabet, merges):
    vocab = {}
    for i, (content, _) in enumerate(added):
        vocab[content] = i
    for b in range(256):
        vocab.setdefault(alphabet[b], len(vocab))
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    split = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
             r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [{"id": i, "content": c, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": s}
                         for i, (c, s) in enumerate(added)],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": split}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
             "use_regex": False}]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": [[a, b] for a, b in merges]},
    }, vocab


def floats(blob):
    return array.array("f", blob)


def resize(rng, old, rows, cols, std):
    """The old [r, cols] rows, then random rows up to `rows` (normal, the old rows' std)."""
    out = floats(old)
    out.extend(rng.gauss(0.0, std) for _ in range((rows - len(out) // cols) * cols))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", required=True, choices=sorted(ADDED))
    ap.add_argument("--fixtures", required=True, help="the hf-tiny folder (FIXTURES/hf-tiny)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--merges", type=int, default=240)
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args()
    src = os.path.join(a.fixtures, a.family)
    rng = random.Random(a.seed)
    added = ADDED[a.family]
    alphabet = bytes_to_unicode()
    tok, vocab = tokenizer_json(added, alphabet, learn_merges(CORPUS, a.merges, alphabet))
    used = len(vocab)
    V = (used + 63) // 64 * 64  # the model's vocabulary: the tokenizer's, padded to 64 rows
    ids = {c: i for c, i in vocab.items()}

    with open(os.path.join(src, "config.json")) as f:
        config = json.load(f)
    old_v = config["vocab_size"]
    metadata, tensors = read_safetensors(os.path.join(src, "model.safetensors"))
    decoder = {v: k for k, v in alphabet.items()}

    def printable(token):
        if token in dict(added):
            return False
        raw = bytes(decoder[c] for c in token)
        return all(32 <= b < 127 or b == 10 for b in raw)

    live = [False] * V
    for content, i in ids.items():
        live[i] = printable(content)
    for name in list(tensors):
        dtype, shape, blob = tensors[name]
        if name.endswith("embed_tokens.weight") or name == "lm_head.weight":
            assert shape[0] == old_v, name
            old = floats(blob)
            std = math.sqrt(sum(x * x for x in old) / len(old))
            w = resize(rng, blob, V, shape[1], std)
            if name == "lm_head.weight":
                for r in range(V):
                    if not live[r]:
                        w[r * shape[1]:(r + 1) * shape[1]] = array.array("f", [0.0] * shape[1])
            tensors[name] = ("F32", [V, shape[1]], w.tobytes())
        elif name.endswith("tid2eid"):
            # DeepSeek's hash routing: each token's fixed experts (distinct, from the routed set).
            assert shape[0] == old_v and dtype == "I64", name
            k, n = shape[1], config["n_routed_experts"]
            table = array.array("q", struct.unpack("<%dq" % (len(blob) // 8), blob))
            for _ in range(V - old_v):
                table.extend(rng.sample(range(n), k))
            tensors[name] = ("I64", [V, k], table.tobytes())

    def tid(content):
        return ids[content]

    config["vocab_size"] = V
    if a.family == "deepseek_v4":
        config["bos_token_id"] = tid("<｜begin▁of▁sentence｜>")
        config["eos_token_id"] = tid("<｜end▁of▁sentence｜>")
        tok_config = {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>",
                      "pad_token": "<｜▁pad▁｜>", "add_bos_token": False}
        gen = {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}
        mtp = "make_ds4_mtp.py"
    else:
        config["pad_token_id"] = tid("<|endoftext|>")
        eos = [tid("<|endoftext|>"), tid("<|user|>"), tid("<|observation|>")]
        config["eos_token_id"] = eos
        tok_config = {"bos_token": None, "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
                      "add_bos_token": False}
        gen = {"eos_token_id": eos, "pad_token_id": config["pad_token_id"]}
        mtp = "glm5_mtp_weights.py"
    tok_config.update({"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length":
                       config.get("max_position_embeddings", 4096)})

    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(config, f, indent=2)
        write_safetensors(os.path.join(tmp, "model.safetensors"), tensors, metadata)
        if os.path.isdir(a.out):
            shutil.rmtree(a.out)
        subprocess.run([sys.executable, os.path.join(HERE, mtp), "--model", tmp, "--out", a.out],
                       check=True)
    with open(os.path.join(a.out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False)
    with open(os.path.join(a.out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(tok_config, f, indent=2, ensure_ascii=False)
    with open(os.path.join(a.out, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2)
    with open(os.path.join(a.out, "README.md"), "w", encoding="utf-8") as f:
        f.write(readme(a, used, V, len(tok["model"]["merges"])))
    print(f"{a.out}: vocabulary {used} tokens (model {V} rows), {len(tok['model']['merges'])} merges")


def readme(a, used, V, merges):
    name = {"deepseek_v4": "DeepSeek V4 Flash (`deepseek_v4`)",
            "glm5_next": "GLM 5.3 Flash (`glm5_next`)"}[a.family]
    fmt = {"deepseek_v4": "the DeepSeek V4 encoding (src/tokenizer/chat/deepseek_v4.cpp: "
                          "`<｜User｜>...<｜Assistant｜>` with `<think>` or `</think>`, DSML tool "
                          "calls)",
           "glm5_next": "the GLM 5.3 template (src/tokenizer/chat/glm.cpp: `[gMASK]<sop>`, "
                        "`<|user|>...<|assistant|><think>`, `<tool_call>` with "
                        "`<arg_key>`/`<arg_value>`)"}[a.family]
    return f"""# A tiny servable {name} model: random weights, for protocol tests

**The weights are random; the output is gibberish.** This folder exists so that `flashserve run`,
`generate` and `serve` can be tested on this family end to end (chat format, thinking on and off,
tool-call requests, streaming, usage, stops, logprobs, sessions): tests/api runs the API suites
against it (`api.node_clients.{a.family}`), tests/unit/test_cli_run.cpp runs the CLI on it.

Made by `tools/make_tiny_servable.py --family {a.family} --fixtures FIXTURES/hf-tiny --out
{a.out}` (standard library only; seed {a.seed}):

- the architecture and trunk weights of the hf-tiny fixture `{a.family}` (HF's random
  initialisation, the layer kinds of config.json);
- a byte-level BPE tokenizer (tokenizer.json): the family's special and tag tokens, the 256
  byte tokens and {merges} merges learnt from a few lines of English and Python; {used} tokens,
  the model's vocabulary padded to {V} rows (the embedding, the output head and, for DeepSeek,
  the hash-routing table resized, the new rows random);
- a random MTP block ({'tools/make_ds4_mtp.py' if a.family == 'deepseek_v4' else 'tools/glm5_mtp_weights.py'}), so MTP decoding runs;
- the output head's rows of the added tokens and of the bytes that are not printable ASCII are
  zero, so that greedy output is printable ASCII and never ends a turn or writes a tag by itself.

The chat format is {fmt}, built into flashserve and picked from config.json's model_type; the
folder ships no Jinja chat template. A trained model's checks (answers that make sense, a tool
call the model writes itself) cannot run on it; tests/api/run.mjs says which it skips and why.
"""


if __name__ == "__main__":
    main()

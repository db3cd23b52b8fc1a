#!/usr/bin/env python3
# A host model of the vocabulary top-k's narrowing (src/backend/cuda/cuda_vocab_topk.cu), checked
# against a stable sort of the whole row: slices of 256 offer their 8 largest keys, t is the k-th
# largest offer (bisection on the key bits, as threshold_kernel), the candidates are the entries
# at or above t in index order (the whole row past 32,768), and the select ranks them by key
# descending, ties to the lower position. Prints each row form's candidate count and whether the
# picks equal the sort's. Pure Python (no packages): `python3 tools/bench/vocab_topk_model.py`.
import math
import random
import struct


def rank_key(v):
    b = struct.unpack('<I', struct.pack('<f', v))[0]
    if b == 0x80000000: b = 0
    return (~b) & 0xffffffff if b & 0x80000000 else b | 0x80000000
SL, OFF, CAND = 256, 8, 32768
def vocab_topk(x, k):
    n = len(x); slices = (n + SL - 1)//SL
    keys = [rank_key(v) for v in x]
    offers = []
    for s in range(slices):
        kk = keys[s*SL:(s+1)*SL] + [0]*max(0, (s+1)*SL - n)
        offers += sorted(kk, reverse=True)[:OFF]
    t = 0
    for bit in range(31, -1, -1):
        c = t | (1 << bit)
        if sum(1 for o in offers if o >= c) >= k: t = c
    cand = [i for i in range(n) if keys[i] >= t]
    whole = len(cand) > CAND
    if whole: cand = list(range(n))
    order = sorted(range(len(cand)), key=lambda i: (-keys[cand[i]], i))[:k]
    return [cand[i] for i in order], len(cand), whole
def ref(x, k):
    keys = [rank_key(v) for v in x]
    return sorted(range(len(x)), key=lambda i: (-keys[i], i))[:k]
random.seed(1)
V = 248320
f32 = lambda v: struct.unpack('<f', struct.pack('<f', v))[0]
U = lambda: random.uniform(-1, 1)
cases = {
 'random': [f32(U()) for _ in range(V)],
 'tied': [math.floor(U()*8)/8 for _ in range(V)],
 'reserved': [f32(U()) for _ in range(V-2048)] + [-30.0]*2048,
 'crowded': [f32(U()+10) for _ in range(4096)] + [f32(U()) for _ in range(V-4096)],
 'constant': [0.5]*V,
 'sorted_desc': sorted([f32(U()) for _ in range(V)], reverse=True),
 'peaked': [f32(random.gauss(0,2) + (15 if random.random() < 0.001 else 0)) for _ in range(V)],
 'dsv4_width': [f32(U()) for _ in range(129280)],
}
failed = 0
for name, x in cases.items():
    for k in (1024, 40):
        got, nc, whole = vocab_topk(x, k)
        same = got == ref(x, k)
        failed += not same
        print(f"{name:12} k {k:5} candidates {nc:7}{' (whole row)' if whole else ''} "
              f"{'same picks' if same else 'DIFFERENT PICKS'}", flush=True)
raise SystemExit(1 if failed else 0)

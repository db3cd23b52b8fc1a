#!/usr/bin/env python3
"""Known answers for flashserve's FP8/FP4 formats: E4M3 ("fn") decode and encode, E8M0 decode,
E2M1 decode and encode, and the block-scaled dequantisation of the official FP8/FP4 releases
(E4M3 with 128x128 f32 `weight_scale_inv` blocks, E4M3 with 128x128 E8M0 blocks, E2M1 packed two
per byte with E8M0 scales per 32).

The inputs are the same in every mode (Python's `random`, seeded); only the answers differ in
where they come from:

  --backend torch        PyTorch's own types: torch.float8_e4m3fn (on the CUDA device when there
                         is one, checked against the CPU), torch.float8_e8m0fnu, and
                         torch.float4_e2m1fn_x2 where this torch can convert it (else the E2M1
                         tables come from the definitions and the file's metadata says so).
  --backend definitions  the OCP OFP8 / MX v1.0 definitions, in exact rational arithmetic, no
                         torch (tests/fixtures/quant/definition_known_answers.safetensors).

  python3 tools/quant/torch_known_answers.py --backend torch --out torch_known_answers.safetensors

The output is a safetensors file (written by hand: no package beyond torch is needed); the test
tests/unit/test_quant_known_answers.cpp reads every table of each file it finds.
"""
import argparse
import json
import math
import random
import struct
from fractions import Fraction

SEED = 2026
FP8_ROWS, FP8_COLS = 130, 144  # partial 128x128 blocks at both edges
FP4_ROWS, FP4_COLS = 32, 128


# ---------------------------------------------------------------- inputs (shared by both modes)
def f32(x):
    """x rounded to float32 (ties to even), overflow to infinity."""
    if math.isnan(x):
        return x
    try:
        return struct.unpack("<f", struct.pack("<f", x))[0]
    except OverflowError:
        return math.copysign(math.inf, x)


def e4m3_definition(code):
    s = -1.0 if code & 0x80 else 1.0
    e = (code >> 3) & 0xF
    m = code & 7
    if e == 15 and m == 7:
        return math.nan
    if e == 0:
        return s * math.ldexp(m, -9)
    return s * math.ldexp(8 + m, e - 10)


def make_inputs():
    rnd = random.Random(SEED)
    enc = []
    # Every midpoint between neighbouring positive codes (ties), and a hair either side of it.
    pos = [e4m3_definition(c) for c in range(0x7F)]
    for a, b in zip(pos, pos[1:] + [480.0]):
        mid = (a + b) / 2
        enc += [mid, math.nextafter(mid, 0), math.nextafter(mid, math.inf)]
    enc += [0.0, -0.0, 448.0, -448.0, 464.0, 479.99, 480.0, 1e6, math.inf, -math.inf, math.nan,
            2.0**-9, 2.0**-10, 3 * 2.0**-10, 2.0**-6, 1e-45, -1e-45, 2.0**-149]
    for _ in range(1500):
        enc.append(rnd.choice([-1, 1]) * 2.0 ** rnd.uniform(-14, 9.5))
    enc = [f32(x) for x in enc]

    fp4_enc = [0.0, -0.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 7.0, 1e9, -0.25, -5.0, -1e9]
    for _ in range(500):
        fp4_enc.append(f32(rnd.uniform(-8, 8)))
    fp4_enc = [f32(x) for x in fp4_enc]

    fp8_w = [rnd.randrange(256) for _ in range(FP8_ROWS * FP8_COLS)]
    gr, gc = -(-FP8_ROWS // 128), -(-FP8_COLS // 128)
    scale_inv = [f32(2.0 ** rnd.uniform(-20, 4)) for _ in range(gr * gc)]
    scale_e8m0 = [0, 254, 255, 127][: gr * gc] + [rnd.randrange(100, 150) for _ in range(gr * gc)]
    scale_e8m0 = scale_e8m0[: gr * gc]

    fp4_w = [rnd.randrange(256) for _ in range(FP4_ROWS * FP4_COLS // 2)]
    fp4_s = [rnd.randrange(110, 140) for _ in range(FP4_ROWS * FP4_COLS // 32)]
    fp4_s[:4] = [0, 1, 254, 255]
    return dict(enc=enc, fp4_enc=fp4_enc, fp8_w=fp8_w, scale_inv=scale_inv,
                scale_e8m0=scale_e8m0, fp4_w=fp4_w, fp4_s=fp4_s, grid=(gr, gc))


# ---------------------------------------------------------------- answers from the definitions
def e8m0_definition(e):
    return math.nan if e == 255 else math.ldexp(1.0, e - 127)


E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def e2m1_definition(code):
    v = E2M1[code & 7]
    return -v if code & 8 else v


def round_to_codes(x, values):
    """Index of the value nearest to x >= 0 (exact), ties to the even index."""
    fx = Fraction(x)
    best = None
    for i, v in enumerate(values):
        d = abs(Fraction(v) - fx)
        if best is None or d < best[0] or (d == best[0] and i % 2 == 0):
            best = (d, i)
    return best[1]


E4M3_POS = [e4m3_definition(c) for c in range(0x7F)] + [480.0]  # 480: the overflow point


def e4m3_encode_definition(x):
    sign = 0x80 if math.copysign(1.0, x) < 0 else 0
    if math.isnan(x) or abs(x) >= 480.0:
        return sign | 0x7F
    i = round_to_codes(abs(x), E4M3_POS)
    return sign | (0x7F if i == 0x7F else i)  # rounding to 480 overflows to NaN


def e2m1_encode_definition(x):
    if math.isnan(x):
        return 0
    sign = 8 if math.copysign(1.0, x) < 0 else 0
    a = min(abs(x), 6.0)  # E2M1 has no overflow value: saturate
    return sign | round_to_codes(a, E2M1)


def block_dequant_definition(weights, decode, rows, cols, scales, block_rows, block_cols, gc):
    out = []
    for r in range(rows):
        for c in range(cols):
            w = decode(weights(r, c))
            s = scales[(r // block_rows) * gc + c // block_cols]
            out.append(f32(w * s))  # the exact product rounded once: float32 multiplication
    return out


def answers_definitions(inp):
    gr, gc = inp["grid"]
    fp8 = lambda r, c: inp["fp8_w"][r * FP8_COLS + c]
    fp4 = lambda r, c: (inp["fp4_w"][(r * FP4_COLS + c) // 2] >> (4 * (c % 2))) & 0xF
    return {
        "e4m3.decode": [e4m3_definition(c) for c in range(256)],
        "e4m3.encode": [e4m3_encode_definition(x) for x in inp["enc"]],
        "e8m0.decode": [e8m0_definition(e) for e in range(256)],
        "e2m1.decode": [e2m1_definition(c) for c in range(16)],
        "e2m1.encode": [e2m1_encode_definition(x) for x in inp["fp4_enc"]],
        "fp8_scale_inv.dequant": block_dequant_definition(
            fp8, e4m3_definition, FP8_ROWS, FP8_COLS, inp["scale_inv"], 128, 128, gc),
        "fp8_e8m0.dequant": block_dequant_definition(
            fp8, e4m3_definition, FP8_ROWS, FP8_COLS,
            [e8m0_definition(e) for e in inp["scale_e8m0"]], 128, 128, gc),
        "fp4.dequant": block_dequant_definition(
            fp4, e2m1_definition, FP4_ROWS, FP4_COLS,
            [e8m0_definition(e) for e in inp["fp4_s"]], 1, 32, FP4_COLS // 32),
    }, {"e2m1": "definitions", "e8m0": "definitions", "e4m3": "definitions"}


# ---------------------------------------------------------------- answers from torch
def answers_torch(inp):
    import torch

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    u8 = lambda xs: torch.tensor(xs, dtype=torch.uint8)
    name = torch.cuda.get_device_name(0) if dev == "cuda" else "cpu"
    source = {"e4m3": "torch %s float8_e4m3fn on %s (%s)" % (torch.__version__, dev, name)}
    ans, defs = {}, answers_definitions(inp)[0]

    e4m3 = u8(list(range(256))).view(torch.float8_e4m3fn)
    ans["e4m3.decode"] = e4m3.to(dev).float().cpu().tolist()
    x = torch.tensor(inp["enc"], dtype=torch.float32)
    enc_dev = x.to(dev).to(torch.float8_e4m3fn).view(torch.uint8).cpu()
    enc_cpu = x.to(torch.float8_e4m3fn).view(torch.uint8)
    if not torch.equal(enc_dev, enc_cpu):
        raise SystemExit("torch's E4M3 rounding differs between %s and the CPU" % dev)
    ans["e4m3.encode"] = enc_dev.tolist()

    e8_defs = lambda xs: torch.tensor([defs["e8m0.decode"][e] for e in xs], dtype=torch.float32)
    e8 = None
    if hasattr(torch, "float8_e8m0fnu"):
        for where in (dev, "cpu"):  # some builds convert E8M0 on the CPU only
            try:
                u8([0, 127, 255]).view(torch.float8_e8m0fnu).to(where).float()
            except Exception:  # noqa: BLE001 - this device cannot convert it
                continue
            e8 = lambda xs, w=where: u8(xs).view(torch.float8_e8m0fnu).to(w).float().cpu()
            source["e8m0"] = "torch float8_e8m0fnu on %s" % where
            break
    if e8 is None:
        e8 = e8_defs
        source["e8m0"] = "definitions (this torch cannot convert float8_e8m0fnu)"
    ans["e8m0.decode"] = e8(list(range(256))).tolist()

    # float4_e2m1fn_x2 is a storage type in most torch builds: try a conversion, else definitions.
    e2m1_codes = None
    try:
        pairs = u8([c | (c << 4) for c in range(16)]).view(torch.float4_e2m1fn_x2)
        # On the CPU only: a CUDA build without the conversion fails by a device-side assert,
        # which poisons the CUDA context for everything after it.
        e2m1_codes = pairs.to(torch.float32).tolist()
        source["e2m1"] = "torch float4_e2m1fn_x2 on cpu"
    except Exception as exc:  # noqa: BLE001 - any failure means: no conversion in this build
        source["e2m1"] = "definitions (torch float4_e2m1fn_x2 does not convert: %s)" % (
            str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__)
    if e2m1_codes is not None and len(e2m1_codes) == 16:
        ans["e2m1.decode"] = e2m1_codes
    else:
        ans["e2m1.decode"] = defs["e2m1.decode"]
        if e2m1_codes is not None:
            source["e2m1"] = "definitions (torch float4 conversion gave %d values for 16 bytes)" % len(e2m1_codes)
    ans["e2m1.encode"] = defs["e2m1.encode"]  # torch has no float -> float4 rounding

    gr, gc = inp["grid"]
    w = u8(inp["fp8_w"]).view(torch.float8_e4m3fn).reshape(FP8_ROWS, FP8_COLS).to(dev).float()

    def expand(s, br, bc, rows, cols):
        return s.repeat_interleave(br, 0)[:rows].repeat_interleave(bc, 1)[:, :cols]

    s_inv = torch.tensor(inp["scale_inv"], dtype=torch.float32).reshape(gr, gc).to(dev)
    ans["fp8_scale_inv.dequant"] = (w * expand(s_inv, 128, 128, FP8_ROWS, FP8_COLS)).flatten().cpu().tolist()
    s_e8 = e8(inp["scale_e8m0"]).reshape(gr, gc).to(dev)
    ans["fp8_e8m0.dequant"] = (w * expand(s_e8, 128, 128, FP8_ROWS, FP8_COLS)).flatten().cpu().tolist()

    packed = u8(inp["fp4_w"])
    codes = torch.stack([packed & 0xF, packed >> 4], dim=1).flatten().long()  # low nibble first
    lut = torch.tensor(ans["e2m1.decode"], dtype=torch.float32)
    w4 = lut[codes].reshape(FP4_ROWS, FP4_COLS).to(dev)
    s4 = e8(inp["fp4_s"]).reshape(FP4_ROWS, FP4_COLS // 32).to(dev)
    ans["fp4.dequant"] = (w4 * expand(s4, 1, 32, FP4_ROWS, FP4_COLS)).flatten().cpu().tolist()
    return ans, source


# ---------------------------------------------------------------- output
def write_safetensors(path, tensors, metadata):
    header = {"__metadata__": metadata}
    blobs, offset = [], 0
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def f32_bytes(xs):
    return b"".join(struct.pack("<f", f32(x)) for x in xs)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=["torch", "definitions"], required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    inp = make_inputs()
    ans, source = answers_torch(inp) if args.backend == "torch" else answers_definitions(inp)
    gr, gc = inp["grid"]
    t = {
        "e4m3.decode": ("F32", [256], f32_bytes(ans["e4m3.decode"])),
        "e4m3.encode.input": ("F32", [len(inp["enc"])], f32_bytes(inp["enc"])),
        "e4m3.encode": ("U8", [len(inp["enc"])], bytes(ans["e4m3.encode"])),
        "e8m0.decode": ("F32", [256], f32_bytes(ans["e8m0.decode"])),
        "e2m1.decode": ("F32", [16], f32_bytes(ans["e2m1.decode"])),
        "e2m1.encode.input": ("F32", [len(inp["fp4_enc"])], f32_bytes(inp["fp4_enc"])),
        "e2m1.encode": ("U8", [len(inp["fp4_enc"])], bytes(ans["e2m1.encode"])),
        "fp8.weights": ("U8", [FP8_ROWS, FP8_COLS], bytes(inp["fp8_w"])),
        "fp8.scale_inv": ("F32", [gr, gc], f32_bytes(inp["scale_inv"])),
        "fp8.scale_e8m0": ("U8", [gr, gc], bytes(inp["scale_e8m0"])),
        "fp8_scale_inv.dequant": ("F32", [FP8_ROWS, FP8_COLS], f32_bytes(ans["fp8_scale_inv.dequant"])),
        "fp8_e8m0.dequant": ("F32", [FP8_ROWS, FP8_COLS], f32_bytes(ans["fp8_e8m0.dequant"])),
        "fp4.weights": ("U8", [FP4_ROWS, FP4_COLS // 2], bytes(inp["fp4_w"])),
        "fp4.scales": ("U8", [FP4_ROWS, FP4_COLS // 32], bytes(inp["fp4_s"])),
        "fp4.dequant": ("F32", [FP4_ROWS, FP4_COLS], f32_bytes(ans["fp4.dequant"])),
    }
    meta = {"backend": args.backend, "seed": str(SEED)}
    meta.update({"source." + k: v for k, v in source.items()})
    write_safetensors(args.out, t, meta)
    print(json.dumps({"out": args.out, **meta}))


if __name__ == "__main__":
    main()

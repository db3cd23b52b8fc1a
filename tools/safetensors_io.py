"""Reads and writes .safetensors files with the Python standard library (no numpy, no torch), for
the tools that make test checkpoints. A tensor is (dtype, shape, raw little-endian bytes).

write_safetensors lays the tensors out in name order after a header padded with spaces to a
multiple of 8 bytes (the format's rule), so the same tensors always give the same file."""
import json
import struct


def read_safetensors(path):
    """Returns (metadata or None, {name: (dtype, shape, bytes)})."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        tensors[name] = (info["dtype"], info["shape"], data[begin:end])
    return header.get("__metadata__"), tensors


def write_safetensors(path, tensors, metadata):
    header, offset, blobs = {}, 0, []
    if metadata:
        header["__metadata__"] = metadata
    for name in sorted(tensors):
        dtype, shape, blob = tensors[name]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)

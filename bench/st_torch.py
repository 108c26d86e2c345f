"""safetensors files to and from torch tensors, with torch alone.

Debian's python3-torch comes without the `safetensors` package, so the scripts here read
and write the format themselves (https://github.com/huggingface/safetensors): an 8-byte
little-endian header length, a JSON header mapping each tensor name to its dtype, shape
and data_offsets (plus an optional "__metadata__" of strings), then the data, row-major
and little-endian. Run with /usr/bin/python3 (other interpreters on PATH may lack torch).
"""

import json
import struct

import torch

MAX_HEADER = 100_000_000

DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool,
}
NAMES = {v: k for k, v in DTYPES.items()}


class FormatError(Exception):
    pass


def read(path):
    """Returns ({name: tensor}, {metadata}) of a safetensors file."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise FormatError(f"{path}: {len(data)} bytes: too short for a safetensors file")
    (n,) = struct.unpack("<Q", data[:8])
    if n > MAX_HEADER or 8 + n > len(data):
        raise FormatError(f"{path}: header length {n} does not fit the file ({len(data)} bytes)")
    try:
        header = json.loads(data[8:8 + n])
    except ValueError as e:
        raise FormatError(f"{path}: the header is not valid JSON: {e}") from e
    meta = header.pop("__metadata__", None) or {}
    base = 8 + n
    tensors = {}
    for name, info in header.items():
        dtype = DTYPES.get(info.get("dtype"))
        if dtype is None:
            raise FormatError(f"{path}: tensor '{name}' has dtype {info.get('dtype')}, which "
                              "this script does not read")
        shape = info["shape"]
        begin, end = info["data_offsets"]
        numel = 1
        for d in shape:
            numel *= d
        if not 0 <= begin <= end <= len(data) - base or \
                end - begin != numel * torch.empty(0, dtype=dtype).element_size():
            raise FormatError(f"{path}: tensor '{name}': data_offsets [{begin}, {end}] do not "
                              f"hold {info['dtype']} {shape}")
        if numel == 0:
            tensors[name] = torch.empty(shape, dtype=dtype)
        else:
            buf = bytearray(data[base + begin:base + end])  # writable: frombuffer shares it
            tensors[name] = torch.frombuffer(buf, dtype=dtype).reshape(shape)
    return tensors, meta


def write(path, tensors, metadata=None):
    """Writes {name: tensor} (and optional {str: str} metadata) as a safetensors file, as
    safetensors.torch.save_file does: contiguous little-endian data, header padded to 8."""
    header, chunks, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = dict(metadata)
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        raw = t.numpy().tobytes() if t.dtype != torch.bfloat16 else t.view(torch.int16).numpy().tobytes()
        header[name] = {"dtype": NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for c in chunks:
            f.write(c)

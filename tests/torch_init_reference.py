#!/usr/bin/python3
"""Prints the reference values of tests/test_net.c's test_init_matches_pytorch.

torch.manual_seed(SEED) then the seed network as bench/pytorch_ref.py builds it; for each
parameter tensor its first and last elements as exact float bit patterns. Run with
Debian's /usr/bin/python3 (python3-torch) and paste the output into the test.
"""
import os
import struct
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
from pytorch_ref import Net  # noqa: E402

SEED = 1
torch.manual_seed(SEED)
for name, p in Net().state_dict().items():
    flat = p.flatten()
    bits = [struct.unpack("<I", struct.pack("<f", float(flat[i])))[0] for i in (0, -1)]
    print(f'    {{"{name}", 0x{bits[0]:08x}u, 0x{bits[1]:08x}u}},  // {float(flat[0]):.9g} .. {float(flat[-1]):.9g}')

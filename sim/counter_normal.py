"""Counter-based standard normal draws that ``torch.compile`` fuses into a larger kernel.

``torch.randn`` with a generator draws its numbers one after another from a Mersenne twister
(~2 ns per number on one core here), and inductor's own CPU ``randn`` is slower still, so a
compiled env step that needs fresh Gaussian noise every step would spend most of its time in
the draw. Here every number is a pure function of ``(key, counter, index)``: an integer hash
(a multiply-xorshift mix, two rounds, of each word) gives two 24-bit uniforms per pair of outputs,
and the Box-Muller transform turns them into two independent standard normals. The whole thing
is elementwise, so it vectorizes and runs on every core inside the compiled kernel.

The 32-bit words are held in int32 (their bits; :func:`as_int32_bits`) and mixed there
(:func:`mix32`): products wrap modulo 2**32, and each right shift is masked to act as a logical
one, so the numbers are those of the same mix on unsigned 32-bit words, at half the vector width
of int64 (16 lanes per AVX-512 register instead of 8; measured in docs/benchmarks/fused-step.md,
"Compiled ahead"). Only the
counter times the golden constant is formed on int64 (below 2**63: no overflow) before it is
folded to 32 bits. Eager and compiled runs agree (to float rounding of log/cos).
"""

from __future__ import annotations

import math

import torch

MASK32 = 0xFFFFFFFF
MIX = 0x45D9F3B
"""Multiplier of the xorshift-multiply integer mix (a well-studied 32-bit finalizer constant)."""
GOLDEN = 0x9E3779B1
"""2**32 / golden ratio: spreads consecutive counters across the 32-bit key space."""
UNIFORM_SCALE = 1.0 / 16777216.0
"""2**-24: the top 24 bits of a hash as a float32 uniform in [0, 1)."""


def mix32(x: torch.Tensor) -> torch.Tensor:
    """Bijective avalanche mix of 32-bit words held as int32 bits ``x`` (any shape)."""
    x = (((x >> 16) & 0xFFFF) ^ x) * MIX
    x = (((x >> 16) & 0xFFFF) ^ x) * MIX
    return ((x >> 16) & 0xFFFF) ^ x


def as_int32_bits(x: torch.Tensor) -> torch.Tensor:
    """int64 ``x`` in [0, 2**32) -> int32 with the same 32 bits."""
    return (x - ((x >> 31) << 32)).to(torch.int32)


def counter_normal(counter: torch.Tensor, key: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """``[rows, cols]`` float32 standard normals for step ``counter`` of stream ``key``.

    ``counter`` and ``key`` are 0-dim int64 tensors (tensors, so a compiled caller does not
    recompile when they change); ``key`` below 2**32, ``counter`` below 2**31 (one per env step:
    more than any run takes). The same three inputs always give the same numbers; different
    counters give unrelated ones. Like any generator with 32-bit words, a value can recur by
    chance (each word is one of 2**32).
    """
    pairs = (cols + 1) // 2
    index = torch.arange(rows * pairs, dtype=torch.int32, device=counter.device).view(rows, pairs)
    step = mix32(as_int32_bits((counter * GOLDEN + key) & MASK32))
    salt = mix32(step ^ 0x5BD1E995)
    # The xor after the addition breaks the additive structure: two steps whose index ranges
    # overlap after ``+ step`` still hash apart (their salts differ). int32 sums wrap like the
    # masked int64 ones.
    word_a = mix32((2 * index + step) ^ salt)
    word_b = mix32((2 * index + 1 + step) ^ salt)
    # Top 24 bits (the mask makes the shift logical): (0, 1] for the logarithm, [0, 1) for the angle.
    u_radius = (((word_a >> 8) & 0xFFFFFF).to(torch.float32) + 0.5) * UNIFORM_SCALE
    u_angle = ((word_b >> 8) & 0xFFFFFF).to(torch.float32) * UNIFORM_SCALE
    radius = torch.sqrt(-2.0 * torch.log(u_radius))
    angle = (2.0 * math.pi) * u_angle
    normals = torch.cat((radius * torch.cos(angle), radius * torch.sin(angle)), dim=1)
    return normals[:, :cols]


def stream_key(seed: int) -> int:
    """A 32-bit stream key from an integer seed (any size, negative too)."""
    folded = (int(seed) ^ (int(seed) >> 32)) & MASK32
    return int(mix32(as_int32_bits(torch.tensor(folded ^ 0x2545F491, dtype=torch.int64))).item()) & MASK32

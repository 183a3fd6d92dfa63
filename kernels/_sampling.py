"""Triton helpers shared by the sampling kernels: the fixed-point inverse-CDF draw over vocabulary tiles.

The rule is ``dspark.sampling.sample_from_probs``'s: masses are the integers ``⌊p · 2^48⌋``, so a tile's
mass, the prefix over tiles and the scan inside one tile add up exactly as the sequential reference
does, in any order and with any tile size.
"""

import triton
import triton.language as tl

FIXED_POINT_ONE = tl.constexpr(281474976710656.0)  # 2**48, exact in float32 and float64


@triton.jit
def fixed_point(p):
    """``⌊p · 2^48⌋`` as int64 for ``p >= 0`` (the product only shifts the exponent, so it is exact)."""
    return (p * FIXED_POINT_ONE).to(tl.int64)


@triton.jit
def draw_threshold(u, total):
    """``⌊u · total⌋``, the product formed in float64 as every tier forms it."""
    return (u.to(tl.float64) * total.to(tl.float64)).to(tl.int64)


@triton.jit
def tile_mass(w, offs, mask):
    """A tile's integer mass and its last index of positive mass (−1 if none)."""
    w = tl.where(mask, w, 0)
    last = tl.max(tl.where(w > 0, offs, -1).to(tl.int64), 0)
    return tl.sum(w, 0), last


@triton.jit
def find_tile(mass_row, last_row, num_tiles, threshold, BLOCK_T: tl.constexpr):
    """The first tile whose cumulative mass exceeds ``threshold``, the mass of the tiles before it, and the
    last index of positive mass in the row (the fallback when ``threshold`` reaches the total)."""
    carry = tl.full([], 0, tl.int64)
    tiles_below = tl.full([], 0, tl.int64)
    last = tl.full([], -1, tl.int64)
    for t0 in range(0, num_tiles, BLOCK_T):
        offs = t0 + tl.arange(0, BLOCK_T)
        mask = offs < num_tiles
        m = tl.load(mass_row + offs, mask=mask, other=0)
        cdf = carry + tl.cumsum(m, 0)
        tiles_below += tl.sum(((cdf <= threshold) & mask).to(tl.int64), 0)
        carry += tl.sum(m, 0)
        last = tl.maximum(last, tl.max(tl.load(last_row + offs, mask=mask, other=-1), 0))
    before = tl.full([], 0, tl.int64)
    for t0 in range(0, num_tiles, BLOCK_T):
        offs = t0 + tl.arange(0, BLOCK_T)
        m = tl.load(mass_row + offs, mask=offs < num_tiles, other=0)
        before += tl.sum(tl.where(offs < tiles_below, m, 0), 0)
    return tiles_below, before, last


@triton.jit
def draw_in_tile(w, mask, before, threshold):
    """How many entries of a tile have cumulative mass ``before + …`` still ``<= threshold``."""
    cdf = before + tl.cumsum(tl.where(mask, w, 0), 0)
    return tl.sum(((cdf <= threshold) & mask).to(tl.int64), 0)

"""What every tier shares and nothing else: result types, outcome codes and the constants that fix a result.

The oracle (:mod:`dspark.reference`), the PyTorch modules and the Triton kernels all import these; the oracle
imports nothing else from ``dspark``, so a wrong computation in a module cannot pass the tests by being shared
with the reference that judges it (``tests/test_layout.py`` holds that). Only values that define what a result
*is* live here: the fixed-point scale of probability masses, the residual threshold, the verify outcome codes,
the calibration binning, and the types the tiers return.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Probability masses are summed as the integers ⌊p · 2^48⌋ (dspark.sampling explains why).
FIXED_POINT_BITS = 48
FIXED_POINT_ONE = 1 << FIXED_POINT_BITS
# Integer sums must stay below 2**53 (exact in float64, where the draw's threshold is formed).
MAX_ROW_MASS = 2.0

# Below this mass the residual max(0, p − q) is rounding noise: draw from p instead. A rejection happens
# with probability TV(p, q) = residual mass, so the fallback moves the output distribution by < 1e-6.
# Every tier compares the residual's fixed-point mass with RESIDUAL_EPS_FIXED, so each makes the same choice
# whatever order it sums in.
RESIDUAL_EPS = 1e-6
RESIDUAL_EPS_FIXED = int(RESIDUAL_EPS * FIXED_POINT_ONE)

# Per-slot verify outcomes.
NOT_REACHED, REJECTED, ACCEPTED = -1, 0, 1

# Calibration: equal-width bins of the expected calibration error, and the clamp that keeps logs finite.
ECE_BINS = 20
PROB_CLAMP = 1e-8


@dataclass
class VerifyOutput:
    """Result of one verification round.

    Attributes:
        num_accepted: ``[R]`` accepted drafted tokens n (up to and including an accepted EOS).
        outcome: ``[R, γ]`` int8 per slot: 1 accepted, 0 the rejected slot, −1 not reached or not verified.
        next_token: ``[R]`` the correction or bonus token (the next anchor); −1 when an accepted EOS ended
            the request.
        committed: ``[R, γ+1]`` tokens to append, ``[x_1..x_n, next_token]``, padded with −1.
        num_committed: ``[R]`` n + 1, or n when an accepted EOS ended the request (τ of the round).
        finished: ``[R]`` bool: an EOS was accepted or emitted as the next token.
    """

    num_accepted: torch.Tensor
    outcome: torch.Tensor
    next_token: torch.Tensor
    committed: torch.Tensor
    num_committed: torch.Tensor
    finished: torch.Tensor


@dataclass
class LossOutput:
    """``loss`` (scalar, differentiable) and its parts, each ``Σ w·term / normalizer`` (detached).

    ``acceptance [M]`` is c* per row, the analytic acceptance rate (detached).
    """

    loss: torch.Tensor
    ce: torch.Tensor
    l1: torch.Tensor
    bce: torch.Tensor
    acceptance: torch.Tensor

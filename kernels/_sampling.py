"""Triton helpers shared by the sampling kernels."""

import triton
import triton.language as tl


@triton.jit
def inverse_cdf_tile(x, offs, mask, carry, threshold, below, last_positive):
    """One vocabulary tile of the inverse-CDF draw of ``dspark.sampling.sample_from_probs``.

    Counts the entries whose running mass is still ``<= threshold`` (their number is the drawn index) and
    tracks the last index of positive mass (the fallback when ``u · total`` rounds up to ``total``).
    Returns the updated ``(carry, below, last_positive)``.
    """
    cdf = carry + tl.cumsum(x, 0)
    below += tl.sum(((cdf <= threshold) & mask).to(tl.int64), 0)
    last_positive = tl.maximum(last_positive, tl.max(tl.where((x > 0) & mask, offs, 0).to(tl.int64), 0))
    return carry + tl.sum(x, 0), below, last_positive

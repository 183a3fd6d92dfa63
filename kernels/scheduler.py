"""Fused scheduler admission: survival ranking, Algorithm 1 (early stop or global argmax) and top-K.

Mirrors ``dspark.reference.scheduler``. One program holds all R×γ entries (R ≤ 1024 in practice: the
decode batch). Instead of sorting, every entry counts, in tiles over the others, how many candidates
rank strictly before it (survival descending, then position ascending), how many share its group
(equal survival at the same position) and the survival mass before it. That gives each group's place
on the ranked path, hence τ, B and Θ = τ·SPS(B) at its end and at the end of the group before it, and
the admission rule becomes a reduction: Algorithm 1 admits every group that starts before the first
group whose Θ fails to rise (or that overflows the SPS table); the global argmax admits up to its best
group; top-K admits the groups that end within the budget.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from dspark.kernels._tuning import empty_output, launch, next_power_of_2

from dspark.scheduler import _bounds, _check_capacity

MODE_EARLY_STOP, MODE_ARGMAX, MODE_TOP_K = 0, 1, 2

CONFIGS = {
    "interpreter": [dict(CHUNK_R=2, num_warps=1, num_stages=1)],
    "sm90": [dict(CHUNK_R=4, num_warps=8, num_stages=1), dict(CHUNK_R=2, num_warps=4, num_stages=1)],
    "sm100": [dict(CHUNK_R=4, num_warps=8, num_stages=1,
                   label="compiled sm_100/sm_103 (Triton 3.9, R = 256): 40 regs, 58264 B spill (pairwise ranking); "
                         "never run")],
    "other": [dict(CHUNK_R=2, num_warps=4, num_stages=1)],
}


@triton.jit
def _survival_tile(conf_ptr, rows, cols, num_requests, gamma, stride_r, BLOCK_G: tl.constexpr):
    """``a = cumprod(c)`` along the block, multiplied left to right like the float64 reference."""
    mask = (rows < num_requests) & (cols < gamma)
    c = tl.load(conf_ptr + rows * stride_r + cols, mask=mask, other=1.0).to(tl.float64)
    alive = tl.sum(tl.where(cols == 0, c, 0.0), 1)
    a = tl.where(cols == 0, alive[:, None], c)
    for j in tl.static_range(1, BLOCK_G):
        alive = alive * tl.sum(tl.where(cols == j, c, 0.0), 1)
        a = tl.where(cols == j, alive[:, None], a)
    return a


@triton.jit
def _schedule_kernel(
    conf_ptr, lo_ptr, hi_ptr, sps_ptr, out_ptr,
    num_requests, gamma, base_tokens, max_tokens, budget, stride_r,
    MODE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_G: tl.constexpr, CHUNK_R: tl.constexpr,
):
    """Mirrors ``dspark.reference.scheduler.schedule_greedy`` / ``allocate_top_k`` (one program)."""
    rows = tl.arange(0, BLOCK_R)[:, None]
    cols = tl.arange(0, BLOCK_G)[None, :]
    slot = cols + 1
    in_batch = (rows < num_requests) & (cols < gamma)
    a = _survival_tile(conf_ptr, rows, cols, num_requests, gamma, stride_r, BLOCK_G)
    lo = tl.load(lo_ptr + rows, mask=rows < num_requests, other=0)
    hi = tl.load(hi_ptr + rows, mask=rows < num_requests, other=0)
    candidate = in_batch & (slot > lo) & (slot <= hi) & (a > 0)
    forced = in_batch & (slot <= lo)
    tau0 = num_requests + tl.sum(tl.sum(tl.where(forced, a, 0.0), 1), 0)
    tokens0 = base_tokens + num_requests + tl.sum(tl.sum(forced.to(tl.int64), 1), 0)

    before = tl.zeros([BLOCK_R, BLOCK_G], tl.int64)
    group = tl.zeros([BLOCK_R, BLOCK_G], tl.int64)
    mass_before = tl.zeros([BLOCK_R, BLOCK_G], tl.float64)
    a3 = a[:, :, None]
    j3 = slot[:, :, None]
    for m0 in range(0, num_requests, CHUNK_R):
        m_rows = m0 + tl.arange(0, CHUNK_R)[:, None]
        am = _survival_tile(conf_ptr, m_rows, cols, num_requests, gamma, stride_r, BLOCK_G)
        m_lo = tl.load(lo_ptr + m_rows, mask=m_rows < num_requests, other=0)
        m_hi = tl.load(hi_ptr + m_rows, mask=m_rows < num_requests, other=0)
        m_cand = (m_rows < num_requests) & (cols < gamma) & (slot > m_lo) & (slot <= m_hi) & (am > 0)
        am_flat = tl.reshape(am, [CHUNK_R * BLOCK_G])[None, None, :]
        jm_flat = tl.reshape(slot + m_rows * 0, [CHUNK_R * BLOCK_G])[None, None, :]
        cm_flat = tl.reshape(m_cand, [CHUNK_R * BLOCK_G])[None, None, :]
        ahead = cm_flat & ((am_flat > a3) | ((am_flat == a3) & (jm_flat < j3)))
        same = cm_flat & (am_flat == a3) & (jm_flat == j3)
        before += tl.sum(ahead.to(tl.int64), 2)
        group += tl.sum(same.to(tl.int64), 2)
        mass_before += tl.sum(tl.where(ahead, am_flat, 0.0), 2)

    big = tl.full([BLOCK_R, BLOCK_G], 1 << 40, tl.int64)
    if MODE == 2:
        room = budget - (tokens0 - base_tokens - num_requests)
        admitted = candidate & (before + group <= room)
    else:
        tokens_end = tokens0 + before + group
        tokens_prev = tokens0 + before
        fits = tokens_end <= max_tokens
        sps_end = tl.load(sps_ptr + tokens_end, mask=candidate & fits, other=0.0)
        sps_prev = tl.load(sps_ptr + tokens_prev, mask=candidate & (tokens_prev <= max_tokens), other=0.0)
        tau_prev = tau0 + mass_before
        theta_end = (tau_prev + group.to(tl.float64) * a) * sps_end
        theta_prev = tau_prev * sps_prev
        if MODE == 0:
            failing = candidate & ((~fits) | (theta_end <= theta_prev))
            first_fail = tl.min(tl.min(tl.where(failing, before, big), 1), 0)
            admitted = candidate & (before < first_fail)
        else:
            theta0 = tau0 * tl.load(sps_ptr + tokens0)
            eligible = candidate & fits
            best = tl.max(tl.max(tl.where(eligible, theta_end, float("-inf")), 1), 0)
            best_start = tl.min(tl.min(tl.where(eligible & (theta_end == best), before, big), 1), 0)
            best_start = tl.where(best > theta0, best_start, -1)  # no group beats sending no drafts
            admitted = candidate & (before <= best_start)
    lengths = lo + tl.sum(admitted.to(tl.int64), 1)[:, None]
    tl.store(out_ptr + rows, lengths, mask=rows < num_requests)


def _launch(confidence, mode, valid_len, min_len, max_len, *, sps=None, base_tokens=0, budget=0):
    num_requests, gamma = confidence.shape
    device = confidence.device
    lo, hi = _bounds(confidence, valid_len, min_len, max_len)
    out = empty_output(num_requests, dtype=torch.long, device=device)
    if num_requests == 0:
        return out
    if sps is not None:
        _check_capacity(base_tokens + num_requests + int(lo.sum()), sps)
        table, max_tokens = sps.sps.to(device), sps.max_tokens
    else:
        table, max_tokens = torch.ones(1, dtype=torch.float64, device=device), 0
    confidence = confidence.contiguous()
    args = (confidence, lo.to(device), hi.to(device), table, out,
            num_requests, gamma, base_tokens, max_tokens, budget, confidence.stride(0))
    constexprs = dict(MODE=mode, BLOCK_R=next_power_of_2(num_requests), BLOCK_G=next_power_of_2(gamma))
    launch("scheduler", _schedule_kernel, (1,), args, constexprs, device=device, table=CONFIGS,
           key=(num_requests, gamma))
    return out


def schedule_greedy(confidence, sps, valid_len=None, *, early_stop=True, min_len=0, max_len=None, base_tokens=0):
    """Triton launcher with the signature of ``dspark.scheduler.schedule_greedy`` (inputs validated there)."""
    mode = MODE_EARLY_STOP if early_stop else MODE_ARGMAX
    return _launch(confidence, mode, valid_len, min_len, max_len, sps=sps, base_tokens=base_tokens)


def allocate_top_k(confidence, budget, valid_len=None, *, min_len=0, max_len=None):
    """Triton launcher with the signature of ``dspark.scheduler.allocate_top_k`` (inputs validated there)."""
    return _launch(confidence, MODE_TOP_K, valid_len, min_len, max_len, budget=budget)

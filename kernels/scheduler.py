"""Fused scheduler admission: survival ranking, Algorithm 1 (early stop or global argmax) and top-K.

Mirrors ``dspark.reference.scheduler``. One program holds all R×γ entries (R ≤ 1024 in practice: the
decode batch) and ranks them with a bitonic sort in registers: O(n log² n) compare-and-swaps of depth
O(log² n), where the previous kernel counted every pair (O(n²)). The sort key is the rank order itself,
survival descending then slot ascending, so entries of one group (equal survival at the same slot) end up
next to each other. Scans over the sorted entries then give each group's first and last place on the ranked
path, the survival mass up to its end, hence τ, B and Θ = τ·SPS(B) at its end and at the end of the group
before it. Each mode reduces that to the sorted index of the first group it does not admit:

* Algorithm 1: the first group whose Θ fails to rise, or that overflows the SPS table;
* the global argmax: the group after the best one (none when no group beats sending no drafts);
* top-K: the first group that ends past the budget.

The key at that index is a threshold in rank order: request r's verify length is its floor plus the number
of its candidates that rank strictly before it.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl
from dspark.kernels._tuning import empty_output, launch, next_power_of_2, planned, select_config

MODE_EARLY_STOP, MODE_ARGMAX, MODE_TOP_K = 0, 1, 2

CONFIGS = {
    "interpreter": [dict(num_warps=1, num_stages=1)],
    # One program holds all R·γ entries: more warps hold fewer entries per thread (no spill at R = 256).
    "sm90": [dict(num_warps=16, num_stages=1, label="timed by autotuning on an H200 (Triton 3.6, 2026-12-04)"),
             dict(num_warps=8, num_stages=1, label="timed by autotuning on an H200 (Triton 3.6, 2026-12-04)")],
    "sm100": [dict(num_warps=16, num_stages=1,
                   label="compiled sm_100/sm_103 (Triton 3.9, R = 256): 128 regs, 0 B spill, 8 KiB smem; unmeasured"),
              dict(num_warps=8, num_stages=1,
                   label="compiled sm_100/sm_103 (Triton 3.9, R = 256): 255 regs, 0 B spill, 16 KiB smem; unmeasured")],
    "other": [dict(num_warps=4, num_stages=1)],
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
def _ranks_after(key_a, slot_a, key_b, slot_b):
    """Whether entry a ranks after entry b: lower survival, or the same survival at a later slot.

    Keys are survival bit patterns (int64), which order positive float64 values as the values do.
    """
    return (key_a < key_b) | ((key_a == key_b) & (slot_a > slot_b))


@triton.jit
def _side(LOG_N: tl.constexpr, axis: tl.constexpr):
    """0 for the first and 1 for the second half along hypercube ``axis`` (counted from the innermost)."""
    return tl.reshape(tl.arange(0, 2), [1] * (LOG_N - axis - 1) + [2] + [1] * axis)


@triton.jit
def _compare_and_swap(key, slot, descending, LOG_N: tl.constexpr, axis: tl.constexpr):
    """One bitonic step along ``axis``: each pair puts its earlier-ranked entry first (second if descending)."""
    dim: tl.constexpr = LOG_N - 1 - axis
    # x ^ xor(pair) is the other element of each pair: the swap costs no shuffle through memory.
    other_key = key ^ tl.xor_sum(key, dim, keep_dims=True)
    other_slot = slot ^ tl.xor_sum(slot, dim, keep_dims=True)
    take_other = _ranks_after(key, slot, other_key, other_slot) != (descending ^ _side(LOG_N, axis)).to(tl.int1)
    return tl.where(take_other, other_key, key), tl.where(take_other, other_slot, slot)


@triton.jit
def _rank_sort(key, slot, LOG_N: tl.constexpr):
    """Bitonic sort of 2**LOG_N entries into rank order (survival descending, slot ascending)."""
    key = tl.reshape(key, [2] * LOG_N)
    slot = tl.reshape(slot, [2] * LOG_N)
    for stage in tl.static_range(1, LOG_N + 1):
        # Every stage but the last leaves runs of 2**stage sorted in alternating directions.
        if stage < LOG_N:
            descending = _side(LOG_N, stage)
        else:
            descending = tl.zeros([1] * LOG_N, tl.int32)
        for step in tl.static_range(stage):
            key, slot = _compare_and_swap(key, slot, descending, LOG_N, stage - 1 - step)
    return tl.reshape(key, [2**LOG_N]), tl.reshape(slot, [2**LOG_N])


@triton.jit
def _shift_combine(has_a, key_a, slot_a, prev_key_a, prev_slot_a, has_b, key_b, slot_b, prev_key_b, prev_slot_b):
    """Scan step that carries, for a run of sorted entries, its last entry and the entry before that.

    ``has`` is 0 for a single entry (which has no entry before it) and 1 for any run of two or more.
    """
    prev_key = tl.where(has_b != 0, prev_key_b, key_a)
    prev_slot = tl.where(has_b != 0, prev_slot_b, slot_a)
    return has_a | 1, key_b, slot_b, prev_key, prev_slot


@triton.jit
def _starts_group(key, slot):
    """Whether each sorted entry differs from the one before it (the first entry always does)."""
    zero = tl.zeros_like(slot)
    has, _, _, prev_key, prev_slot = tl.associative_scan((zero, key, slot, key, slot), 0, _shift_combine)
    return (has == 0) | (prev_key != key) | (prev_slot != slot)


@triton.jit
def _max_combine(a, b):
    return tl.maximum(a, b)


@triton.jit
def _schedule_kernel(
    conf_ptr, valid_len_ptr, sps_ptr, out_ptr,
    num_requests, gamma, min_len, max_len, base_tokens, max_tokens, budget, stride_r,
    HAS_VALID_LEN: tl.constexpr, MODE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_G: tl.constexpr,
    LOG_N: tl.constexpr,
):
    """Mirrors ``dspark.reference.scheduler.schedule_greedy`` / ``allocate_top_k`` (one program)."""
    N: tl.constexpr = BLOCK_R * BLOCK_G
    rows = tl.arange(0, BLOCK_R)[:, None]
    cols = tl.arange(0, BLOCK_G)[None, :]
    slot = cols + 1
    in_batch = (rows < num_requests) & (cols < gamma)
    a = _survival_tile(conf_ptr, rows, cols, num_requests, gamma, stride_r, BLOCK_G)
    # The bounds of verify_length_bounds: hi = min(valid_len or γ, max_len), lo = min(min_len, hi).
    if HAS_VALID_LEN:
        hi = tl.load(valid_len_ptr + rows, mask=rows < num_requests, other=0).to(tl.int64)
    else:
        hi = tl.zeros([BLOCK_R, 1], tl.int64) + gamma
    hi = tl.minimum(hi, max_len)
    lo = tl.minimum(tl.zeros([BLOCK_R, 1], tl.int64) + min_len, hi)
    candidate = in_batch & (slot > lo) & (slot <= hi) & (a > 0)
    forced = in_batch & (slot <= lo)
    tau0 = num_requests + tl.sum(tl.sum(tl.where(forced, a, 0.0), 1), 0)
    tokens0 = base_tokens + num_requests + tl.sum(tl.sum(forced.to(tl.int64), 1), 0)

    # Non-candidates get key -1: below every positive survival, so they sort after all candidates.
    key = tl.where(candidate, a.to(tl.int64, bitcast=True), -1)
    slots = slot + rows * 0
    s_key, s_slot = _rank_sort(tl.reshape(key, [N]), tl.reshape(slots, [N]), LOG_N)
    index = tl.arange(0, N)
    is_candidate = s_key > 0
    value = tl.where(is_candidate, s_key.to(tl.float64, bitcast=True), 0.0)
    first = _starts_group(s_key, s_slot)
    # A group's last entry is the first of its group in the reversed order.
    last = tl.flip(_starts_group(tl.flip(s_key, 0), tl.flip(s_slot, 0)).to(tl.int32), 0) != 0
    start = tl.associative_scan(tl.where(first, index, 0), 0, _max_combine)
    ends = last & is_candidate
    tokens_end = tokens0 + index + 1
    if MODE == 2:
        room = budget - (tokens0 - base_tokens - num_requests)
        stop = tl.min(tl.where(ends & (index + 1 > room), start, N), 0)
    else:
        # τ at a group's end is the mass up to it; at the group before, less the group's equal survivals.
        tau_end = tau0 + tl.cumsum(value, 0)
        tau_prev = tau_end - (index - start + 1).to(tl.float64) * value
        fits = tokens_end <= max_tokens
        sps_end = tl.load(sps_ptr + tokens_end, mask=ends & fits, other=0.0)
        sps_prev = tl.load(sps_ptr + tokens0 + start, mask=ends & fits, other=0.0)
        theta_end = tau_end * sps_end
        if MODE == 0:
            failing = ends & ((~fits) | (theta_end <= tau_prev * sps_prev))
            stop = tl.min(tl.where(failing, start, N), 0)
        else:
            theta0 = tau0 * tl.load(sps_ptr + tokens0)
            eligible = ends & fits
            best = tl.max(tl.where(eligible, theta_end, float("-inf")), 0)
            best_end = tl.min(tl.where(eligible & (theta_end == best), index, N), 0)
            stop = tl.where(best > theta0, best_end + 1, 0)  # no group beats sending no drafts: admit none
    # The entry at ``stop`` starts the first group not admitted; key -2 (when none is refused) ranks last.
    stop_key = tl.max(tl.where(index == stop, s_key, -2), 0)
    stop_slot = tl.max(tl.where(index == stop, s_slot, 0), 0)
    admitted = candidate & _ranks_after(stop_key, stop_slot, key, slots)
    lengths = lo + tl.sum(admitted.to(tl.int64), 1)[:, None]
    tl.store(out_ptr + rows, lengths, mask=rows < num_requests)


def _launch(confidence, mode, valid_len, min_len, max_len, *, sps=None, base_tokens=0, budget=0):
    num_requests, gamma = confidence.shape
    device = confidence.device
    out = empty_output(num_requests, dtype=torch.long, device=device)
    if num_requests == 0:
        return out
    plan = planned(("scheduler", num_requests, gamma, device, mode, valid_len is not None),
                   lambda: _plan(num_requests, gamma, device, mode, valid_len is not None))
    table, max_tokens = (sps.on(device), sps.max_tokens) if sps is not None else (plan.no_table, 0)
    confidence = confidence.contiguous()
    if valid_len is None:
        valid_len = out  # not read
    elif valid_len.device != device:
        valid_len = valid_len.to(device)
    # A valid_len above γ is refused by the public op; max_len=None caps at γ, which valid_len never exceeds.
    launch("scheduler", _schedule_kernel, (1,),
           (confidence, valid_len.contiguous(), table, out,
            num_requests, gamma, min_len, gamma if max_len is None else max_len, base_tokens, max_tokens, budget,
            confidence.stride(0)),
           plan.constexprs, device=device, table=CONFIGS, key=None, config=plan.config)
    return out


class _Plan(NamedTuple):
    """What a call derives from its shape and mode (see ``dspark.kernels._tuning.planned``)."""

    constexprs: dict
    config: dict
    no_table: torch.Tensor


def _plan(num_requests, gamma, device, mode, has_valid_len) -> _Plan:
    # At least two entries: the bitonic sort needs one hypercube axis.
    block_r, block_g = next_power_of_2(num_requests), max(2, next_power_of_2(gamma))
    return _Plan(
        constexprs=dict(HAS_VALID_LEN=has_valid_len, MODE=mode, BLOCK_R=block_r, BLOCK_G=block_g,
                        LOG_N=(block_r * block_g).bit_length() - 1),
        config=select_config("scheduler", device, CONFIGS, lambda c: True, (num_requests, gamma)),
        no_table=torch.ones(1, dtype=torch.float64, device=device),  # top-K reads no table
    )


def schedule_greedy(confidence, sps, valid_len=None, *, early_stop=True, min_len=0, max_len=None, base_tokens=0):
    """Triton launcher with the signature of ``dspark.scheduler.schedule_greedy`` (inputs validated there)."""
    mode = MODE_EARLY_STOP if early_stop else MODE_ARGMAX
    return _launch(confidence, mode, valid_len, min_len, max_len, sps=sps, base_tokens=base_tokens)


def allocate_top_k(confidence, budget, valid_len=None, *, min_len=0, max_len=None):
    """Triton launcher with the signature of ``dspark.scheduler.allocate_top_k`` (inputs validated there)."""
    return _launch(confidence, MODE_TOP_K, valid_len, min_len, max_len, budget=budget)

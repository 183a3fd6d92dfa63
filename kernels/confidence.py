"""Fused confidence head: linear on ``[h; W1[prev]]``, bias, STS temperature, sigmoid, cumulative product.

Mirrors ``dspark.reference.confidence.confidence_survival``. One program per request walks its γ slots,
carrying the survival product in a register.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl
from dspark.kernels._tuning import accumulator, empty_output, launch, next_power_of_2, planned, select_config

CONFIGS = {
    "interpreter": [dict(BLOCK_D=16, num_warps=1, num_stages=1)],
    "sm90": [dict(BLOCK_D=512, num_warps=4, num_stages=2), dict(BLOCK_D=1024, num_warps=8, num_stages=2)],
    "sm100": [dict(BLOCK_D=1024, num_warps=8, num_stages=2,
                   label="compiled sm_100/sm_103 (Triton 3.9, paper shapes): 30 regs, 0 B spill; unmeasured"),
              dict(BLOCK_D=512, num_warps=4, num_stages=2,
                   label="compiled sm_100/sm_103 (Triton 3.9, paper shapes): 30 regs, 0 B spill; unmeasured")],
    "other": [dict(BLOCK_D=256, num_warps=4, num_stages=1)],
}


@triton.jit
def _confidence_survival_kernel(
    h_ptr, w_ptr, b_ptr, prev_ptr, w1_ptr, t_ptr,
    logits_ptr, conf_ptr, surv_ptr,
    gamma, hidden, rank,
    stride_hr, stride_hk, stride_w1v, stride_pr, stride_pk, stride_or,
    HAS_BIAS: tl.constexpr, HAS_MARKOV: tl.constexpr, HAS_TEMPERATURE: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr, ACC: tl.constexpr,
):
    """Mirrors ``dspark.reference.confidence.confidence_survival`` for request ``program_id(0)``."""
    r = tl.program_id(0).to(tl.int64)
    alive = tl.full([], 1.0, ACC)
    for k in range(gamma):
        acc = tl.zeros([BLOCK_D], ACC)
        for d0 in range(0, hidden, BLOCK_D):
            offs = d0 + tl.arange(0, BLOCK_D)
            mask = offs < hidden
            h = tl.load(h_ptr + r * stride_hr + k * stride_hk + offs, mask=mask, other=0.0).to(ACC)
            w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(ACC)
            acc += h * w
        z = tl.sum(acc, 0)
        if HAS_MARKOV:
            prev = tl.load(prev_ptr + r * stride_pr + k * stride_pk).to(tl.int64)
            offs_r = tl.arange(0, BLOCK_R)
            mask_r = offs_r < rank
            e = tl.load(w1_ptr + prev * stride_w1v + offs_r, mask=mask_r, other=0.0).to(ACC)
            w = tl.load(w_ptr + hidden + offs_r, mask=mask_r, other=0.0).to(ACC)
            z += tl.sum(e * w, 0)
        if HAS_BIAS:
            z += tl.load(b_ptr).to(ACC)
        scaled = z
        if HAS_TEMPERATURE:
            scaled = z / tl.load(t_ptr + k).to(ACC)
        c = tl.sigmoid(scaled)
        alive = alive * c
        out = r * stride_or + k
        tl.store(logits_ptr + out, z)
        tl.store(conf_ptr + out, c)
        tl.store(surv_ptr + out, alive)


def confidence_survival(hidden, weight, bias, prev_ids, markov_w1, temperatures):
    """Triton launcher with the signature of ``dspark.confidence.confidence_survival`` (inputs validated there)."""
    num_requests, gamma, hidden_size = hidden.shape
    device = hidden.device
    rank = weight.shape[1] - hidden_size
    key = ("confidence", hidden.dtype, device, gamma, hidden_size, rank, bias is not None, temperatures is not None)
    plan = planned(key, lambda: _plan(hidden.dtype, device, hidden_size, rank, bias is not None,
                                      temperatures is not None))
    # One allocation split in three: at batch 1 each allocation costs the host as much as the split does.
    outs = empty_output(3, num_requests, gamma, dtype=plan.out_dtype, device=device).unbind(0)
    if num_requests == 0:
        return outs
    hidden, weight = hidden.contiguous(), weight.contiguous()
    w1 = markov_w1.contiguous() if rank else weight
    prev = prev_ids.contiguous() if rank else outs[0]
    launch("confidence", _confidence_survival_kernel, (num_requests,),
           (hidden, weight, bias if bias is not None else weight, prev, w1,
            temperatures.contiguous() if temperatures is not None else weight, *outs, gamma, hidden_size, rank,
            hidden.stride(0), hidden.stride(1), w1.stride(0), prev.stride(0), prev.stride(1), gamma),
           plan.constexprs, device=device, table=CONFIGS, key=None, config=plan.config)
    return outs


class _Plan(NamedTuple):
    """What a call derives from its shapes and dtypes (see ``dspark.kernels._tuning.planned``)."""

    out_dtype: torch.dtype
    constexprs: dict
    config: dict


def _plan(dtype, device, hidden_size, rank, has_bias, has_temperature) -> _Plan:
    return _Plan(
        out_dtype=torch.float64 if dtype == torch.float64 else torch.float32,
        constexprs=dict(HAS_BIAS=has_bias, HAS_MARKOV=rank > 0, HAS_TEMPERATURE=has_temperature,
                        BLOCK_R=next_power_of_2(max(rank, 1)), ACC=accumulator(dtype)),
        config=select_config("confidence", device, CONFIGS, lambda c: True, (hidden_size, rank)),
    )

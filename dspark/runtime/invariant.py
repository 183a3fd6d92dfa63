"""Attention whose every query row is computed alone, so a verify pass reproduces one-token steps bit for bit.

Speculative decoding is lossless in distribution whatever the arithmetic, but greedy decoding promises more: the
same tokens as the target alone. That holds only as far as the target's verify pass of T tokens computes, for
each token, the logits a one-token step would. Floating-point sums differ with their order, and library kernels
choose the order by the shape of the whole call: a product of 8 rows, attention over 8 queries, or over a cache
with masked slots, each sums differently from one row over exactly its own keys. In fp32 the logits then differ
by about 1e-5, which flips a greedy token only at near-ties; in bf16 by up to tenths, and greedy speculative
decoding of SmolLM2-135M lost token identity on bench_e2e.py's prompts.

:func:`invariant_attention` takes the order out of the call's hands. For every request b and every query t it
takes the keys that query may see (a slice when they form a prefix of the cache, as they do at batch 1 once
rejected slots are cropped; gathered once per request and layer otherwise, holes and padding left out) and
computes that one query over exactly those keys, in fp32, with the same calls a one-token step makes. So a
query's output depends only on its own values and the keys it sees, not on how many queries share the pass or
where masked slots lie. A query that may not see its own slot is padding (a request that sends fewer tokens than
the pass is wide, or a short prompt in a prefill): nothing reads its output, so it is left at zero, not computed.

The rest of a decoder layer is row by row (norms, rotations, activations) but for the products, and for those
:mod:`dspark.linear` hands oneDNN's bf16 kernels calls that this CPU keeps apart for that weight shape
(:func:`dspark.linear.bf16_call_rows`, measured: up to 32 rows on a Xeon with AMX; on an AMD EPYC, 2 to 32 for
SmolLM2-135M's down projection, single rows padded to two). Then a whole verify pass gives each token the logits of
a one-token step bit for bit, and greedy speculative decoding equals greedy decoding of the same batch of requests
(``tests/e2e/test_invariant.py``, and ``tests/e2e/test_real_target.py`` on the default target). Prefills of more
rows than few-row products take stay as oneDNN computes them, so a request's tokens can still depend on which other
prompts shared its prefill.

The price is a Python loop over requests × queries in every layer: on a 2-core Xeon it adds 7% to a one-token
step of SmolLM2-135M at batch 1 and 14% to an 8-token verify pass (``benchmarks/results/sps_cpu_xeon.json``). It
supports plain causal attention with grouped key/value heads, the attention of Llama, Qwen2/3 and Mistral
without a sliding window; windows, logit soft-capping and attention sinks are refused.

Targets take it with ``load_target(..., invariant_attention=True)`` (or ``TargetModel(...)``'s argument).
"""

from __future__ import annotations

import torch

NAME = "dspark_invariant"
"""The name under which the attention is registered with ``transformers``."""

Plan = list[tuple[torch.Tensor | list[torch.Tensor] | None, list[int]]]
_plan: list = [None, None]  # [mask, plan]: one plan per forward, shared by every layer


def _visible(mask: torch.Tensor | None, batch: int, queries: int, slots: int, device: torch.device) -> Plan:
    """Per request, ``(gather, counts)``: query t sees ``counts[t]`` slots, which are the first ``counts[t]`` of the
    cache (``gather`` None), or the first ``counts[t]`` of the slots ``gather`` lists (the slots any of the
    request's queries sees: rolled-back holes and padding left out), or else the slots ``gather[t]`` lists.

    A verify pass's later tokens see what its earlier ones see and then themselves, so the second form is the
    rule: each request's keys are gathered once per layer, and every query reads a prefix of them. Keys always
    reach the products laid out alike (gathered along the slots, then viewed transposed), as in a one-token step.
    """
    if mask is None:  # transformers skips the mask when it is plain causal over every slot
        return [(None, list(range(slots - queries + 1, slots + 1))) for _ in range(batch)]
    if _plan[0] is mask:
        return _plan[1]
    if mask.dtype != torch.bool or mask.ndim != 4 or mask.shape[1] != 1:
        raise ValueError(f"invariant attention takes a boolean [B, 1, T, S] mask, got {mask.dtype} "
                         f"{tuple(mask.shape)}")
    allowed = mask[:, 0].expand(batch, queries, slots)
    # The T queries are the last T slots, and a query that may not see its own slot is padding (a request that
    # sends fewer tokens than the pass is wide, or a short prompt in a prefill): its output is never read.
    step = torch.arange(queries, device=device)
    allowed = allowed & allowed[:, step, slots - queries + step][:, :, None]
    counts = allowed.sum(-1)
    plan = []
    for b in range(batch):
        seen = allowed[b].any(0).nonzero().squeeze(1)
        if torch.equal(allowed[b][:, seen], torch.arange(len(seen), device=device) < counts[b, :, None]):
            whole = len(seen) == 0 or int(seen[-1]) == len(seen) - 1
            plan.append((None if whole else seen, counts[b].tolist()))
        else:
            plan.append(([allowed[b, t].nonzero().squeeze(1) for t in range(queries)], counts[b].tolist()))
    _plan[0], _plan[1] = mask, plan
    return plan


def invariant_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        attention_mask: torch.Tensor | None, scaling: float, dropout: float = 0.0,
                        **kwargs) -> tuple[torch.Tensor, None]:
    """Attention in the ``transformers`` interface, one query row at a time (see the module docstring).

    Args:
        query: ``[B, H, T, D]``; key, value: ``[B, H_kv, S, D]`` with ``H`` a multiple of ``H_kv``.
        attention_mask: boolean ``[B, 1, T, S]`` (True: may attend), or ``None`` for causal over all S slots.
            The T queries sit in the last T slots.
        scaling: the factor on ``q · k``.

    Returns:
        ``([B, T, H, D]`` in the query's dtype, ``None)``: no attention weights are kept. Rows of queries that
        may not see their own slot (padding) are zeros.
    """
    for name in ("sliding_window", "softcap", "s_aux"):
        if kwargs.get(name) is not None:
            raise ValueError(f"invariant attention does not support {name} (got {kwargs[name]!r})")
    if dropout:
        raise ValueError(f"invariant attention is for inference: dropout must be 0, got {dropout}")
    batch, heads, queries, dim = query.shape
    kv_heads, slots = key.shape[1], key.shape[2]
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads do not group over {kv_heads} key/value heads")
    plan = _visible(attention_mask, batch, queries, slots, query.device)
    groups = heads // kv_heads
    scaled = (query.float() * scaling).reshape(batch, kv_heads, groups, queries, dim)
    rows = []
    padding = scaled.new_zeros(kv_heads, groups, dim)
    for b, (gather, counts) in enumerate(plan):
        keys, values = key[b], value[b]  # [H_kv, S, D]
        if isinstance(gather, torch.Tensor):
            keys, values = keys[:, gather], values[:, gather]
        keys, values = keys.float(), values.float()
        for t in range(queries):
            if counts[t] == 0:
                rows.append(padding)
                continue
            if isinstance(gather, list):
                k, v = keys[:, gather[t]], values[:, gather[t]]
            else:
                k, v = keys[:, :counts[t]], values[:, :counts[t]]
            rows.append(torch.bmm(torch.softmax(torch.bmm(scaled[b, :, :, t], k.transpose(1, 2)), -1), v))
    out = torch.stack(rows).to(query.dtype).reshape(batch, queries, heads, dim)
    return out, None


def register() -> str:
    """Register :func:`invariant_attention` (with ``transformers``' boolean masks) under :data:`NAME`."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, invariant_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    return NAME


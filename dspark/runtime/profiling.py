"""The target's verify cost, profiled the way a serving engine does at start-up: SPS tables for the scheduler.

:func:`profile_verify_sps` times verify passes of every width on a real target; :func:`choose_few_row_layout`
does so in each of :mod:`dspark.linear`'s few-row layouts and keeps the fastest for the process.
"""

from __future__ import annotations

import torch

from dspark.runtime.decoding import prefill
from dspark.scheduler import SPSTable


@torch.no_grad()
def profile_verify_sps(target, max_tokens: int, *, requests: int = 1, context: int = 64,
                       repeats: int = 3) -> SPSTable:
    """The target's SPS table for ``requests`` requests verifying ``requests`` … ``max_tokens`` tokens in all.

    What an engine profiles once at start-up for :class:`dspark.scheduler.PrefixScheduler`: each request holds
    ``context`` cached tokens; a pass of B tokens feeds every request ⌈B / requests⌉ slots (the decoding loop
    pads requests to the longest, so that is what B tokens cost), marks B of them valid, and is timed and
    rolled back, so every pass attends to the same context. Below ``requests`` tokens the table holds the
    first measured latency: every request sends at least its anchor.
    """
    from dspark.scheduler import profile_sps

    if not 1 <= requests <= max_tokens:
        raise ValueError(f"requests must lie in [1, max_tokens = {max_tokens}], got {requests}")
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(target.vocab_size, (requests, context), generator=gen).tolist()
    state, *_ = prefill(target, prompts)
    device = target.device
    rows = torch.arange(requests, device=device)[:, None]

    def step(count: int) -> None:
        width = -(-count // requests)
        slots = torch.arange(width, device=device)
        ids = torch.randint(target.vocab_size, (requests, width), generator=gen).to(device)
        positions = state.next_pos[:, None] + slots
        # Slot j of request r is the (j·R + r)-th token: requests differ in length by at most one.
        target.forward(state, ids, positions, slots * requests + rows < count)
        target.keep(state, width, torch.zeros(requests, dtype=torch.long, device=device))
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    return profile_sps(step, list(range(requests, max_tokens + 1)), repeats=repeats)


def choose_few_row_layout(target, max_tokens: int, *, requests: int = 1, context: int = 64,
                          repeats: int = 3) -> SPSTable:
    """Keep the fastest of :mod:`dspark.linear`'s few-row layouts for this process; return its SPS table.

    On a CPU, which layout runs a verify pass fastest depends on the CPU and its BLAS (see :mod:`dspark.linear`).
    So, where an engine profiles its verify pass at start-up anyway, this profiles it (:func:`profile_verify_sps`,
    same arguments) in each candidate layout, each twice, in an order that reads the same backwards, so that a
    machine drifting in speed weighs on all alike. For fp32 targets the candidates are ``(W · xᵀ)ᵀ``, ``F.linear``
    and, where torch has MKL, MKL-packed weights from 2 rows and from 4 rows (``F.linear`` below: on some CPUs MKL
    multiplies 2 or 3 rows without repacking anyway, faster than padded packed products; the second is left out
    when every request feeds at least 4 rows). For bf16 targets they are ``F.linear`` and, where oneDNN runs bf16,
    oneDNN-packed weights from one row, both in calls that this CPU keeps apart
    (:func:`dspark.linear.bf16_call_rows`), so that each row comes out as it would alone (what
    :mod:`dspark.runtime.invariant` relies on). It keeps the one whose latencies summed over ``requests`` …
    ``max_tokens`` tokens are lowest (:func:`dspark.linear.describe_layout` then says which) and returns the mean of
    its two tables. The setting is the process's, so the drafter's layers follow it too. The choice changes outputs by
    rounding only (in bf16, on a Xeon with AMX, not at all). Profiling the packed layout packs a copy of every
    weight (for fp32, one per bucket of rows it meets: up to four for ``max_tokens`` 32); unless that layout is
    kept, the copies are freed before this returns. On a GPU there is one layout, and this is
    :func:`profile_verify_sps`.
    """
    from dspark.linear import (
        SKINNY_ROWS,
        clear_packed_weights,
        few_row_layout,
        packed_layout_available,
        set_skinny_rows,
    )

    if target.device.type != "cpu":
        return profile_verify_sps(target, max_tokens, requests=requests, context=context, repeats=repeats)
    if target.dtype == torch.bfloat16:
        settings = [(SKINNY_ROWS, "transposed", 1)] + (  # bf16 takes F.linear in the "transposed" setting
            [(SKINNY_ROWS, "packed", 1)] if packed_layout_available(torch.bfloat16) else [])
    else:
        settings = [(SKINNY_ROWS, "transposed", 1), (0, "transposed", 1)]
        if packed_layout_available(torch.float32):
            settings += [(SKINNY_ROWS, "packed", 2)] + ([(SKINNY_ROWS, "packed", 4)] if requests < 4 else [])
    latencies = {setting: [] for setting in settings}
    for setting in settings + settings[::-1]:
        with few_row_layout(*setting):
            table = profile_verify_sps(target, max_tokens, requests=requests, context=context, repeats=repeats)
        latencies[setting].append(1.0 / table.sps[1:])
    mean = {setting: sum(runs) / len(runs) for setting, runs in latencies.items()}
    kept = min(mean, key=lambda setting: float(mean[setting][requests - 1:].sum()))
    set_skinny_rows(*kept)
    if kept[1] != "packed":
        clear_packed_weights()
    return SPSTable.from_latencies(list(range(1, max_tokens + 1)), mean[kept].tolist())

"""Oracle for dspark.metrics: the metric definitions evaluated round by round."""

from __future__ import annotations


def acceptance_metrics(rounds, block_size):
    """``rounds``: list of ``(verify_len, num_accepted, num_committed)``; returns the metrics as a dict."""
    n = len(rounds)
    conditional, unconditional = [], []
    for k in range(block_size):
        verified = [r for r in rounds if r[0] >= k + 1]
        reached = [r for r in verified if r[1] >= k]  # slots 1..k all accepted
        accepted_here = [r for r in reached if r[1] >= k + 1]
        conditional.append(len(accepted_here) / len(reached) if reached else float("nan"))
        unconditional.append(len([r for r in verified if r[1] >= k + 1]) / len(verified) if verified else float("nan"))
    return {
        "rounds": n,
        "tau": sum(r[2] for r in rounds) / n,
        "acceptance_length_vllm": 1 + sum(r[1] for r in rounds) / n,
        "accepted_per_round_no_bonus_dflash": sum(r[1] for r in rounds) / n,
        "conditional_acceptance": conditional,
        "unconditional_acceptance": unconditional,
    }

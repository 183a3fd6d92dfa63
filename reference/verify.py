"""Oracle for dspark.verify: method.md §7 written out for one request at a time."""

from __future__ import annotations

import torch
from dspark.reference.sampling import fixed_point_mass, sample_row

from dspark.contract import ACCEPTED, NOT_REACHED, REJECTED, RESIDUAL_EPS_FIXED, VerifyOutput


def verify(draft_tokens, draft_probs, target_probs, verify_len, accept_uniforms, final_uniforms, *, eos_token_id):
    num_requests, gamma, vocab = draft_probs.shape
    num_accepted = torch.zeros(num_requests, dtype=torch.long)
    outcome = torch.full((num_requests, gamma), NOT_REACHED, dtype=torch.int8)
    next_token = torch.full((num_requests,), -1, dtype=torch.long)
    committed = torch.full((num_requests, gamma + 1), -1, dtype=torch.long)
    num_committed = torch.zeros(num_requests, dtype=torch.long)
    finished = torch.zeros(num_requests, dtype=torch.bool)
    for r in range(num_requests):
        n, ended_by_eos, rejected = 0, False, False
        for k in range(int(verify_len[r])):
            x = int(draft_tokens[r, k])
            q = float(draft_probs[r, k, x])
            p = float(target_probs[r, k, x])  # target position k holds x_k and predicts x_{k+1}
            if float(accept_uniforms[r, k]) * q < p:
                outcome[r, k] = ACCEPTED
                committed[r, n] = x
                n += 1
                if eos_token_id is not None and x == eos_token_id:
                    ended_by_eos = True
                    break
            else:
                outcome[r, k] = REJECTED
                rejected = True
                break
        num_accepted[r] = n
        if ended_by_eos:
            num_committed[r] = n
            finished[r] = True
            continue
        target_row = [float(v) for v in target_probs[r, n]]
        dist = target_row
        if rejected:
            residual = [max(0.0, t - float(d)) for t, d in zip(target_row, draft_probs[r, n])]
            if sum(fixed_point_mass(x) for x in residual) > RESIDUAL_EPS_FIXED:
                dist = residual
        token = sample_row(torch.tensor(dist, dtype=torch.float64), float(final_uniforms[r]))
        next_token[r] = token
        committed[r, n] = token
        num_committed[r] = n + 1
        finished[r] = eos_token_id is not None and token == eos_token_id
    return VerifyOutput(num_accepted, outcome, next_token, committed, num_committed, finished)

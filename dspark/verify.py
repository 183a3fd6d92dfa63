"""Lossless verification (method.md §7): batched rejection sampling with a ragged verify length per request.

Request r proposed ``verify_len[r] = ℓ`` drafted tokens ``x_1..x_ℓ`` drawn from ``draft_probs``; the target
ran on ``[x_0, x_1..x_ℓ]`` and returned ``target_probs[r, 0..ℓ]`` (position k predicts the token after
``x_k``). For k = 1..ℓ, ``x_k`` is accepted iff ``u_k · q_k(x_k) < p_{k−1}(x_k)`` — the division-free form of
``u_k < min(1, p/q)``. After the first rejection at slot n+1 a correction is drawn from
``norm(max(0, p_n − q_{n+1}))``; if all ℓ pass, a bonus is drawn from ``p_ℓ``. Either way the output is
distributed exactly as the target's own samples. Greedy decoding is the same code with one-hot
distributions (``warp_logits(…, temperature=0)``): accept iff ``x_k`` is the target's argmax.

An accepted EOS ends the request there: no correction and no bonus (method.md §7 step 6).
"""

from __future__ import annotations

import torch

from dspark._checks import check_tensor, check_token_range, check_uniforms, values_checked
from dspark.backend import resolve_backend
from dspark.contract import ACCEPTED, NOT_REACHED, REJECTED, RESIDUAL_EPS_FIXED, VerifyOutput
from dspark.sampling import fixed_point, sample_from_probs


def verify(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    verify_len: torch.Tensor,
    accept_uniforms: torch.Tensor,
    final_uniforms: torch.Tensor,
    *,
    eos_token_id: int | None = None,
    backend: str = "auto",
) -> VerifyOutput:
    """Rejection-sample a batch of drafted blocks against the target (method.md §7).

    Args:
        draft_tokens: ``[R, γ]`` int64 drafted tokens.
        draft_probs: ``[R, γ, V]`` the distributions they were drawn from (after temperature/top-k/top-p).
        target_probs: ``[R, γ+1, V]`` target distributions at the verify positions; rows past
            ``verify_len[r]`` are ignored.
        verify_len: ``[R]`` ℓ_r in ``[0, γ]``: how many drafted tokens request r sends.
        accept_uniforms: ``[R, γ]`` draws in ``[0, 1)`` for the acceptance tests.
        final_uniforms: ``[R]`` one draw in ``[0, 1)`` for the correction or bonus token.
        eos_token_id: accepted EOS ends a request without a bonus.
        backend: ``auto`` | ``reference`` | ``torch`` | ``triton``.
    """
    _check_inputs(draft_tokens, draft_probs, target_probs, verify_len, accept_uniforms, final_uniforms)
    vocab = draft_probs.shape[-1]
    if eos_token_id is not None and (isinstance(eos_token_id, bool) or not isinstance(eos_token_id, int)
                                     or not 0 <= eos_token_id < vocab):
        raise ValueError(f"eos_token_id must be an int in [0, {vocab}) or None, got {eos_token_id!r}")
    backend = resolve_backend(backend, draft_probs)
    if backend == "reference":
        from dspark.reference.verify import verify as reference_verify

        return reference_verify(draft_tokens, draft_probs, target_probs, verify_len, accept_uniforms,
                                final_uniforms, eos_token_id=eos_token_id)
    if backend == "triton":
        from dspark.kernels import verify as triton_verify

        return triton_verify(draft_tokens, draft_probs, target_probs, verify_len, accept_uniforms,
                             final_uniforms, eos_token_id=eos_token_id)
    return _verify_torch(draft_tokens, draft_probs, target_probs, verify_len, accept_uniforms, final_uniforms,
                         eos_token_id)


def _verify_torch(draft_tokens, draft_probs, target_probs, verify_len, accept_uniforms, final_uniforms, eos):
    num_requests, gamma, _ = draft_probs.shape
    rows = torch.arange(num_requests, device=draft_probs.device)
    slots = torch.arange(gamma, device=draft_probs.device)
    compute = torch.promote_types(draft_probs.dtype, torch.float32)
    q = draft_probs.gather(-1, draft_tokens[..., None]).squeeze(-1).to(compute)
    p = target_probs[:, :gamma].gather(-1, draft_tokens[..., None]).squeeze(-1).to(compute)
    passed = (accept_uniforms.to(compute) * q < p) & (slots < verify_len[:, None])
    accepted, ended_by_eos = _accepted_prefix(passed, draft_tokens, eos)
    num_accepted = accepted.sum(-1)
    rejected = (num_accepted < verify_len) & ~ended_by_eos
    reject_slot = num_accepted.clamp(max=gamma - 1)

    target_row = target_probs[rows, num_accepted].to(compute)  # p_n: predicts the token after x_n
    draft_row = draft_probs[rows, reject_slot].to(compute)
    residual = (target_row - draft_row).clamp(min=0)
    use_residual = rejected & (fixed_point(residual).sum(-1) > RESIDUAL_EPS_FIXED)
    final_dist = torch.where(use_residual[:, None], residual, target_row)
    next_token = sample_from_probs(final_dist, final_uniforms.to(compute))
    return _round_output(draft_tokens, accepted, ended_by_eos, rejected, next_token, eos)


def verify_greedy(draft_tokens: torch.Tensor, target_tokens: torch.Tensor, verify_len: torch.Tensor, *,
                  eos_token_id: int | None = None) -> VerifyOutput:
    """:func:`verify` for greedy decoding, from token ids: what it returns for one-hot distributions.

    With one-hot draft and target distributions the acceptance test ``u · q(x_k) < p_{k−1}(x_k)`` passes iff
    ``x_k`` is the target's argmax, and both the correction ``norm(max(0, p_n − q_{n+1}))`` and the bonus
    ``p_ℓ`` are one-hots at the target's argmax: no distribution and no draw is needed, only ``[R, γ+1]``
    argmaxes instead of ``[R, γ+1, V]`` probabilities.

    Args:
        draft_tokens: ``[R, γ]`` int64 drafted tokens (each the argmax of its draft distribution).
        target_tokens: ``[R, γ+1]`` int64 the target's argmax at each verify position (position k predicts the
            token after ``x_k``); entries past ``verify_len[r]`` are ignored.
        verify_len: ``[R]`` ℓ_r in ``[0, γ]``.
        eos_token_id: accepted EOS ends a request without a bonus.
    """
    check_tensor("draft_tokens", draft_tokens, ndim=2, integer=True)
    num_requests, gamma = draft_tokens.shape
    if gamma < 1:
        raise ValueError(f"draft_tokens must have at least one block slot, got shape {tuple(draft_tokens.shape)}")
    check_tensor("target_tokens", target_tokens, shape=(num_requests, gamma + 1), integer=True)
    check_tensor("verify_len", verify_len, shape=(num_requests,), integer=True)
    if values_checked():
        _check_verify_len(verify_len, gamma)
        if draft_tokens.numel() and int(draft_tokens.min()) < 0:
            raise ValueError("draft_tokens must be non-negative token ids")
        if target_tokens.numel() and int(target_tokens.min()) < 0:
            raise ValueError("target_tokens must be non-negative token ids")
    if eos_token_id is not None and (isinstance(eos_token_id, bool) or not isinstance(eos_token_id, int)
                                     or eos_token_id < 0):
        raise ValueError(f"eos_token_id must be a non-negative int or None, got {eos_token_id!r}")
    rows = torch.arange(num_requests, device=draft_tokens.device)
    slots = torch.arange(gamma, device=draft_tokens.device)
    passed = (draft_tokens == target_tokens[:, :gamma]) & (slots < verify_len[:, None])
    accepted, ended_by_eos = _accepted_prefix(passed, draft_tokens, eos_token_id)
    num_accepted = accepted.sum(-1)
    rejected = (num_accepted < verify_len) & ~ended_by_eos
    return _round_output(draft_tokens, accepted, ended_by_eos, rejected, target_tokens[rows, num_accepted],
                         eos_token_id)


def _accepted_prefix(passed: torch.Tensor, draft_tokens: torch.Tensor, eos: int | None):
    """``[R, γ]`` accepted slots (those before the first failed test) and ``[R]`` whether an EOS was accepted.

    Nothing after an accepted EOS counts, so the prefix is cut just after the first one.
    """
    accepted = passed.to(torch.int64).cumprod(-1).bool()
    ended_by_eos = torch.zeros_like(accepted[:, 0])
    if eos is not None:
        accepted_eos = (draft_tokens == eos) & accepted
        accepted = accepted & ((accepted_eos.cumsum(-1) - accepted_eos.long()) == 0)
        ended_by_eos = accepted_eos.any(-1)
    return accepted, ended_by_eos


def _round_output(draft_tokens: torch.Tensor, accepted: torch.Tensor, ended_by_eos: torch.Tensor,
                  rejected: torch.Tensor, next_token: torch.Tensor, eos: int | None) -> VerifyOutput:
    """Assemble a round's :class:`VerifyOutput` from its accepted prefix and its correction or bonus token."""
    num_requests, gamma = draft_tokens.shape
    rows = torch.arange(num_requests, device=draft_tokens.device)
    num_accepted = accepted.sum(-1)
    # Selections by torch.where, not boolean indexing, whose output size the host would have to read back.
    slots = torch.arange(gamma, device=draft_tokens.device)
    rejected_at = rejected[:, None] & (slots == num_accepted.clamp(max=gamma - 1)[:, None])
    outcome = torch.full((num_requests, gamma), NOT_REACHED, dtype=torch.int8, device=draft_tokens.device)
    outcome = torch.where(accepted, ACCEPTED, torch.where(rejected_at, REJECTED, outcome))
    next_token = torch.where(ended_by_eos, torch.full_like(next_token, -1), next_token)

    committed = torch.full((num_requests, gamma + 1), -1, dtype=torch.long, device=draft_tokens.device)
    committed[:, :gamma] = torch.where(accepted, draft_tokens, committed[:, :gamma])
    committed[rows, num_accepted] = torch.where(ended_by_eos, committed[rows, num_accepted], next_token)
    num_committed = num_accepted + (~ended_by_eos).to(num_accepted.dtype)
    finished = ended_by_eos if eos is None else ended_by_eos | (next_token == eos)
    return VerifyOutput(num_accepted, outcome, next_token, committed, num_committed, finished)


def _check_inputs(draft_tokens, draft_probs, target_probs, verify_len, accept_uniforms, final_uniforms) -> None:
    check_tensor("draft_probs", draft_probs, ndim=3, floating=True, finite=True)
    num_requests, gamma, vocab = draft_probs.shape
    if gamma < 1:
        raise ValueError(f"draft_probs must have at least one block slot, got shape {tuple(draft_probs.shape)}")
    check_tensor("draft_tokens", draft_tokens, shape=(num_requests, gamma), integer=True)
    check_tensor("target_probs", target_probs, shape=(num_requests, gamma + 1, None), floating=True, finite=True)
    if target_probs.shape[-1] != vocab:
        raise ValueError(
            f"vocabulary mismatch: draft_probs have {vocab} entries per row, target_probs {target_probs.shape[-1]}; "
            "scatter a reduced draft vocabulary into the target's before verifying"
        )
    check_tensor("verify_len", verify_len, shape=(num_requests,), integer=True)
    check_tensor("accept_uniforms", accept_uniforms, shape=(num_requests, gamma), floating=True)
    check_tensor("final_uniforms", final_uniforms, shape=(num_requests,), floating=True)
    check_uniforms("accept_uniforms", accept_uniforms)
    check_uniforms("final_uniforms", final_uniforms)
    check_token_range("draft_tokens", draft_tokens, vocab)
    if not values_checked():
        return
    _check_verify_len(verify_len, gamma)
    if bool((draft_probs < 0).any()) or bool((target_probs < 0).any()):
        raise ValueError("draft_probs and target_probs must be non-negative probabilities")
    # Every row the verifier reads must be a distribution: target rows 0…ℓ_r, draft rows 1…ℓ_r. The
    # tolerance covers the rounding of a softmax stored in the given dtype (fp32: summing 150k terms drifts
    # by ~1e-5; bf16/fp16 store each term to 3 significant digits), not a mis-scaled or empty row.
    slots = torch.arange(gamma + 1, device=verify_len.device)
    tolerance = 1e-3 if torch.finfo(target_probs.dtype).bits >= 32 else 2e-2
    for name, probs, read in (("target_probs", target_probs, slots <= verify_len[:, None]),
                              ("draft_probs", draft_probs, slots[:gamma] < verify_len[:, None])):
        mass = probs.sum(-1, dtype=torch.float64)
        off = read.to(mass.device) & ((mass - 1).abs() > tolerance)
        if bool(off.any()):
            r, k = (int(i) for i in off.nonzero()[0])
            raise ValueError(f"{name}[{r}, {k}] sums to {float(mass[r, k]):.6g}, not 1 (±{tolerance:g}): every row "
                             "the verifier reads must be a probability distribution")


def _check_verify_len(verify_len: torch.Tensor, gamma: int) -> None:
    if verify_len.numel() and (int(verify_len.min()) < 0 or int(verify_len.max()) > gamma):
        raise ValueError(f"verify_len must lie in [0, {gamma}], got {verify_len.tolist()}")

"""Acceptance metrics, with every stack's definition named (method.md §7, §9).

* ``tau``: mean tokens committed per round, the bonus/correction token included (the paper's τ; a round
  that ends on an accepted EOS commits n, not n + 1, as DeepSpec counts it).
* ``acceptance_length``: vLLM's ``1 + accepted / drafts``; equals ``tau`` unless a round ended on EOS.
* ``accepted_per_round_no_bonus``: DFlash's bonus-free ``eal``, the mean accepted drafts per round.
* ``conditional[k]``: P(slot k+1 accepted | slots 1..k accepted and slot k+1 verified), the paper's Fig. 2.
* ``unconditional[k]``: rounds accepting ≥ k+1 drafts over rounds that verified ≥ k+1 (DeepSpec's
  ``accept_rate@pos``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from dspark._checks import check_tensor


@dataclass
class AcceptanceStats:
    """Running counts over verification rounds; add rounds with :meth:`update`, read metrics as properties.

    Attributes:
        block_size: γ.
        rounds: verification rounds seen.
        committed: tokens committed (the τ numerator).
        accepted: drafted tokens accepted.
        proposed: ``[γ]`` rounds that verified at least k+1 drafts.
        reached: ``[γ]`` rounds that verified slot k+1 with slots 1..k all accepted.
        accepted_at: ``[γ]`` rounds that accepted at least k+1 drafts.
    """

    block_size: int
    rounds: int = 0
    committed: int = 0
    accepted: int = 0
    proposed: torch.Tensor = field(default=None)
    reached: torch.Tensor = field(default=None)
    accepted_at: torch.Tensor = field(default=None)

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        for name in ("proposed", "reached", "accepted_at"):
            if getattr(self, name) is None:
                setattr(self, name, torch.zeros(self.block_size, dtype=torch.long))

    def update(self, verify_len: torch.Tensor, num_accepted: torch.Tensor, num_committed: torch.Tensor) -> None:
        """Add rounds: ``[R]`` verify lengths, accepted drafts and committed tokens (e.g. from :func:`verify`)."""
        check_tensor("verify_len", verify_len, ndim=1, integer=True)
        check_tensor("num_accepted", num_accepted, shape=tuple(verify_len.shape), integer=True)
        check_tensor("num_committed", num_committed, shape=tuple(verify_len.shape), integer=True)
        if bool((num_accepted > verify_len).any()) or bool((verify_len > self.block_size).any()):
            raise ValueError("need num_accepted <= verify_len <= block_size in every round")
        slots = torch.arange(self.block_size)
        verify_len, num_accepted = verify_len.cpu(), num_accepted.cpu()
        self.rounds += verify_len.numel()
        self.committed += int(num_committed.sum())
        self.accepted += int(num_accepted.sum())
        self.proposed += (slots < verify_len[:, None]).sum(0)
        self.reached += ((slots < verify_len[:, None]) & (slots <= num_accepted[:, None])).sum(0)
        self.accepted_at += (slots < num_accepted[:, None]).sum(0)

    def merge(self, other: AcceptanceStats) -> AcceptanceStats:
        if other.block_size != self.block_size:
            raise ValueError(f"cannot merge stats of block sizes {self.block_size} and {other.block_size}")
        return AcceptanceStats(
            self.block_size, self.rounds + other.rounds, self.committed + other.committed,
            self.accepted + other.accepted, self.proposed + other.proposed, self.reached + other.reached,
            self.accepted_at + other.accepted_at,
        )

    @property
    def tau(self) -> float:
        return self.committed / self.rounds if self.rounds else float("nan")

    @property
    def acceptance_length(self) -> float:
        return 1 + self.accepted / self.rounds if self.rounds else float("nan")

    @property
    def accepted_per_round_no_bonus(self) -> float:
        return self.accepted / self.rounds if self.rounds else float("nan")

    @property
    def conditional(self) -> torch.Tensor:
        return self.accepted_at.double() / self.reached.double()

    @property
    def unconditional(self) -> torch.Tensor:
        return self.accepted_at.double() / self.proposed.double()

    def as_dict(self) -> dict:
        return {
            "rounds": self.rounds,
            "tau": self.tau,
            "acceptance_length_vllm": self.acceptance_length,
            "accepted_per_round_no_bonus_dflash": self.accepted_per_round_no_bonus,
            "conditional_acceptance": self.conditional.tolist(),
            "unconditional_acceptance": self.unconditional.tolist(),
            "reached_by_position": self.reached.tolist(),
            "accepted_by_position": self.accepted_at.tolist(),
        }

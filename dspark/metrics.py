"""Acceptance metrics, with every stack's definition named (method.md §7, §9).

* ``tau``: mean tokens committed per round, the bonus/correction token included (the paper's τ; a round
  that ends on an accepted EOS commits n, not n + 1, as DeepSpec counts it).
* ``acceptance_length``: vLLM's ``1 + accepted / drafts``; equals ``tau`` unless a round ended on EOS.
* ``accepted_per_round_no_bonus``: DFlash's bonus-free ``eal``, the mean accepted drafts per round.
* ``conditional[k]``: P(slot k+1 accepted | slots 1..k accepted and slot k+1 verified), the paper's Fig. 2.
* ``unconditional[k]``: rounds accepting ≥ k+1 drafts over rounds that verified ≥ k+1 (DeepSpec's
  ``accept_rate@pos``).
* ``repeat_rate[k]``: drafted blocks whose slot k+2 holds the same token as slot k+1, verified or not. Slots
  sampled independently from one parallel pass fall back on the same likely token when the drafter is unsure
  (a newline, then another, then another); the Markov head exists to break that, and this rate shows whether
  it does.
"""

from __future__ import annotations

import math
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
        drafted: blocks drafted (rounds given ``draft_tokens``).
        repeats: ``[γ - 1]`` drafted blocks whose slot k+2 repeats slot k+1's token.
    """

    block_size: int
    rounds: int = 0
    committed: int = 0
    accepted: int = 0
    proposed: torch.Tensor = field(default=None)
    reached: torch.Tensor = field(default=None)
    accepted_at: torch.Tensor = field(default=None)
    drafted: int = 0
    repeats: torch.Tensor = field(default=None)

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        for name in ("proposed", "reached", "accepted_at"):
            if getattr(self, name) is None:
                setattr(self, name, torch.zeros(self.block_size, dtype=torch.long))
        if self.repeats is None:
            self.repeats = torch.zeros(self.block_size - 1, dtype=torch.long)

    def update(self, verify_len: torch.Tensor, num_accepted: torch.Tensor, num_committed: torch.Tensor,
               draft_tokens: torch.Tensor | None = None) -> None:
        """Add rounds: ``[R]`` verify lengths, accepted drafts and committed tokens (e.g. from :func:`verify`),
        and the ``[R, γ]`` drafted blocks when the rounds drafted one."""
        check_tensor("verify_len", verify_len, ndim=1, integer=True)
        check_tensor("num_accepted", num_accepted, shape=tuple(verify_len.shape), integer=True)
        check_tensor("num_committed", num_committed, shape=tuple(verify_len.shape), integer=True)
        if draft_tokens is not None:
            check_tensor("draft_tokens", draft_tokens, shape=(verify_len.shape[0], self.block_size), integer=True)
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
        if draft_tokens is not None:
            self.drafted += draft_tokens.shape[0]
            self.repeats += (draft_tokens[:, 1:] == draft_tokens[:, :-1]).sum(0).cpu()

    def merge(self, other: AcceptanceStats) -> AcceptanceStats:
        if other.block_size != self.block_size:
            raise ValueError(f"cannot merge stats of block sizes {self.block_size} and {other.block_size}")
        return AcceptanceStats(
            self.block_size, self.rounds + other.rounds, self.committed + other.committed,
            self.accepted + other.accepted, self.proposed + other.proposed, self.reached + other.reached,
            self.accepted_at + other.accepted_at, self.drafted + other.drafted, self.repeats + other.repeats,
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

    @property
    def repeat_rate(self) -> torch.Tensor:
        return self.repeats.double() / self.drafted if self.drafted else torch.full((self.block_size - 1,), math.nan)

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
            "drafted_blocks": self.drafted,
            "draft_repeat_rate": self.repeat_rate.tolist(),
        }

    @property
    def verify_length_counts(self) -> torch.Tensor:
        """``[γ + 1]`` rounds that sent 0, 1, …, γ drafted tokens to the target (the scheduler's choices)."""
        at_least = torch.cat([torch.tensor([self.rounds]), self.proposed, torch.zeros(1, dtype=torch.long)])
        return at_least[:-1] - at_least[1:]

    def rows(self) -> list[dict]:
        """One dict per slot k = 1…γ: rounds that verified it with its prefix accepted (``reached``), that accepted
        it, and the conditional and unconditional acceptance (NaN where no round got there)."""
        repeat = self.repeat_rate.tolist() + [math.nan]
        return [{"slot": k + 1, "reached": int(self.reached[k]), "accepted": int(self.accepted_at[k]),
                 "conditional": float(self.conditional[k]), "unconditional": float(self.unconditional[k]),
                 "repeat_next": repeat[k]} for k in range(self.block_size)]

    def table(self):
        """Acceptance by slot as a :class:`dspark.report.Table` (``print`` it, ``display`` it, ``to_frame()`` it)."""
        from dspark.report import Table

        title = (f"{self.rounds} rounds, τ {self.tau:.3f} (tokens committed per target pass), "
                 f"{self.accepted} drafted tokens accepted")
        return Table(self.rows(), [("slot", "slot"), ("reached", "verified, prefix accepted"),
                                   ("accepted", "accepted"), ("conditional", "P(accept | prefix)"),
                                   ("unconditional", "P(accept | verified)"),
                                   ("repeat_next", "next slot repeats token")], title=title)

    def _repr_html_(self) -> str:
        return self.table()._repr_html_()

    def plot(self, ax=None):
        """Conditional and unconditional acceptance by slot (the paper's Figure 2 for these rounds); returns the
        matplotlib axes."""
        import matplotlib.pyplot as plt

        ax = ax if ax is not None else plt.subplots(figsize=(5, 3))[1]
        slots = list(range(1, self.block_size + 1))
        ax.plot(slots, self.conditional.tolist(), "o-", label="given the prefix was accepted")
        ax.plot(slots, self.unconditional.tolist(), "s--", label="given the slot was verified")
        ax.set(xlabel="drafted slot k", ylabel="acceptance", ylim=(0, 1.02), xticks=slots,
               title=f"acceptance by slot (τ = {self.tau:.2f}, {self.rounds} rounds)")
        ax.legend(fontsize="small")
        return ax

    def plot_verify_lengths(self, ax=None):
        """How many drafted tokens the scheduler sent per round, as a bar chart; returns the matplotlib axes."""
        import matplotlib.pyplot as plt

        ax = ax if ax is not None else plt.subplots(figsize=(5, 3))[1]
        counts = self.verify_length_counts.tolist()
        ax.bar(range(len(counts)), counts)
        ax.set(xlabel="drafted tokens sent to the target", ylabel="rounds", xticks=list(range(len(counts))),
               title="verify lengths the scheduler chose")
        return ax

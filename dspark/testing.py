"""Helpers shared by every test (and usable from notebooks): tiny configs, random weights, strict comparisons.

The comparison rules (DESIGN.md "Testing"):
* tokens are compared exactly;
* a float64 implementation is held to the float64 oracle at ``1e-9`` relative: the two differ only in
  summation order, which costs a few ulps times the reduction length;
* a float32 implementation is held to twice the error that plain PyTorch in float32 makes against the
  same float64 oracle (the flash-attention rule), see :func:`assert_within_reference_error`.
"""

from __future__ import annotations

import torch

from dspark.config import DSparkConfig
from dspark.markov import MarkovWeights

FLOAT64_RTOL = 1e-9
FLOAT64_ATOL = 1e-10


def tiny_config(**overrides) -> DSparkConfig:
    """A drafter small enough for loop oracles and the Triton interpreter (odd vocabulary on purpose)."""
    kwargs = dict(
        vocab_size=37,
        hidden_size=12,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=4,
        intermediate_size=20,
        num_target_layers=6,
        target_layer_ids=[0, 2],
        mask_token_id=36,
        block_size=4,
        num_draft_layers=2,
        markov_rank=5,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
    )
    kwargs.update(overrides)
    return DSparkConfig(**kwargs)


@torch.no_grad()
def randomize_(module: torch.nn.Module, seed: int, std: float = 0.5) -> torch.nn.Module:
    """Overwrite every parameter with N(1, 0.1) for norm weights and N(0, std²) otherwise.

    Default initialisations are too small for tests: with 0.02-scale weights the Markov bias or a
    masked-out attention term barely moves the output, and a wrong mask would pass.
    """
    gen = torch.Generator().manual_seed(seed)
    for name, param in module.named_parameters():
        noise = torch.randn(param.shape, generator=gen, dtype=torch.float64)
        value = 1 + 0.1 * noise if "norm" in name else std * noise
        param.copy_(value.to(param.dtype))
    return module


def random_markov_weights(
    head_type: str, vocab: int, draft_vocab: int, rank: int, hidden: int, *, seed: int, dtype=torch.float64
) -> MarkovWeights:
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)

    gated = head_type == "gated"
    rnn = head_type == "rnn"
    return MarkovWeights(
        head_type,
        rand(vocab, rank),
        rand(draft_vocab, rank),
        rand(rank, hidden + rank) if gated else None,
        rand(rank) if gated else None,
        rand(3 * rank, 2 * rank + hidden) / (2 * rank + hidden) ** 0.5 if rnn else None,
        rand(3 * rank) if rnn else None,
    )


def nan_poisoned(*shape, dtype=torch.float32, device="cpu") -> torch.Tensor:
    """An output buffer full of NaN, so any element a kernel forgets to write fails the comparison."""
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


def _describe_mismatch(name: str, actual: torch.Tensor, expected: torch.Tensor, bad: torch.Tensor) -> str:
    idx = tuple(int(i) for i in bad.nonzero()[0])
    diff = (actual.double() - expected.double()).abs()
    return (
        f"{name}: {int(bad.sum())} of {bad.numel()} elements differ; first at {idx}: "
        f"actual {actual[idx].item()!r} expected {expected[idx].item()!r}; "
        f"max abs diff {diff.nan_to_num(float('inf')).max().item():.3e}, shape {tuple(actual.shape)}"
    )


def assert_close(actual: torch.Tensor, expected: torch.Tensor, *, rtol: float, atol: float, name: str = "tensor"):
    """``|a − e| ≤ atol + rtol·|e|`` elementwise, NaN never equal, with a message that says where."""
    if actual.shape != expected.shape:
        raise AssertionError(f"{name}: shape {tuple(actual.shape)} != expected {tuple(expected.shape)}")
    a, e = actual.double().cpu(), expected.double().cpu()
    bad = ~((a - e).abs() <= atol + rtol * e.abs())
    if bool(bad.any()):
        raise AssertionError(_describe_mismatch(name, a, e, bad))


def assert_close_float64(actual: torch.Tensor, expected: torch.Tensor, name: str = "tensor") -> None:
    assert_close(actual, expected, rtol=FLOAT64_RTOL, atol=FLOAT64_ATOL, name=name)


def assert_equal(actual: torch.Tensor, expected: torch.Tensor, name: str = "tokens") -> None:
    if actual.shape != expected.shape:
        raise AssertionError(f"{name}: shape {tuple(actual.shape)} != expected {tuple(expected.shape)}")
    bad = actual.cpu() != expected.cpu()
    if bool(bad.any()):
        raise AssertionError(_describe_mismatch(name, actual.cpu(), expected.cpu(), bad))


def assert_within_reference_error(
    candidate: torch.Tensor,
    baseline: torch.Tensor,
    oracle: torch.Tensor,
    *,
    factor: float = 2.0,
    floor: float = 1e-6,
    name: str = "tensor",
) -> None:
    """The flash-attention rule: ``max|candidate − oracle| ≤ factor · max|baseline − oracle| + floor``.

    ``baseline`` is plain PyTorch in the candidate's precision, ``oracle`` the float64 reference. The
    floor covers the case where the baseline happens to be exact (tiny reductions): a few fp32 ulps of
    the output scale.
    """
    if candidate.shape != oracle.shape:
        raise AssertionError(f"{name}: shape {tuple(candidate.shape)} against the oracle's {tuple(oracle.shape)}")
    if oracle.numel() == 0:
        return
    oracle = oracle.double().cpu()
    err = (candidate.double().cpu() - oracle).abs().nan_to_num(float("inf")).max().item()
    base = (baseline.double().cpu() - oracle).abs().max().item()
    scale = max(oracle.abs().max().item(), 1.0)
    bound = factor * base + floor * scale
    if not err <= bound:
        raise AssertionError(
            f"{name}: max error {err:.3e} against the float64 oracle exceeds {factor}x PyTorch's own error "
            f"({base:.3e}) + floor ({floor * scale:.3e})"
        )


def chi_square_pvalue(counts: torch.Tensor, expected_probs: torch.Tensor) -> float:
    """Pearson goodness-of-fit p-value of observed ``counts`` against ``expected_probs`` (same shape).

    Cells of zero expected probability must be empty (else the p-value is 0: an impossible outcome
    occurred); they add no degrees of freedom.
    """
    counts, probs = counts.double().flatten(), expected_probs.double().flatten()
    n = counts.sum()
    impossible = probs <= 0
    if bool((counts[impossible] > 0).any()):
        return 0.0
    counts, probs = counts[~impossible], probs[~impossible] / probs[~impossible].sum()
    expected = n * probs
    stat = ((counts - expected) ** 2 / expected).sum()
    dof = torch.tensor(float(counts.numel() - 1), dtype=torch.float64)
    return float(torch.special.gammaincc(dof / 2, stat / 2))

"""One output-dtype rule for every tier: floating outputs are float32 for half-precision inputs (every tier
accumulates in float32) and float64 for float64 inputs, whichever backend computed them."""

import pytest
import torch

import dspark
from dspark.markov import MarkovWeights
from tests.kernels.conftest import DEVICE

BACKENDS = ("reference", "torch", "triton")
EXPECTED = {torch.float32: torch.float32, torch.bfloat16: torch.float32, torch.float64: torch.float64}


def _inputs(dtype, requests=2, gamma=3, vocab=37, hidden=16, rank=4):
    gen = torch.Generator().manual_seed(0)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(DEVICE, dtype)

    return dict(requests=requests, gamma=gamma, vocab=vocab, base=rand(requests, gamma, vocab),
                hidden=rand(requests, gamma, hidden), w1=rand(vocab, rank, scale=0.1), w2=rand(vocab, rank, scale=0.1),
                weight=rand(1, hidden + rank, scale=0.25), bias=rand(1),
                prev=torch.randint(0, vocab, (requests, gamma), generator=gen).to(DEVICE),
                uniforms=torch.rand(requests, gamma, generator=gen).to(DEVICE),
                anchors=torch.randint(0, vocab, (requests,), generator=gen).to(DEVICE))


@pytest.mark.parametrize("dtype", EXPECTED, ids=str)
def test_sample_block_probabilities(dtype):
    x = _inputs(dtype)
    weights = MarkovWeights("vanilla", w1=x["w1"], w2=x["w2"])
    for backend in BACKENDS:
        tokens, probs = dspark.sample_block(x["base"], x["hidden"], x["anchors"], x["uniforms"], weights,
                                            temperature=0.8, backend=backend)
        assert probs.dtype == EXPECTED[dtype] and tokens.dtype == torch.long, backend


@pytest.mark.parametrize("dtype", EXPECTED, ids=str)
def test_confidence_survival(dtype):
    x = _inputs(dtype)
    temperatures = torch.full((x["gamma"],), 1.5, device=DEVICE, dtype=dtype)
    for backend in BACKENDS:
        outputs = dspark.confidence_survival(x["hidden"], x["weight"], x["bias"], x["prev"], x["w1"], temperatures,
                                             backend=backend)
        assert [o.dtype for o in outputs] == [EXPECTED[dtype]] * 3, backend

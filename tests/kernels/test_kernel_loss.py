import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from dspark.loss import dspark_loss
from dspark.testing import assert_close, assert_within_reference_error
from tests.kernels.conftest import DEVICE

GRAD_NAMES = ("hidden", "markov_emb", "markov_w2", "confidence_logits")


def _inputs(rows, dim, vocab, rank, seed, with_markov, with_conf, dtype):
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(DEVICE, dtype)

    weights = torch.rand(rows, generator=gen, dtype=torch.float64)
    weights[torch.rand(rows, generator=gen) < 0.2] = 0
    return dict(
        hidden=rand(rows, dim), lm_head=rand(vocab, dim), target_hidden=rand(rows, dim + 1),
        target_lm_head=rand(vocab, dim + 1), labels=torch.randint(0, vocab, (rows,), generator=gen).to(DEVICE),
        weights=weights.to(DEVICE, dtype), markov_emb=rand(rows, rank) if with_markov else None,
        markov_w2=rand(vocab, rank) if with_markov else None,
        confidence_logits=rand(rows) if with_conf else None,
    )


def _run(inputs, backend, chunk_rows=None):
    leaves = {k: (v.clone().requires_grad_() if k in GRAD_NAMES and v is not None else v) for k, v in inputs.items()}
    out = dspark_loss(**leaves, backend=backend, chunk_rows=chunk_rows)
    out.loss.backward()
    values = [out.loss, out.ce, out.l1, out.bce, out.acceptance]
    return values, [leaves[k].grad for k in GRAD_NAMES if leaves[k] is not None]


@given(rows=st.integers(1, 9), dim=st.integers(1, 7), vocab=st.integers(2, 41), rank=st.integers(1, 4),
       with_markov=st.booleans(), with_conf=st.booleans(), chunk=st.sampled_from([None, 1, 4]),
       seed=st.integers(0, 2**31))
def test_loss_kernel_values_and_gradients(rows, dim, vocab, rank, with_markov, with_conf, chunk, seed):
    """fp32 kernel vs float64 oracle, within twice the error of the plain fp32 PyTorch loss."""
    oracle, oracle_grads = _run(_inputs(rows, dim, vocab, rank, seed, with_markov, with_conf, torch.float64),
                                "reference")
    inputs32 = _inputs(rows, dim, vocab, rank, seed, with_markov, with_conf, torch.float32)
    got, got_grads = _run(inputs32, "triton", chunk)
    base, base_grads = _run(inputs32, "torch")
    for name, g, b, o in zip(("loss", "ce", "l1", "bce", "acceptance"), got, base, oracle):
        assert_within_reference_error(g, b, o, name=name, floor=1e-5)
    for name, g, b, o in zip(GRAD_NAMES, got_grads, base_grads, oracle_grads):
        assert_within_reference_error(g, b, o, name=f"grad {name}", floor=1e-5)


@given(rows=st.integers(1, 6), dim=st.integers(1, 7), vocab=st.integers(2, 41), with_markov=st.booleans(),
       chunk=st.sampled_from([None, 2]), seed=st.integers(0, 2**31))
def test_loss_kernel_on_bf16_operands(rows, dim, vocab, with_markov, chunk, seed):
    """bf16 inputs: the kernel runs its vocabulary products in bf16 as the PyTorch path does, so its error
    against the float64 oracle stays within twice PyTorch's own bf16 error (floor: one bf16 ulp, 2^-8, of the
    output scale, for rows where PyTorch happens to round exactly)."""
    oracle, oracle_grads = _run(_inputs(rows, dim, vocab, 2, seed, with_markov, True, torch.float64), "reference")
    inputs16 = _inputs(rows, dim, vocab, 2, seed, with_markov, True, torch.bfloat16)
    got, got_grads = _run(inputs16, "triton", chunk)
    base, base_grads = _run(inputs16, "torch")
    for name, g, b, o in zip(("loss", "ce", "l1", "bce", "acceptance"), got, base, oracle):
        assert_within_reference_error(g, b, o, name=name, floor=2**-8)
    for name, g, b, o in zip(GRAD_NAMES, got_grads, base_grads, oracle_grads):
        assert g.dtype == torch.bfloat16, f"grad {name} came back as {g.dtype}"
        assert_within_reference_error(g, b, o, name=f"grad {name}", floor=2**-8)


def test_chunked_torch_loss_equals_plain():
    inputs = _inputs(11, 5, 17, 3, 0, True, True, torch.float64)
    plain, plain_grads = _run(inputs, "torch")
    chunked, chunked_grads = _run(inputs, "torch", chunk_rows=3)
    for a, b in zip(plain + plain_grads, chunked + chunked_grads):
        assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_loss_kernel_refuses_trainable_lm_head():
    inputs = _inputs(3, 4, 9, 2, 0, False, False, torch.float32)
    inputs["lm_head"].requires_grad_()
    with pytest.raises(ValueError, match="frozen"):
        dspark_loss(**inputs, backend="triton")


@pytest.mark.parametrize("backend", ["reference", "torch", "triton"])
def test_confidence_gradient_at_a_zero_logit_is_sigmoid_minus_target(backend):
    """d BCE / dz = σ(z) − c*: at z = 0 exactly that is 0.5 − c*, in every tier."""
    inputs = _inputs(3, 4, 7, 2, seed=5, with_markov=False, with_conf=True, dtype=torch.float64)
    inputs["confidence_logits"] = torch.zeros(3, dtype=torch.float64, device=DEVICE, requires_grad=True)
    out = dspark_loss(**inputs, ce_weight=0.0, l1_weight=0.0, backend=backend)
    out.loss.backward()
    expected = inputs["weights"] * (0.5 - out.acceptance.to(DEVICE)) / inputs["weights"].sum()
    assert_close(inputs["confidence_logits"].grad, expected, rtol=1e-9, atol=1e-12)

import pytest
import torch
from hypothesis import given

from dspark.attention import block_attention
from dspark.testing import assert_close_float64, assert_within_reference_error
from tests.strategies import attention_inputs


@given(inputs=attention_inputs())
def test_block_attention_matches_reference(inputs):
    out = block_attention(**inputs, backend="torch")
    assert_close_float64(out, block_attention(**inputs, backend="reference"))
    assert bool((out[~inputs["block_valid"]] == 0).all()), "padding blocks must output zeros"


@given(inputs=attention_inputs())
def test_float32_error_is_bounded_by_float32_torch(inputs):
    inputs32 = {k: v.float() if v.is_floating_point() else v for k, v in inputs.items()}
    oracle = block_attention(**inputs, backend="reference")
    out32 = block_attention(**inputs32, backend="torch")
    naive32 = block_attention(**inputs32, backend="reference")
    assert_within_reference_error(out32, naive32, oracle, name="fp32 block attention")


def test_context_at_or_after_ctx_len_is_invisible():
    gen = torch.Generator().manual_seed(0)
    q, k_blk, v_blk = (torch.randn(1, 2, 3, 2, 4, generator=gen) for _ in range(3))
    k_ctx, v_ctx = torch.randn(1, 6, 1, 4, generator=gen), torch.randn(1, 6, 1, 4, generator=gen)
    k_blk, v_blk = k_blk[:, :, :, :1], v_blk[:, :, :, :1]
    ctx_len = torch.tensor([[2, 5]])
    base = block_attention(q, k_ctx, v_ctx, k_blk, v_blk, ctx_len)
    k2, v2 = k_ctx.clone(), v_ctx.clone()
    k2[:, 2:] += 5
    v2[:, 2:] -= 5
    changed = block_attention(q, k2, v2, k_blk, v_blk, ctx_len)
    assert torch.equal(changed[:, 0], base[:, 0])
    assert not torch.allclose(changed[:, 1], base[:, 1])


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda a: a.update(ctx_len=torch.tensor([[7]])), "ctx_len must lie"),
        (lambda a: a.update(k_ctx=torch.zeros(1, 6, 3, 4), v_ctx=torch.zeros(1, 6, 3, 4)), "k_blk"),
        (lambda a: a.update(block_valid=torch.ones(1, 1)), "bool"),
        (lambda a: a.update(q=torch.zeros(1, 1, 2, 2, 5)), "k_ctx"),
    ],
)
def test_bad_attention_input_raises(mutate, message):
    args = dict(q=torch.zeros(1, 1, 2, 2, 4), k_ctx=torch.zeros(1, 6, 1, 4), v_ctx=torch.zeros(1, 6, 1, 4),
                k_blk=torch.zeros(1, 1, 2, 1, 4), v_blk=torch.zeros(1, 1, 2, 1, 4), ctx_len=torch.tensor([[3]]))
    mutate(args)
    with pytest.raises(ValueError, match=message):
        block_attention(**args)

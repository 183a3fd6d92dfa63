import torch
from hypothesis import given
from hypothesis import strategies as st

from dspark.attention import block_attention
from dspark.testing import assert_close_float64, assert_within_reference_error
from tests.kernels.conftest import DEVICE
from tests.strategies import attention_inputs


def _on(inputs, dtype):
    return {k: v.to(DEVICE, dtype) if v.is_floating_point() else v.to(DEVICE) for k, v in inputs.items()}


@given(inputs=attention_inputs())
def test_attention_kernel_matches_reference(inputs):
    oracle = block_attention(**inputs, backend="reference")
    assert_close_float64(block_attention(**_on(inputs, torch.float64), backend="triton"), oracle)
    got = block_attention(**_on(inputs, torch.float32), backend="triton")
    base = block_attention(**_on(inputs, torch.float32), backend="torch")
    assert_within_reference_error(got, base, oracle, name="fp32 block attention")


@given(inputs=attention_inputs(), num_splits=st.integers(2, 4))
def test_attention_kernel_split_context_matches_reference(inputs, num_splits):
    """Split-KV (decode at small batch): each block's context divided among programs whose partial softmax
    states are merged afterwards; splits may be empty or past ``ctx_len``. The launcher picks the count on
    a GPU, so the kernel tier is called with it forced here."""
    from dspark.kernels.attention import _forward

    oracle = block_attention(**inputs, backend="reference")
    args = _on(inputs, torch.float64)
    got, _, _ = _forward(*(args[k] for k in ("q", "k_ctx", "v_ctx", "k_blk", "v_blk", "ctx_len", "block_valid")),
                         inputs["q"].shape[-1] ** -0.5, num_splits=num_splits)
    assert_close_float64(got, oracle)


GRAD_INPUTS = ("q", "k_ctx", "v_ctx", "k_blk", "v_blk")


def _grads(inputs, backend, dtype):
    """Gradients of every floating input under a fixed, position-dependent output gradient."""
    leaves = {k: v.clone().requires_grad_(v.is_floating_point()) for k, v in _on(inputs, dtype).items()}
    out = block_attention(**leaves, backend=backend)
    weight = torch.linspace(-1, 1, out.numel(), dtype=torch.float64).view_as(out).to(out.device, out.dtype)
    total = (out * weight).sum()
    if total.requires_grad:  # the reference returns a constant when every block is padding
        total.backward()
    return [torch.zeros_like(leaves[k]) if leaves[k].grad is None else leaves[k].grad for k in GRAD_INPUTS]


@given(inputs=attention_inputs())
def test_attention_kernel_gradients_match_reference(inputs):
    """The fused backward: fp64 equal to autograd through the reference, fp32 within twice the PyTorch
    module's own fp32 error (its gradients come from autograd through the einsum form)."""
    oracle = _grads(inputs, "reference", torch.float64)
    for name, got, want in zip(GRAD_INPUTS, _grads(inputs, "triton", torch.float64), oracle):
        assert_close_float64(got, want, name=f"grad {name}")
    for name, got, base, want in zip(GRAD_INPUTS, _grads(inputs, "triton", torch.float32),
                                     _grads(inputs, "torch", torch.float32), oracle):
        assert_within_reference_error(got, base, want, name=f"fp32 grad {name}")


@given(inputs=attention_inputs())
def test_attention_kernel_gradients_on_half_precision_operands(inputs):
    """bf16 and fp16: P and dS are rounded to the input dtype before their products (as flash attention's
    backward does), so the error may be twice the module's plus one rounding of that dtype relative to the
    gradient's scale, as for the forward below."""
    oracle = _grads(inputs, "reference", torch.float64)
    for dtype, unit in ((torch.bfloat16, 2.0 ** -8), (torch.float16, 2.0 ** -11)):
        got_all, base_all = _grads(inputs, "triton", dtype), _grads(inputs, "torch", dtype)
        for name, got, base, want in zip(GRAD_INPUTS, got_all, base_all, oracle):
            assert got.dtype == dtype, f"grad {name} came back as {got.dtype}"
            _assert_within_half_precision_error(got, base, want, unit, f"{dtype} grad {name}")


@given(inputs=attention_inputs())
def test_attention_kernel_on_half_precision_operands(inputs):
    """bf16 and fp16 operands go into the products as they are (tensor cores on a GPU), fp32 accumulation;
    under the CPU interpreter, which cannot do half-precision arithmetic, they are upcast after loading.

    Tolerance: the PyTorch module on the same half-precision inputs is the yardstick; the kernel rounds the
    softmax weights to the input dtype before the PV product (as flash attention does), which the module
    does not, so its error against the fp64 oracle may be up to 2× the module's plus one rounding of
    that dtype (2⁻⁸ for bf16, 2⁻¹¹ for fp16, relative to the output's scale).
    """
    oracle = block_attention(**inputs, backend="reference")
    for dtype, unit in ((torch.bfloat16, 2.0 ** -8), (torch.float16, 2.0 ** -11)):
        got = block_attention(**_on(inputs, dtype), backend="triton")
        base = block_attention(**_on(inputs, dtype), backend="torch")
        _assert_within_half_precision_error(got, base, oracle, unit, str(dtype))


def _assert_within_half_precision_error(got, base, oracle, unit: float, name: str) -> None:
    """max|got − oracle| ≤ 2·max|base − oracle| + unit·max|oracle| (module error × 2 + one ulp)."""
    assert got.shape == oracle.shape, f"{name}: shape {tuple(got.shape)} against {tuple(oracle.shape)}"
    if oracle.numel() == 0:
        return
    oracle = oracle.double().cpu()
    allowed = 2 * float((base.double().cpu() - oracle).abs().max()) + unit * (float(oracle.abs().max()) + 1e-30)
    error = float((got.double().cpu() - oracle).abs().max().nan_to_num(float("inf")))
    assert error <= allowed, f"{name}: error {error:.3g} > allowed {allowed:.3g} (module error × 2 + one ulp)"


@given(inputs=attention_inputs(), spare=st.integers(1, 4))
def test_attention_kernel_reads_strided_views(inputs, spare):
    """A decode's context is a view of the first rows of its cache, and q may come out of a transpose: the kernel
    reads them through their strides. Block keys and values that do not share a layout are copied first."""
    oracle = block_attention(**inputs, backend="reference")
    args = _on(inputs, torch.float64)
    batch, ctx, kv_heads, head_dim = args["k_ctx"].shape

    def cache_rows(t):  # [B, ctx + spare, Hkv, D] storage, its first ctx rows
        storage = torch.randn(batch, ctx + spare, kv_heads, head_dim, dtype=t.dtype, device=t.device)
        storage[:, :ctx] = t
        return storage[:, :ctx]

    args["k_ctx"], args["v_ctx"] = cache_rows(args["k_ctx"]), cache_rows(args["v_ctx"])
    args["q"] = args["q"].transpose(2, 3).contiguous().transpose(2, 3)
    args["k_blk"] = torch.cat([args["k_blk"], args["k_blk"]], -1)[..., :head_dim]
    assert_close_float64(block_attention(**args, backend="triton"), oracle)

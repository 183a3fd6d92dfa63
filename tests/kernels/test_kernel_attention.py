import torch
from hypothesis import given

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


@given(inputs=attention_inputs())
def test_attention_kernel_gradients_match_torch(inputs):
    """The backward pass differentiates the PyTorch implementation; check it against autograd on it."""
    def grads(backend):
        leaves = {k: v.clone().requires_grad_(v.is_floating_point()) for k, v in _on(inputs, torch.float64).items()}
        out = block_attention(**leaves, backend=backend)
        (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype, device=out.device).view_as(out)).sum().backward()
        return [leaves[k].grad for k in ("q", "k_ctx", "v_ctx", "k_blk", "v_blk")]

    for got, want in zip(grads("triton"), grads("torch")):
        assert_close_float64(got, want, name="grad")


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
        got = block_attention(**_on(inputs, dtype), backend="triton").double().cpu()
        base = block_attention(**_on(inputs, dtype), backend="torch").double().cpu()
        scale = float(oracle.abs().max()) + 1e-30
        allowed = 2 * float((base - oracle).abs().max()) + unit * scale
        error = float((got - oracle).abs().max())
        assert error <= allowed, f"{dtype}: error {error:.3g} > allowed {allowed:.3g} (module error × 2 + one ulp)"

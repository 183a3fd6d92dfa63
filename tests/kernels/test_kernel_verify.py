from hypothesis import given

from dspark.testing import assert_equal
from dspark.verify import verify
from tests.kernels.conftest import DEVICE
from tests.strategies import verify_inputs

FIELDS = ("num_accepted", "outcome", "next_token", "committed", "num_committed", "finished")


@given(inputs=verify_inputs())
def test_rejection_kernel_matches_reference(inputs):
    want = verify(**inputs, backend="reference")
    moved = {k: v.to(DEVICE) if hasattr(v, "to") else v for k, v in inputs.items()}
    got = verify(**moved, backend="triton")
    for name in FIELDS:
        assert_equal(getattr(got, name), getattr(want, name), name=name)


@given(inputs=verify_inputs())
def test_rejection_kernel_in_float32_matches_torch(inputs):
    """Same fp32 arithmetic as the PyTorch path: identical decisions and tokens."""
    moved = {k: v.to(DEVICE).float() if hasattr(v, "is_floating_point") and v.is_floating_point() else
             (v.to(DEVICE) if hasattr(v, "to") else v) for k, v in inputs.items()}
    got, want = verify(**moved, backend="triton"), verify(**moved, backend="torch")
    for name in FIELDS:
        assert_equal(getattr(got, name), getattr(want, name), name=name)

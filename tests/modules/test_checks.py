import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from dspark._checks import all_finite, check_tensor, check_token_range, check_uniforms

FLOAT_DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]
SPECIALS = [float("nan"), float("inf"), float("-inf")]


def _tensor(size: int, dtype: torch.dtype, seed: int, strided: bool) -> torch.Tensor:
    """Random finite values; ``strided`` gives every other element of a larger tensor (not contiguous)."""
    gen = torch.Generator().manual_seed(seed)
    full = torch.randn(2 * size if strided else size, generator=gen, dtype=torch.float64) * 1e3
    return (full[::2] if strided else full).to(dtype)


@given(size=st.integers(1, 200), dtype=st.sampled_from(FLOAT_DTYPES), seed=st.integers(0, 2**31),
       strided=st.booleans(), special=st.sampled_from(SPECIALS), where=st.floats(0, 1, exclude_max=True))
def test_one_non_finite_element_anywhere_is_found(size, dtype, seed, strided, special, where):
    t = _tensor(size, dtype, seed, strided)
    assert all_finite(t)
    t[int(where * size)] = special
    assert not all_finite(t)
    with pytest.raises(ValueError, match="NaN or Inf"):
        check_tensor("x", t, finite=True)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_the_largest_finite_values_are_finite(dtype):
    info = torch.finfo(dtype)
    t = torch.tensor([info.max, -info.max, info.tiny, -0.0], dtype=dtype)
    assert all_finite(t)
    check_tensor("x", t, finite=True)


def test_empty_and_integer_tensors_are_finite():
    assert all_finite(torch.empty(0, 3))
    assert all_finite(torch.tensor([-(2**62), 2**62]))
    check_tensor("x", torch.empty(0), finite=True)


@given(draws=st.lists(st.floats(allow_nan=True, allow_infinity=True, width=32), min_size=1, max_size=20))
def test_uniforms_are_accepted_exactly_when_every_draw_lies_in_zero_one(draws):
    u = torch.tensor(draws, dtype=torch.float32)
    valid = all(0 <= d < 1 for d in draws)  # false for NaN
    if valid:
        check_uniforms("u", u)
    else:
        with pytest.raises(ValueError, match=r"uniform draws in \[0, 1\)"):
            check_uniforms("u", u)


def test_uniform_boundaries():
    check_uniforms("u", torch.tensor([0.0, -0.0, torch.nextafter(torch.tensor(1.0), torch.tensor(0.0))]))
    check_uniforms("u", torch.empty(0))
    with pytest.raises(ValueError):
        check_uniforms("u", torch.tensor([0.5, 1.0]))


@given(tokens=st.lists(st.integers(-3, 12), min_size=1, max_size=20))
def test_token_range_names_the_range_it_found(tokens):
    t = torch.tensor(tokens)
    if min(tokens) >= 0 and max(tokens) < 10:
        check_token_range("ids", t, 10)
    else:
        with pytest.raises(ValueError, match=rf"\[0, 10\), got range \[{min(tokens)}, {max(tokens)}\]"):
            check_token_range("ids", t, 10)
    check_token_range("ids", t[:0], 10)

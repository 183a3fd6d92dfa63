import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from dspark.linear import SKINNY_ROWS, Linear, few_row_layout, linear, set_skinny_rows, skinny_rows, use_skinny_linears
from dspark.testing import assert_close, assert_close_float64


@pytest.fixture(autouse=True)
def default_layout():
    # The layout is process-wide; these tests are about the default one, whatever ran before them.
    with few_row_layout(SKINNY_ROWS):
        yield


@given(lead=st.lists(st.integers(0, 9), min_size=0, max_size=2), features=st.integers(1, 13),
       outputs=st.integers(1, 11), bias=st.booleans(), seed=st.integers(0, 2**31))
def test_linear_matches_f_linear(lead, features, outputs, bias, seed):
    # Row counts from 0 (an empty verify pass) past SKINNY_ROWS (81 = 9 * 9), so both layouts are covered.
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(*lead, features, generator=gen, dtype=torch.float64)
    weight = torch.randn(outputs, features, generator=gen, dtype=torch.float64)
    b = torch.randn(outputs, generator=gen, dtype=torch.float64) if bias else None
    got = linear(x, weight, b)
    assert_close_float64(got, F.linear(x, weight, b), name="linear")
    assert got.is_contiguous()


@pytest.mark.parametrize("rows", [1, 2, 7, SKINNY_ROWS, SKINNY_ROWS + 1])
def test_linear_on_the_default_targets_head_shape_in_fp32(rows):
    # 576-long dot products in fp32, summed by each layout in its own order: each lands within about
    # eps · Σ|x·w| of the exact value (eps = 1.2e-7, Σ|x·w| ≤ 10 at these scales, so ~1e-6, as measured), so
    # the two differ by at most ~2e-6; 1e-5 absolute leaves a factor of 4 to 5 for other seeds.
    gen = torch.Generator().manual_seed(rows)
    weight = 0.02 * torch.randn(4096, 576, generator=gen)
    x = torch.randn(1, rows, 576, generator=gen)
    assert_close(linear(x, weight), F.linear(x, weight), rtol=1e-5, atol=1e-5, name=f"{rows} rows")


def test_gradients_match_f_linear():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, dtype=torch.float64, generator=gen, requires_grad=True)
    weight = torch.randn(4, 5, dtype=torch.float64, generator=gen, requires_grad=True)
    bias = torch.randn(4, dtype=torch.float64, generator=gen, requires_grad=True)
    upstream = torch.randn(3, 4, dtype=torch.float64, generator=gen)
    got = torch.autograd.grad((linear(x, weight, bias) * upstream).sum(), (x, weight, bias))
    want = torch.autograd.grad((F.linear(x, weight, bias) * upstream).sum(), (x, weight, bias))
    for name, g, w in zip(("x", "weight", "bias"), got, want):
        assert_close_float64(g, w, name=f"grad {name}")


@pytest.mark.parametrize("rows", [1, 2, SKINNY_ROWS, SKINNY_ROWS + 1])
def test_the_setting_routes_each_input_to_its_layout(rows):
    gen = torch.Generator().manual_seed(rows)
    x, weight = torch.randn(rows, 96, generator=gen), torch.randn(40, 96, generator=gen)
    skinny = (weight @ x.T).T.contiguous()
    assert torch.equal(linear(x, weight), skinny if rows <= SKINNY_ROWS else F.linear(x, weight))
    with few_row_layout(0):
        assert skinny_rows() == 0
        assert torch.equal(linear(x, weight), F.linear(x, weight))
    assert skinny_rows() == SKINNY_ROWS


def test_few_row_layout_restores_the_setting_after_an_error():
    with pytest.raises(KeyError), few_row_layout(3):
        raise KeyError("inside")
    assert skinny_rows() == SKINNY_ROWS


@pytest.mark.parametrize("rows", [-1, 2.0, True, None])
def test_set_skinny_rows_refuses_what_is_not_a_row_count(rows):
    with pytest.raises(ValueError, match="rows must be an int"):
        set_skinny_rows(rows)
    assert skinny_rows() == SKINNY_ROWS


def test_mismatched_dtypes_fail_as_in_f_linear():
    with pytest.raises(RuntimeError):
        linear(torch.ones(2, 3, dtype=torch.float64), torch.ones(4, 3))


class _Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)
        self.proj = torch.nn.Linear(4, 4)
        self.head = torch.nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight
        self.custom = _OwnLinear(4, 4)


class _OwnLinear(torch.nn.Linear):
    def forward(self, x):
        return 2 * super().forward(x)


def test_use_skinny_linears_keeps_parameters_ties_hooks_and_keys():
    model = _Tied()
    keys, params = list(model.state_dict()), dict(model.named_parameters())
    seen = []
    model.proj.register_forward_hook(lambda module, args, out: seen.append(out.shape))
    x = torch.randn(3, 4)
    before = model.head(model.proj(x))

    assert use_skinny_linears(model) == 2
    assert type(model.proj) is Linear and type(model.head) is Linear
    assert type(model.custom) is _OwnLinear  # a subclass keeps its own forward
    assert list(model.state_dict()) == keys
    assert all(p is params[name] for name, p in model.named_parameters())
    assert model.head.weight is model.embed.weight
    assert_close(model.head(model.proj(x)), before, rtol=1e-6, atol=1e-6, name="swapped model")
    assert seen == [(3, 4), (3, 4)]
    assert use_skinny_linears(model) == 0

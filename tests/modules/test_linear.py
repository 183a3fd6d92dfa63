import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

import dspark.linear
from dspark.linear import (
    BF16_INVARIANT_ROWS,
    PACKED_BUCKETS,
    SKINNY_ROWS,
    CallRows,
    Linear,
    bf16_call_rows,
    clear_packed_weights,
    describe_layout,
    few_row_layout,
    linear,
    packed_layout_available,
    set_skinny_rows,
    skinny_layout,
    skinny_min_rows,
    skinny_rows,
    use_skinny_linears,
)
from dspark.testing import assert_close, assert_close_float64, assert_within_reference_error

needs_mkl = pytest.mark.skipif(not packed_layout_available(), reason="this torch has no MKL packed GEMM")


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
    with pytest.raises(ValueError, match="min_rows must be an int"):
        set_skinny_rows(4, min_rows=0 if rows is None else rows)
    assert (skinny_rows(), skinny_layout(), skinny_min_rows()) == (SKINNY_ROWS, "transposed", 1)


def test_set_skinny_rows_refuses_unknown_layouts_and_oversized_packed_rows():
    with pytest.raises(ValueError, match="layout must be one of"):
        set_skinny_rows(8, "tiled")
    with pytest.raises(ValueError, match="at most 64 rows"):
        set_skinny_rows(PACKED_BUCKETS[-1] + 1, "packed")
    assert (skinny_rows(), skinny_layout()) == (SKINNY_ROWS, "transposed")


def test_the_packed_layout_without_mkl_is_refused(monkeypatch):
    monkeypatch.setattr(dspark.linear, "packed_layout_available", lambda dtype=torch.float32: False)
    with pytest.raises(ValueError, match="needs a torch built with MKL"):
        set_skinny_rows(8, "packed")
    assert skinny_layout() == "transposed"


@needs_mkl
@given(lead=st.lists(st.integers(0, 9), min_size=0, max_size=2), features=st.integers(1, 40),
       outputs=st.integers(1, 50), bias=st.booleans(), min_rows=st.integers(1, 5), seed=st.integers(0, 2**31))
def test_packed_linear_is_as_accurate_as_f_linear(lead, features, outputs, bias, min_rows, seed):
    # Row counts from 0 to 81, so inputs below min_rows, in every bucket and past the last one are covered; fp32
    # only (other dtypes take F.linear), held to twice F.linear's own error against the float64 product.
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(*lead, features, generator=gen, dtype=torch.float64)
    weight = torch.randn(outputs, features, generator=gen, dtype=torch.float64)
    b = torch.randn(outputs, generator=gen, dtype=torch.float64) if bias else None
    b32 = None if b is None else b.float()
    with torch.no_grad(), few_row_layout(SKINNY_ROWS, "packed", min_rows):
        got = linear(x.float(), weight.float(), b32)
    assert got.shape == (*lead, outputs) and got.dtype == torch.float32 and got.is_contiguous()
    assert_within_reference_error(got, F.linear(x.float(), weight.float(), b32), F.linear(x, weight, b),
                                  name="packed linear")


@needs_mkl
@pytest.mark.parametrize("rows", [2, 3, 4, 7, 8, 9, 33, 64])
def test_packed_linear_on_the_default_targets_head_shape(rows):
    # The same bound as the (W·xᵀ)ᵀ layout's test above: both sum 576 fp32 products in their own order.
    gen = torch.Generator().manual_seed(rows)
    weight = 0.02 * torch.randn(4096, 576, generator=gen)
    bias = torch.randn(4096, generator=gen)
    x = torch.randn(1, rows, 576, generator=gen)
    with torch.no_grad(), few_row_layout(SKINNY_ROWS, "packed"):
        got = linear(x, weight, bias)
    assert_close(got, F.linear(x, weight, bias), rtol=1e-5, atol=1e-5, name=f"{rows} rows packed")


@needs_mkl
def test_packed_layout_routes_inputs_and_keeps_one_copy_per_bucket():
    clear_packed_weights()
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(40, 96, generator=gen)
    calls = []
    real = torch.ops.mkl._mkl_linear

    def spy(x, packed, origin, bias, batch):
        calls.append(tuple(x.shape))
        return real(x, packed, origin, bias, batch)

    with torch.no_grad(), few_row_layout(16, "packed", 3), pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.ops.mkl, "_mkl_linear", spy)
        for rows in (1, 2, 3, 4, 5, 16, 17):
            linear(torch.randn(rows, 96, generator=gen), weight)
        # Below min_rows (1, 2) and above skinny_rows (17): F.linear. 3 and 4 share the bucket of 4.
        assert calls == [(4, 96), (4, 96), (8, 96), (16, 96)]
        assert sorted(dspark.linear._packed[weight]) == [4, 8, 16]
    assert describe_layout(torch.float32) == "(W·xᵀ)ᵀ for up to 64 rows"
    assert describe_layout() == "(W·xᵀ)ᵀ for up to 64 rows, bf16 F.linear in calls of up to 32 rows for up to 64 rows"
    with few_row_layout(16, "packed", 3):
        assert describe_layout() == ("MKL-packed fp32 weights for 3 to 16 rows, oneDNN-packed bf16 weights in calls "
                                     "of up to 32 rows for 3 to 16 rows")
    with few_row_layout(16, "packed"):
        assert describe_layout(torch.float32) == "MKL-packed fp32 weights for 2 to 16 rows"
        assert describe_layout(torch.bfloat16) == ("oneDNN-packed bf16 weights in calls of up to 32 rows for up to 16 "
                                                   "rows")
    clear_packed_weights()
    assert len(dspark.linear._packed) == 0


@needs_mkl
def test_packed_copies_follow_in_place_updates_of_the_weight():
    # An optimiser step or load_state_dict changes the weight in place: a stale packed copy would keep
    # multiplying by the old values.
    gen = torch.Generator().manual_seed(1)
    layer = Linear(32, 24)
    x = torch.randn(5, 32, generator=gen)
    with torch.no_grad(), few_row_layout(SKINNY_ROWS, "packed"):
        before = layer(x)
        layer.weight.mul_(-2.0)
        layer.load_state_dict({"weight": layer.weight * 0.5, "bias": layer.bias + 1})
        after = layer(x)
    assert not torch.allclose(before, after)
    assert_close(after, F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5, name="after update")


@needs_mkl
def test_packed_layout_leaves_inference_tensors_to_f_linear(monkeypatch):
    # Weights made under inference_mode have no version counter to tell an in-place update by.
    with torch.inference_mode():
        weight = torch.randn(12, 8)
        x = torch.randn(5, 8)
    monkeypatch.setattr(torch.ops.mkl, "_mkl_linear", None)  # any packed call would fail
    with few_row_layout(SKINNY_ROWS, "packed"):
        assert torch.equal(linear(x, weight), F.linear(x, weight))


@needs_mkl
def test_packed_layout_leaves_gradients_and_other_dtypes_to_f_linear():
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(6, 8, generator=gen, requires_grad=True)
    weight = torch.randn(5, 8, generator=gen, requires_grad=True)
    with few_row_layout(SKINNY_ROWS, "packed"):
        out = linear(x, weight)
        (grad,) = torch.autograd.grad(out.sum(), x)
        assert_close(grad, weight.sum(0).expand(6, 8), rtol=1e-6, atol=1e-6, name="grad x")
        for dtype in (torch.float16, torch.float64):  # no packed form: F.linear, bit for bit
            got = linear(x.detach().to(dtype), weight.detach().to(dtype))
            assert torch.equal(got, F.linear(x.detach().to(dtype), weight.detach().to(dtype))), dtype
        bf16_grad = x.detach().bfloat16().requires_grad_()
        out = linear(bf16_grad, weight.detach().bfloat16())
        (grad,) = torch.autograd.grad(out.float().sum(), bf16_grad)
    assert torch.equal(grad, weight.detach().bfloat16().sum(0).expand(6, 8))
    assert len(dspark.linear._packed) == 0 or weight not in dspark.linear._packed


needs_onednn_bf16 = pytest.mark.skipif(not packed_layout_available(torch.bfloat16),
                                       reason="this torch or CPU runs no bf16 oneDNN products")


BF16_SETTINGS = [(SKINNY_ROWS, "transposed", 1), (SKINNY_ROWS, "packed", 1)]


@needs_onednn_bf16
@given(lead=st.lists(st.integers(0, 9), min_size=0, max_size=2), features=st.integers(1, 40),
       outputs=st.integers(1, 50), bias=st.booleans(), min_rows=st.integers(1, 5), seed=st.integers(0, 2**31))
def test_packed_bf16_linear_is_the_product_rounded_once(lead, features, outputs, bias, min_rows, seed):
    # The packed copy is multiplied by another oneDNN kernel than F.linear's on some CPUs (on an AMD EPYC, single
    # rows of a few odd shapes such as (25, 33) differ in the last bit; on a Xeon with AMX the two agree bit for
    # bit), so the layout is held to the exact product: at most one bf16 rounding of the output, 2^-8 of the sum
    # of |terms| (a rounding is at most 2^-9 of the result; fp32 sums of at most 40 terms add under 2^-18).
    # Inputs outside the layout's rows (below min_rows, past SKINNY_ROWS) must take F.linear itself; rows 0 to 81
    # cover those, single rows, and inputs cut into several calls.
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(*lead, features, generator=gen).bfloat16()
    weight = torch.randn(outputs, features, generator=gen).bfloat16()
    b = torch.randn(outputs, generator=gen).bfloat16() if bias else None
    with torch.no_grad(), few_row_layout(SKINNY_ROWS, "packed", min_rows):
        got = linear(x, weight, b)
    assert got.shape == (*lead, outputs) and got.dtype == torch.bfloat16 and got.is_contiguous()
    exact = x.double() @ weight.double().T + (0 if b is None else b.double())
    size = x.double().abs() @ weight.double().abs().T + (0 if b is None else b.double().abs())
    error = (got.double() - exact).abs()
    excess = float((error - 2.0 ** -8 * size).max()) if error.numel() else 0.0
    assert excess <= 0, f"the packed product is off by more than one bf16 rounding (by up to {excess:.3g})"
    rows = x.numel() // features
    if not min_rows <= rows <= SKINNY_ROWS:
        assert torch.equal(got, F.linear(x, weight, b))


@needs_onednn_bf16
@pytest.mark.parametrize("setting", BF16_SETTINGS, ids=["F.linear", "packed"])
def test_bf16_rows_do_not_depend_on_the_other_rows(setting):
    # What makes a bf16 verify pass reproduce one-token steps (dspark.runtime.invariant): each row of a product of up to
    # SKINNY_ROWS rows equals that row alone, for the default target's shapes and awkward ones, on any CPU. oneDNN
    # keeps this within the calls bf16_call_rows measures, which differ by CPU and shape ((576, 1536) rounds single
    # rows apart from calls of 2 or more on an AMD EPYC, not on a Xeon; so may odd ones such as (100, 33)); the
    # few-row layouts cut inputs into such calls. Rows of a wide range of magnitudes let a changed summation order
    # show in bf16.
    gen = torch.Generator().manual_seed(3)
    for outputs, features in ((1536, 576), (576, 1536), (49152, 576), (576, 576), (192, 576), (100, 33), (7, 5),
                              (64, 32)):
        weight = (0.02 * torch.randn(outputs, features, generator=gen)).bfloat16()
        x = torch.randn(SKINNY_ROWS, features, generator=gen)
        x = (x * 2.0 ** torch.randint(-8, 9, x.shape, generator=gen)).bfloat16()
        with torch.no_grad(), few_row_layout(*setting):
            alone = torch.cat([linear(row, weight) for row in x.split(1)])
            for rows in (2, 5, 8, 31, 32, 33, 40, 63, 64):
                assert torch.equal(linear(x[:rows], weight), alone[:rows]), (outputs, features, rows)


def _patch_bf16_products(monkeypatch, rounding):
    """Make ``F.linear`` and oneDNN's packed bf16 product multiply rows one by one and then pass the whole call's
    output through ``rounding(out, rows)`` for weights of 33 input features (the other shapes stay as they are)."""
    real_f, real_packed = F.linear, torch.ops.mkldnn._linear_pointwise
    calls = []

    def patched(product):
        def call(x, weight, *args):
            flat = x.reshape(-1, x.shape[-1])  # leading dims are rows, as for both real products
            out = torch.cat([product(row, weight, *args) for row in flat.split(1)])
            if x.shape[-1] == 33:
                calls.append(len(flat))
                out = rounding(out, len(flat))
            return out.reshape(*x.shape[:-1], -1)
        return call

    monkeypatch.setattr(F, "linear", patched(real_f))
    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", patched(real_packed))
    return calls


# Kernels that round some calls of one shape apart, each with the plan bf16_call_rows must measure for it: one that
# rounds calls of 3 rows or more another way (2 rows per call, no padding); one that rounds single rows apart from
# calls of more, as oneDNN does for (576, 1536) on an AMD EPYC (single rows padded to two, 32 rows per call); one
# whose rows take a share of their batch-mates, so nothing but single rows keeps them apart.
UNEVEN_KERNELS = {
    "from 3 rows": (lambda out, rows: out * 1.01 if rows > 2 else out, CallRows(1, 2)),
    "single rows": (lambda out, rows: out * 1.01 if rows == 1 else out, CallRows(2, BF16_INVARIANT_ROWS)),
    "mixing": (lambda out, rows: out + 0.01 * (out.sum(0) - out), CallRows(1, 1)),
}


@needs_onednn_bf16
@pytest.mark.parametrize("kernel", UNEVEN_KERNELS)
@pytest.mark.parametrize("setting", BF16_SETTINGS, ids=["F.linear", "packed"])
def test_bf16_products_are_cut_into_calls_that_keep_rows_apart(setting, kernel, monkeypatch):
    rounding, plan = UNEVEN_KERNELS[kernel]
    calls = _patch_bf16_products(monkeypatch, rounding)
    dspark.linear._measured_call_rows.cache_clear()
    try:
        packed = setting[1] == "packed"
        assert bf16_call_rows(100, 33, packed=packed) == plan
        assert bf16_call_rows(100, 34, packed=packed) == CallRows(1, BF16_INVARIANT_ROWS)
        gen = torch.Generator().manual_seed(5)
        weight = torch.randn(100, 33, generator=gen).bfloat16()
        x = torch.randn(9, 33, generator=gen).bfloat16()
        calls.clear()
        with torch.no_grad(), few_row_layout(*setting):
            alone = torch.cat([linear(row, weight) for row in x.split(1)])
            assert torch.equal(linear(x, weight), alone)
            assert torch.equal(linear(x.reshape(3, 3, 33), weight), alone.reshape(3, 3, -1))
        assert calls and plan.fewest <= min(calls) and max(calls) <= plan.most, calls
    finally:
        dspark.linear._measured_call_rows.cache_clear()


@needs_onednn_bf16
def test_packed_bf16_keeps_one_copy_per_weight_and_follows_updates():
    clear_packed_weights()
    gen = torch.Generator().manual_seed(4)
    layer = Linear(24, 40).bfloat16()
    calls = []
    real = torch.ops.mkldnn._linear_pointwise

    def spy(x, *args):
        calls.append(x.shape[0])
        return real(x, *args)

    # Measured once per shape, before the calls are counted. The plan depends on the CPU: an AMD EPYC keeps 16 rows
    # of this shape apart in one call, a 2-core Xeon with AMX only 2, so 3 rows there go in calls of 2 and 1.
    plan = bf16_call_rows(40, 24, packed=True)
    expected = []
    for rows in (1, 3, 16):
        parts = [rows] if plan.fewest <= rows <= plan.most else [len(p) for p in torch.arange(rows).split(plan.most)]
        expected += [max(part, plan.fewest) for part in parts]
    with torch.no_grad(), few_row_layout(16, "packed", 1), pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.ops.mkldnn, "_linear_pointwise", spy)
        for rows in (1, 3, 16, 17):
            layer(torch.randn(rows, 24, generator=gen).bfloat16())
        assert calls == expected, plan  # single rows included; past skinny_rows: F.linear, no call
        assert list(dspark.linear._packed[layer.weight]) == ["onednn"]
        x = torch.randn(5, 24, generator=gen).bfloat16()
        before = layer(x)
        layer.weight.mul_(-2.0)
        after = layer(x)
    assert not torch.equal(before, after)
    assert torch.equal(after, F.linear(x, layer.weight, layer.bias))
    clear_packed_weights()


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

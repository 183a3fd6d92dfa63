"""Kernel checks on a real GPU at paper scale (V = 151936, r = 256, γ = 7, R up to 256).

Skipped without CUDA. Also runnable without pytest or hypothesis (``python -m tests.gpu.test_gpu_kernels``),
since the lent GPU machine may have neither.

Every sampler draws in fixed point (``dspark.sampling``), so a token is an exact function of the
probabilities it was drawn from. The Markov sampler's fp32 and bf16 probabilities differ from PyTorch's by
rounding (the bias product and the normaliser sum in another order), so there each kernel token is checked
to be exactly the draw of the kernel's *own* probabilities; the rejection sampler's rows are the same
numbers on both paths, so its fp32 decisions and tokens must equal PyTorch's.
"""

from __future__ import annotations

import pytest
import torch

from dspark.attention import block_attention
from dspark.confidence import confidence_survival
from dspark.loss import dspark_loss
from dspark.markov import MarkovWeights, sample_block
from dspark.sampling import sample_from_probs
from dspark.scheduler import SPSTable, allocate_top_k, schedule_greedy
from dspark.testing import assert_close, assert_equal, assert_within_reference_error
from dspark.verify import verify

pytestmark = pytest.mark.gpu
VOCAB, RANK, GAMMA = 151936, 256, 7
CUDA = "cuda"


def _gen(seed=0):
    return torch.Generator(device=CUDA).manual_seed(seed)


def _assert_drawn_from(tokens, probs, uniforms):
    """Each token is the fixed-point inverse-CDF draw of its own row of ``probs`` for its uniform."""
    assert_equal(tokens, sample_from_probs(probs, uniforms.to(probs.dtype)), name="tokens against their own draw")


def _markov_inputs(requests, dtype, seed=0):
    gen = _gen(seed)
    base = torch.randn(requests, GAMMA, VOCAB, generator=gen, device=CUDA) * 3
    w1 = torch.randn(VOCAB, RANK, generator=gen, device=CUDA) * 0.1
    w2 = torch.randn(VOCAB, RANK, generator=gen, device=CUDA) * 0.1
    anchors = torch.randint(0, VOCAB, (requests,), generator=gen, device=CUDA)
    u = torch.rand(requests, GAMMA, generator=gen, device=CUDA)
    hidden = torch.zeros(requests, GAMMA, 1, device=CUDA)
    # Uniforms stay at least fp32: rounded to bf16 some reach 1.0, which is not a draw in [0, 1).
    u = u.to(torch.promote_types(dtype, torch.float32))
    return base.to(dtype), hidden.to(dtype), anchors, u, MarkovWeights("vanilla", w1.to(dtype), w2.to(dtype))


@pytest.mark.parametrize("sampling", [(1.0, None, None), (0.7, 20, 0.8), (0.0, None, None)])
def test_markov_sampler_paper_scale(sampling):
    temperature, top_k, top_p = sampling
    kw = dict(temperature=temperature, top_k=top_k, top_p=top_p)
    args = _markov_inputs(2, torch.float64)
    tokens, probs = sample_block(*args, backend="triton", **kw)
    want_tokens, want_probs = sample_block(*args, backend="torch", **kw)
    assert_equal(tokens, want_tokens, name="fp64 tokens")
    assert_close(probs, want_probs, rtol=1e-9, atol=1e-12, name="fp64 probs")
    for dtype in (torch.float32, torch.bfloat16):
        args = _markov_inputs(64, dtype)
        tokens, probs = sample_block(*args, backend="triton", **kw)
        torch_tokens, torch_probs = sample_block(*args, backend="torch", **kw)
        # Slot k's distribution depends on the token drawn at k − 1, so the paths are comparable up to and
        # including each request's first token flip (a flip is a rounding-level tie, checked below).
        flipped = (tokens != torch_tokens).long().cumsum(-1)
        comparable = torch.cat([torch.zeros_like(flipped[:, :1]), flipped[:, :-1]], -1) == 0
        # bf16 inputs are upcast after load on both paths; fp32 sums of 151936 terms differ by ~1e-6 relative.
        assert_close(probs[comparable], torch_probs[comparable], rtol=1e-4, atol=1e-7, name=f"{dtype} probs")
        if temperature > 0:
            _assert_drawn_from(tokens, probs, args[3])


def test_rejection_sampler_paper_scale():
    gen = _gen(1)
    requests = 256
    draft_probs = torch.softmax(torch.randn(requests, GAMMA, VOCAB, generator=gen, device=CUDA,
                                            dtype=torch.float64), -1)
    target_probs = torch.softmax(torch.randn(requests, GAMMA + 1, VOCAB, generator=gen, device=CUDA,
                                             dtype=torch.float64), -1)
    tokens = torch.multinomial(draft_probs.view(-1, VOCAB), 1, generator=gen).view(requests, GAMMA)
    vlen = torch.randint(0, GAMMA + 1, (requests,), generator=gen, device=CUDA)
    ua = torch.rand(requests, GAMMA, generator=gen, device=CUDA, dtype=torch.float64)
    uf = torch.rand(requests, generator=gen, device=CUDA, dtype=torch.float64)
    got = verify(tokens, draft_probs, target_probs, vlen, ua, uf, eos_token_id=5, backend="triton")
    want = verify(tokens, draft_probs, target_probs, vlen, ua, uf, eos_token_id=5, backend="torch")
    for name in ("num_accepted", "outcome", "next_token", "committed", "num_committed", "finished"):
        assert_equal(getattr(got, name), getattr(want, name), name=name)
    got32 = verify(tokens, draft_probs.float(), target_probs.float(), vlen, ua.float(), uf.float(), backend="triton")
    want32 = verify(tokens, draft_probs.float(), target_probs.float(), vlen, ua.float(), uf.float(), backend="torch")
    for name in ("num_accepted", "outcome", "next_token", "committed", "num_committed", "finished"):
        assert_equal(getattr(got32, name), getattr(want32, name), name=f"fp32 {name}")


@pytest.mark.parametrize("requests", [64, 1])
def test_attention_paper_scale_bf16(requests):
    """R = 64 fills the GPU with (request, kv head) programs; R = 1 splits each context among programs."""
    gen = _gen(2)
    ctx, heads, kv, dim = 2048, 32, 8, 128

    def rand(*shape):
        return torch.randn(*shape, generator=gen, device=CUDA)

    args = dict(q=rand(requests, 1, GAMMA, heads, dim), k_ctx=rand(requests, ctx, kv, dim),
                v_ctx=rand(requests, ctx, kv, dim), k_blk=rand(requests, 1, GAMMA, kv, dim),
                v_blk=rand(requests, 1, GAMMA, kv, dim),
                ctx_len=torch.randint(0, ctx + 1, (requests, 1), generator=gen, device=CUDA))
    as_double = {k: v.double() if v.is_floating_point() else v for k, v in args.items()}
    oracle = block_attention(**as_double, backend="torch")
    got = block_attention(**args, backend="triton")
    base = block_attention(**args, backend="torch")
    assert_within_reference_error(got, base, oracle, name="fp32 attention")
    bf16 = {k: v.bfloat16() if v.is_floating_point() else v for k, v in args.items()}
    # bf16 inputs, fp32 accumulation, bf16 output: one bf16 rounding of the output (2^-8 relative).
    assert_close(block_attention(**bf16, backend="triton"), block_attention(**bf16, backend="torch"),
                 rtol=1e-2, atol=1e-2, name="bf16 attention")


def test_attention_backward_paper_training_shape():
    """The fused backward at a training layout: 64 blocks over one 2048-row context, GQA 32/8, head 128.
    fp32 within twice the module's own error against fp64; bf16 within the module's bf16 error plus one
    bf16 rounding of each gradient's scale (P and dS are rounded to bf16 before their products)."""
    gen = _gen(5)
    blocks, ctx, heads, kv, dim = 64, 2048, 32, 8, 128

    def rand(*shape):
        return torch.randn(*shape, generator=gen, device=CUDA)

    args = dict(q=rand(1, blocks, GAMMA, heads, dim), k_ctx=rand(1, ctx, kv, dim), v_ctx=rand(1, ctx, kv, dim),
                k_blk=rand(1, blocks, GAMMA, kv, dim), v_blk=rand(1, blocks, GAMMA, kv, dim),
                ctx_len=torch.randint(0, ctx + 1, (1, blocks), generator=gen, device=CUDA),
                block_valid=torch.rand(1, blocks, generator=gen, device=CUDA) < 0.9)
    grad_out = rand(*args["q"].shape)
    names = ("q", "k_ctx", "v_ctx", "k_blk", "v_blk")

    def grads(backend, dtype):
        leaves = {k: v.to(dtype).requires_grad_() if k in names else v for k, v in args.items()}
        out = block_attention(**leaves, backend=backend)
        return torch.autograd.grad(out, [leaves[k] for k in names], grad_out.to(dtype))

    oracle = grads("torch", torch.float64)
    for name, g, b, o in zip(names, grads("triton", torch.float32), grads("torch", torch.float32), oracle):
        assert_within_reference_error(g, b, o, name=f"fp32 grad {name}")
    for name, g, b, o in zip(names, grads("triton", torch.bfloat16), grads("torch", torch.bfloat16), oracle):
        assert_within_reference_error(g, b, o, floor=2.0 ** -8, name=f"bf16 grad {name}")


def test_confidence_and_scheduler_paper_scale():
    gen = _gen(3)
    requests, hidden = 256, 2560
    h = torch.randn(requests, GAMMA, hidden, generator=gen, device=CUDA)
    w = torch.randn(1, hidden + RANK, generator=gen, device=CUDA) * 0.02
    w1 = torch.randn(VOCAB, RANK, generator=gen, device=CUDA)
    prev = torch.randint(0, VOCAB, (requests, GAMMA), generator=gen, device=CUDA)
    oracle = confidence_survival(h.double(), w.double(), None, prev, w1.double(), None, backend="torch")
    got = confidence_survival(h, w, None, prev, w1, None, backend="triton")
    base = confidence_survival(h, w, None, prev, w1, None, backend="torch")
    for g, b, o in zip(got, base, oracle):
        assert_within_reference_error(g, b, o)
    survival_conf = got[1]
    sps = SPSTable.linear(1.0, 0.004, requests * (GAMMA + 1))
    for early_stop in (True, False):
        assert_equal(schedule_greedy(survival_conf, sps, early_stop=early_stop, backend="triton"),
                     schedule_greedy(survival_conf, sps, early_stop=early_stop, backend="reference"))
    assert_equal(allocate_top_k(survival_conf, 700, backend="triton"),
                 allocate_top_k(survival_conf, 700, backend="reference"))


def test_loss_paper_vocabulary():
    gen = _gen(4)
    rows, hidden = 64, 256

    def rand(*shape, scale=1.0):
        return torch.randn(*shape, generator=gen, device=CUDA) * scale

    inputs = dict(hidden=rand(rows, hidden), lm_head=rand(VOCAB, hidden, scale=0.05), target_hidden=rand(rows, hidden),
                  target_lm_head=rand(VOCAB, hidden, scale=0.05),
                  labels=torch.randint(0, VOCAB, (rows,), generator=gen, device=CUDA),
                  weights=torch.rand(rows, generator=gen, device=CUDA), markov_emb=rand(rows, RANK, scale=0.1),
                  markov_w2=rand(VOCAB, RANK, scale=0.1), confidence_logits=rand(rows))

    def run(backend, dtype):
        # Fresh leaves every run (copy=True): .to() of an fp32 tensor to fp32 returns the tensor itself, and
        # runs sharing leaves would accumulate into, and then compare, the same .grad tensors.
        leaves = {k: (v.to(dtype, copy=True).requires_grad_()
                      if k in ("hidden", "markov_emb", "markov_w2", "confidence_logits")
                      else (v.to(dtype) if v.is_floating_point() else v)) for k, v in inputs.items()}
        out = dspark_loss(**leaves, backend=backend)
        out.loss.backward()
        return [out.loss, leaves["hidden"].grad, leaves["markov_w2"].grad, leaves["confidence_logits"].grad]

    oracle, got, base = run("torch", torch.float64), run("triton", torch.float32), run("torch", torch.float32)
    for g, b, o in zip(got, base, oracle):
        assert_within_reference_error(g, b, o, floor=1e-5)
    # bf16: the kernel's vocabulary products are the PyTorch path's, in bf16 (one bf16 rounding of slack).
    got, base = run("triton", torch.bfloat16), run("torch", torch.bfloat16)
    for g, b, o in zip(got, base, oracle):
        assert_within_reference_error(g, b, o, floor=2.0 ** -8)


if __name__ == "__main__":
    import sys
    import traceback

    failures = 0
    for name, fn in list(globals().items()):
        if not name.startswith("test_"):
            continue
        params = getattr(fn, "pytestmark", [])
        arg_sets = [p.args[1] for p in params if getattr(p, "name", "") == "parametrize"] or [[None]]
        for arg in arg_sets[0]:
            try:
                fn(arg) if arg is not None else fn()
                print(f"PASS {name}{'' if arg is None else arg}")
            except Exception:
                failures += 1
                print(f"FAIL {name}{'' if arg is None else arg}")
                traceback.print_exc()
    print(f"{failures} failed")
    sys.exit(1 if failures else 0)

"""Kernel vs PyTorch module timings, with achieved bandwidth against the measured peak.

On a GPU (``--device cuda``): ``triton.testing.do_bench`` on each computation at paper scale
(V = 151936, r = 256, γ = 7, R = 1, 16, 64 and 256), bf16 inputs where the op allows, reporting the median
time of the Triton kernel and of the PyTorch module, their ratio, and the bandwidth accounting: the minimum
bytes the op must move at the shape (``min_bytes``), the time that takes at the bandwidth a device copy
reaches on the same card (``floor_ms``), each tier's achieved GB/s, its fraction of that bandwidth and its
time over the floor; and the fused loss's peak memory against the plain PyTorch loss. Each inference op is timed
three ways per tier: as called (``triton``, ``torch``: the public op with its value checks), slim (``*_slim``:
inside ``dspark.trusted_values()``, as the decode loop calls it) and captured (``*_captured``: recorded once as a
CUDA graph and replayed, the device's time without the host's per-call work). On the CPU it times the PyTorch
module against the loop reference at a small shape instead (the Triton interpreter says nothing about
speed). Nothing here asserts a time: results go to ``benchmarks/results/kernels_<device>.json``.

    python benchmarks/bench_kernels.py --device cuda [--out DIR]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.environment import write_result  # noqa: E402
from dspark import trusted_values  # noqa: E402
from dspark.attention import block_attention  # noqa: E402
from dspark.confidence import confidence_survival  # noqa: E402
from dspark.loss import dspark_loss  # noqa: E402
from dspark.markov import MarkovWeights, sample_block  # noqa: E402
from dspark.scheduler import SPSTable, allocate_top_k, schedule_greedy  # noqa: E402
from dspark.verify import verify  # noqa: E402


def timeit(fn, device: str) -> float:
    """Median seconds of ``fn()``: do_bench on CUDA, perf_counter over a few runs on CPU."""
    if device == "cuda":
        import triton.testing

        return triton.testing.do_bench(fn, warmup=10, rep=50) / 1e3
    fn()
    times = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def slim(fn):
    """``fn`` inside ``trusted_values()``, as the decode loop calls the ops: checks of shapes only."""
    def call():
        with trusted_values():
            return fn()
    return call


def captured(fn):
    """``fn`` recorded as a CUDA graph at its first call (after two warm-up calls on a side stream), then replayed."""
    graph = None

    def replay():
        nonlocal graph
        if graph is None:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    fn()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                fn()
        graph.replay()
    return replay


def peak_bandwidth(device: str) -> float:
    """Bytes/s of a 1 GiB device-to-device copy (read + write), the card's practical ceiling."""
    n = 2**28 if device == "cuda" else 2**24
    src = torch.empty(n, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    return 2 * src.numel() * 4 / timeit(lambda: dst.copy_(src), device)


def cases(device: str, requests: int, scale: str):
    """(name, bytes moved at least, {tier: callable}) for each computation."""
    gen = torch.Generator(device=device).manual_seed(0)
    dt = torch.bfloat16 if device == "cuda" else torch.float32
    if scale == "paper":
        vocab, rank, gamma, hidden, heads, kv_heads, head_dim, ctx = 151936, 256, 7, 2560, 32, 8, 128, 2048
    else:
        vocab, rank, gamma, hidden, heads, kv_heads, head_dim, ctx = 211, 8, 7, 32, 4, 2, 8, 48
    tiers = ("triton", "torch") if device == "cuda" else ("torch", "reference")

    def rand(*shape, dtype=dt):
        return torch.randn(*shape, generator=gen, device=device, dtype=torch.float32).to(dtype)

    def uniform(*shape):
        return torch.rand(*shape, generator=gen, device=device)

    el = torch.finfo(dt).bits // 8
    out = []

    # 1. Block attention, inference layout: one block per request over a ctx-row cache.
    q = rand(requests, 1, gamma, heads, head_dim)
    k_ctx, v_ctx = rand(requests, ctx, kv_heads, head_dim), rand(requests, ctx, kv_heads, head_dim)
    k_blk, v_blk = rand(requests, 1, gamma, kv_heads, head_dim), rand(requests, 1, gamma, kv_heads, head_dim)
    ctx_len = torch.full((requests, 1), ctx, device=device)
    moved = (2 * requests * ctx * kv_heads * head_dim + 2 * q.numel()) * el
    out.append(("block_attention", moved, {t: (lambda t=t: block_attention(
        q, k_ctx, v_ctx, k_blk, v_blk, ctx_len, backend=t)) for t in tiers}))

    # 1b. Block attention, training layout, forward + backward: R blocks anchored over one sequence's context,
    # gradients for every input. Its floor: every input and the output gradient read once, every gradient and
    # the output written once.
    qt = rand(1, requests, gamma, heads, head_dim).requires_grad_()
    kt_ctx, vt_ctx = (rand(1, ctx, kv_heads, head_dim).requires_grad_() for _ in range(2))
    kt_blk, vt_blk = (rand(1, requests, gamma, kv_heads, head_dim).requires_grad_() for _ in range(2))
    anchors_at = torch.linspace(1, ctx, requests, device=device).long()[None]
    grad_out = rand(*qt.shape)
    moved = 2 * (2 * qt.numel() + 2 * kt_ctx.numel() + 2 * kt_blk.numel()) * el + qt.numel() * el

    def attention_train(tier):
        def run():
            out = block_attention(qt, kt_ctx, vt_ctx, kt_blk, vt_blk, anchors_at, backend=tier)
            torch.autograd.grad(out, (qt, kt_ctx, vt_ctx, kt_blk, vt_blk), grad_out)
        return run

    out.append(("block_attention_fwd_bwd", moved, {t: attention_train(t) for t in tiers}))

    # 2. Markov block sampler (vanilla; T = 1 and greedy). Its floor: the base logits read once, the draft
    # probabilities written once, and W2 read once per slot for all requests (slot k's bias needs the token
    # of slot k−1, and W2 does not fit on chip at this shape).
    base = rand(requests, gamma, vocab, dtype=torch.float32)
    weights = MarkovWeights("vanilla", rand(vocab, rank) * 0.05, rand(vocab, rank) * 0.05)
    anchors = torch.randint(0, vocab, (requests,), generator=gen, device=device)
    u = uniform(requests, gamma)
    moved = base.numel() * 4 * 2 + gamma * weights.w2.numel() * el
    for name, temperature in (("markov_sample_block", 1.0), ("markov_sample_block_greedy", 0.0)):
        out.append((name, moved, {t: (lambda t=t, temperature=temperature: sample_block(
            base, torch.zeros(requests, gamma, 1, device=device), anchors, u, weights, temperature=temperature,
            backend=t)) for t in tiers}))

    # 3. Confidence + survival.
    h = rand(requests, gamma, hidden)
    w = rand(1, hidden + rank) * 0.02
    prev = torch.randint(0, vocab, (requests, gamma), generator=gen, device=device)
    moved = h.numel() * el + requests * gamma * rank * el
    out.append(("confidence_survival", moved, {t: (lambda t=t: confidence_survival(
        h, w, None, prev, weights.w1, None, backend=t)) for t in tiers}))

    # 4. Scheduler admission (Algorithm 1 and top-K).
    conf = uniform(requests, gamma)
    sps = SPSTable.linear(1.0, 0.01, requests * (gamma + 1))
    moved = conf.numel() * 4
    out.append(("schedule_greedy", moved, {t: (lambda t=t: schedule_greedy(conf, sps, backend=t)) for t in tiers}))
    out.append(("allocate_top_k", moved, {t: (lambda t=t: allocate_top_k(conf, requests * 3, backend=t))
                                         for t in tiers}))

    # 5. Rejection sampler.
    draft_probs = torch.softmax(rand(requests, gamma, vocab, dtype=torch.float32), -1)
    target_probs = torch.softmax(rand(requests, gamma + 1, vocab, dtype=torch.float32), -1)
    tokens = torch.multinomial(draft_probs.view(-1, vocab), 1, generator=gen).view(requests, gamma)
    vlen = torch.randint(0, gamma + 1, (requests,), generator=gen, device=device)
    ua, uf = uniform(requests, gamma), uniform(requests)
    moved = 2 * requests * vocab * 4  # the final draw's rows p_n and q_{n+1}, read once per request
    out.append(("verify", moved, {t: (lambda t=t: verify(tokens, draft_probs, target_probs, vlen, ua, uf,
                                                             backend=t)) for t in tiers}))

    # 6. Loss forward + backward (rows = requests * γ supervised slots).
    rows = requests * gamma
    lm_head = rand(vocab, hidden) * 0.02
    hid = rand(rows, hidden).requires_grad_()
    emb = (rand(rows, rank) * 0.05).requires_grad_()
    w2 = (rand(vocab, rank) * 0.05).requires_grad_()
    z = rand(rows, dtype=torch.float32).requires_grad_()
    target_hidden = rand(rows, hidden)
    labels = torch.randint(0, vocab, (rows,), generator=gen, device=device)
    lw = uniform(rows)

    def loss_fn(tier, chunk_rows=None):
        def run():
            out = dspark_loss(hid, lm_head, target_hidden, lm_head, labels, lw, markov_emb=emb, markov_w2=w2,
                              confidence_logits=z, backend=tier, chunk_rows=chunk_rows)
            out.loss.backward()
        return run

    moved = (lm_head.numel() + w2.numel()) * el * 3  # the projections are read in forward, grad and W2 grad
    loss_tiers = {t: loss_fn(t) for t in tiers}
    if device == "cuda":
        loss_tiers["torch_chunked"] = loss_fn("torch", chunk_rows=256)
    out.append(("dspark_loss_fwd_bwd", moved, loss_tiers))
    return out


def peak_memory(fn, device: str) -> int | None:
    if device != "cuda":
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--requests", type=int, nargs="+", default=None)
    parser.add_argument("--ops", nargs="+", default=None, help="only these computations (default: all)")
    parser.add_argument("--out", type=Path, default=None, help="results directory (default: a scratch directory; "
                        "benchmarks/results updates the tracked ones)")
    args = parser.parse_args(argv)
    device = args.device
    scale = "paper" if device == "cuda" else "small"
    request_counts = args.requests or ([1, 16, 64, 256] if device == "cuda" else [4])
    peak = peak_bandwidth(device)
    rows = []
    for requests in request_counts:
        for name, moved, tiers in cases(device, requests, scale):
            if args.ops and name not in args.ops:
                continue
            # floor_ms: the time the op's minimum traffic takes at the measured copy bandwidth.
            row = {"op": name, "requests": requests, "scale": scale, "min_bytes": moved,
                   "floor_ms": moved / peak * 1e3}
            timed = []
            if device == "cuda" and not name.endswith("_fwd_bwd"):
                plain = dict(tiers)
                tiers.update({f"{tier}_slim": slim(fn) for tier, fn in plain.items()})
                tiers.update({f"{tier}_captured": captured(slim(fn)) for tier, fn in plain.items()})
            for tier, fn in tiers.items():
                try:
                    seconds = timeit(fn, device)
                    mem = peak_memory(fn, device)
                except Exception as error:  # a tier that fails is recorded, and the others still run
                    row[f"{tier}_error"] = f"{type(error).__name__}: {error}"[:2000]
                    print(f"{name:22s} R={requests:4d}  {tier} FAILED: {row[f'{tier}_error'][:300]}", flush=True)
                    continue
                timed.append(tier)
                row[f"{tier}_ms"] = seconds * 1e3
                row[f"{tier}_gbps"] = moved / seconds / 1e9
                row[f"{tier}_peak_fraction"] = moved / seconds / peak
                row[f"{tier}_over_floor"] = seconds * 1e3 / row["floor_ms"]
                if mem is not None:
                    row[f"{tier}_peak_mem_mib"] = mem / 2**20
            fast, slow = ("triton", "torch") if device == "cuda" else ("torch", "reference")
            for way in ("", "_slim", "_captured"):
                if fast + way in timed and slow + way in timed:
                    row[f"speedup_{fast}{way}_over_{slow}{way}"] = row[f"{slow}{way}_ms"] / row[f"{fast}{way}_ms"]
            rows.append(row)
            print(f"{name:22s} R={requests:4d}  " + "  ".join(
                f"{t}={row[f'{t}_ms']:.3f}ms ({row[f'{t}_peak_fraction']:.1%} of peak)" for t in timed), flush=True)
            # Written after every row, so a run cut short still leaves what it measured.
            path = write_result(f"kernels_{'gpu' if device == 'cuda' else 'cpu'}",
                                {"peak_bandwidth_gbps": peak / 1e9, "rows": rows}, args.out)
    print(f"wrote {path}")
    # An op whose PyTorch module reads device values on the host (Algorithm 1's) cannot be captured: its row says
    # why, and that is a finding, not a failure.
    return 1 if any(k.endswith("_error") and not k.endswith("_captured_error") for row in rows for k in row) else 0


if __name__ == "__main__":
    sys.exit(main())

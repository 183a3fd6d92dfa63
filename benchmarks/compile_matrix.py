"""Compile every Triton kernel ahead of time for Hopper and Blackwell, with no GPU: the compile matrix.

For each kernel, the launcher is run on CPU tensors of the paper's shapes (V = 151,936, r = 256, γ = 7,
hidden 4096, 32 query / 8 KV heads of 128, R up to 256) with its ``launch`` intercepted, so the arguments,
constexprs and shape predicate are exactly those it would launch with; then every config of the
architecture's list that the predicate keeps is compiled with ``triton.compile`` for a ``GPUTarget`` of
that architecture (sm_90 Hopper takes the ``sm90`` list; sm_100 B200/GB200 and sm_103 GB300 take ``sm100``).
Per cell: compiled or the compiler's error, dynamic shared memory against the per-block limit, registers
and spill bytes (``ptxas -v`` on the PTX), and which matrix and copy instructions the PTX uses (wgmma,
tcgen05.mma, mma.sync, TMA ``cp.async.bulk.tensor``).

    python benchmarks/compile_matrix.py [--out benchmarks/results]

Nothing is launched; speed stays unclaimed until hardware runs it.

TMA (tensor descriptors) is not used by any kernel yet, so the ``tma`` column is false everywhere. We chose
not to for now: every load is masked by a ragged length (context rows, vocabulary tails, request counts),
device-side descriptors need an allocator hook on both Triton versions we support, and what the matrix
shows holding the kernels back is register pressure and per-request serial scans, not load latency.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# Opt-in shared memory per block: 227 KiB on H100/H200 (sm_90) and on B200/GB200/GB300 (sm_100/sm_103).
ARCHS = {"sm_90": (90, "sm90", 232448), "sm_100": (100, "sm100", 232448), "sm_103": (103, "sm100", 232448)}
KERNEL_MODULES = ("attention", "markov", "confidence", "rejection", "scheduler", "loss")
INSTRUCTIONS = {"wgmma": r"\bwgmma\.mma_async", "tcgen05": r"\btcgen05\.mma", "mma_sync": r"\bmma\.sync",
                "tma": r"cp\.async\.bulk\.tensor"}
# Kernels whose products run through tl.dot on bf16 at these shapes (given their constexprs): they must reach
# the tensor cores. The Markov sampler's probs kernel reads top-k/top-p scratch instead of recomputing the bias,
# and writes a one-hot when greedy; its one-launch slot kernel (R <= 4) multiplies 16-row tiles, which run on
# mma.sync, as wgmma and tcgen05 need 64 rows.
DOT_KERNELS = {"block_attention": lambda c: True, "block_attention_bwd_query": lambda c: True,
               "block_attention_bwd_context": lambda c: True, "markov_stats": lambda c: c["HAS_MARKOV"],
               "markov_probs": lambda c: c["HAS_MARKOV"] and not c["GREEDY"] and not c["SCRATCH"]}


@contextlib.contextmanager
def intercepted_launches(record: list):
    """Every kernel module's ``launch`` records its call instead of launching (the launcher runs on, so a
    launcher of several kernels records each of them; nothing it returns is meaningful)."""
    modules = [importlib.import_module(f"dspark.kernels.{name}") for name in KERNEL_MODULES]
    saved = [m.launch for m in modules]
    attention = importlib.import_module("dspark.kernels.attention")
    saved_smem = attention.shared_memory_bytes

    def capture(name, kernel, grid, args, constexprs, *, device, table, key, fits=lambda c: True, tunable=True,
                config=None):
        # Every config of the table is compiled, whichever one this launch would have run.
        record.append(dict(name=name, kernel=kernel, args=args, constexprs=constexprs, table=table, fits=fits))

    try:
        for m in modules:
            m.launch = capture
        # The launchers' shape predicates see the per-block shared memory of the cards in ARCHS.
        attention.shared_memory_bytes = lambda device: min(limit for _, _, limit in ARCHS.values())
        yield
    finally:
        for m, fn in zip(modules, saved):
            m.launch = fn
        attention.shared_memory_bytes = saved_smem


def _paper_cases():
    """(case name, callable that runs the launcher once) at the paper's shapes."""
    from dspark.kernels import attention, confidence, loss, markov, rejection, scheduler

    from dspark.markov import MarkovWeights
    from dspark.scheduler import SPSTable

    vocab, rank, gamma, hidden = 151936, 256, 7, 4096
    bf16 = dict(dtype=torch.bfloat16)

    def attention_decode():
        requests, context, heads, kv, dim = 64, 4096, 32, 8, 128
        q = torch.empty(requests, 1, gamma, heads, dim, **bf16)
        k_ctx = torch.empty(requests, context, kv, dim, **bf16)
        k_blk = torch.empty(requests, 1, gamma, kv, dim, **bf16)
        attention._forward(q, k_ctx, k_ctx, k_blk, k_blk, torch.full((requests, 1), context),
                           torch.ones(requests, 1, dtype=torch.bool), dim ** -0.5)

    def attention_decode_split():
        context, heads, kv, dim = 4096, 32, 8, 128  # one request: its context split among 8 programs per kv head
        q = torch.empty(1, 1, gamma, heads, dim, **bf16)
        k_ctx = torch.empty(1, context, kv, dim, **bf16)
        k_blk = torch.empty(1, 1, gamma, kv, dim, **bf16)
        attention._forward(q, k_ctx, k_ctx, k_blk, k_blk, torch.full((1, 1), context),
                           torch.ones(1, 1, dtype=torch.bool), dim ** -0.5, num_splits=8)

    def attention_backward():
        blocks, context, heads, kv, dim = 64, 4096, 32, 8, 128  # one training sequence, 64 anchored blocks
        q = torch.empty(1, blocks, gamma, heads, dim, **bf16)
        k_ctx = torch.empty(1, context, kv, dim, **bf16)
        k_blk = torch.empty(1, blocks, gamma, kv, dim, **bf16)
        attention._backward(q, torch.zeros(q.shape), torch.zeros(q.shape[:-1]), q, k_ctx, k_ctx, k_blk, k_blk,
                            torch.full((1, blocks), context), torch.ones(1, blocks, dtype=torch.bool), dim ** -0.5)

    def markov_case(requests, **sampling):
        def run():
            weights = MarkovWeights("vanilla", torch.empty(vocab, rank, **bf16), torch.empty(vocab, rank, **bf16))
            markov.markov_sample_block(torch.empty(requests, gamma, vocab, **bf16), torch.empty(requests, gamma, 8),
                                       torch.zeros(requests, dtype=torch.long), torch.rand(requests, gamma),
                                       weights, **sampling)
        return run

    def confidence_case():
        requests = 256
        confidence.confidence_survival(torch.empty(requests, gamma, hidden, **bf16),
                                       torch.empty(1, hidden + rank, **bf16), torch.zeros(1, **bf16),
                                       torch.zeros(requests, gamma, dtype=torch.long),
                                       torch.empty(vocab, rank, **bf16), torch.ones(gamma))

    def rejection_case():
        requests = 256
        rejection.verify(torch.zeros(requests, gamma, dtype=torch.long), torch.empty(requests, gamma, vocab),
                         torch.empty(requests, gamma + 1, vocab), torch.full((requests,), gamma),
                         torch.rand(requests, gamma), torch.rand(requests), eos_token_id=2)

    def scheduler_case(mode):
        def run():
            conf = torch.rand(256, gamma)
            if mode == "greedy":
                scheduler.schedule_greedy(conf, SPSTable.linear(0.03, 1e-5, 4096))
            else:
                scheduler.allocate_top_k(conf, 512)
        return run

    def loss_case():
        rows, small = 4, 64  # the kernel reads logits rows: its constexprs depend on V only
        h = torch.randn(rows, small, requires_grad=True)
        loss.fused_dspark_loss(h, torch.randn(vocab, small), torch.randn(rows, small), torch.randn(vocab, small),
                               torch.zeros(rows, dtype=torch.long), torch.ones(rows), None, None,
                               torch.zeros(rows, requires_grad=True), torch.tensor(float(rows)),
                               ce_weight=0.1, l1_weight=0.9, confidence_weight=1.0)

    return [("block_attention bf16 decode (R=64, ctx 4096)", attention_decode),
            ("block_attention bf16 decode, split context (R=1, ctx 4096)", attention_decode_split),
            ("block_attention bf16 backward (64 blocks, ctx 4096)", attention_backward),
            ("markov T=1 (R=64)", markov_case(64, temperature=1.0)),
            ("markov T=1 top-k top-p (R=64)", markov_case(64, temperature=1.0, top_k=20, top_p=0.9)),
            ("markov greedy (R=64)", markov_case(64, temperature=0.0)),
            # One request: a slot is one launch of the fused kernel (kernels/markov.py, FUSED_MAX_REQUESTS).
            ("markov T=1 top-k top-p (R=1)", markov_case(1, temperature=1.0, top_k=20, top_p=0.9)),
            ("markov greedy (R=1)", markov_case(1, temperature=0.0)),
            ("confidence (R=256)", confidence_case),
            ("rejection (R=256)", rejection_case),
            ("scheduler Algorithm 1 (R=256)", scheduler_case("greedy")),
            ("scheduler top-K (R=256)", scheduler_case("top_k")),
            ("loss rows, with gradient", loss_case)]


def _signature(kernel, args, constexprs) -> tuple[dict, dict]:
    import triton.language as tl

    names = [p.name for p in kernel.params]
    signature, values = {}, dict(constexprs)
    plain = [p.name for p in kernel.params if not p.is_constexpr]
    for name, arg in zip(plain, args):
        if isinstance(arg, torch.Tensor):
            signature[name] = "*" + {torch.float32: "fp32", torch.float64: "fp64", torch.bfloat16: "bf16",
                                     torch.float16: "fp16", torch.int64: "i64", torch.int32: "i32",
                                     torch.int8: "i8", torch.bool: "i1", torch.uint8: "u8"}[arg.dtype]
        elif isinstance(arg, bool):
            signature[name] = "i1"
        elif isinstance(arg, int):
            signature[name] = "i32" if -2**31 <= arg < 2**31 else "i64"
        elif isinstance(arg, float):
            signature[name] = "fp32"
        else:
            raise TypeError(f"{name}: cannot type {type(arg).__name__}")
    for name in names:
        if name not in signature:
            signature[name] = "constexpr"
    values = {k: v for k, v in values.items() if k in names}
    for k, v in list(values.items()):
        if isinstance(v, torch.dtype):
            values[k] = {torch.float32: tl.float32, torch.float64: tl.float64}[v]
    return signature, values


def _ptxas(ptx: str, arch: int) -> dict:
    import triton

    # Triton's newer bundled ptxas reads the PTX version Triton emits for every target; the older one may not.
    bin_dir = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    binary = bin_dir / "ptxas-blackwell" if (bin_dir / "ptxas-blackwell").exists() else bin_dir / "ptxas"
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx)
        done = subprocess.run([str(binary), "-v", "--gpu-name", f"sm_{arch}a", str(src), "-o", str(Path(tmp) / "k.o")],
                              capture_output=True, text=True)
    text = done.stdout + done.stderr
    regs = re.search(r"Used (\d+) registers", text)
    spills = [int(x) for x in re.findall(r"(\d+) bytes spill (?:stores|loads)", text)]
    return {"registers": int(regs.group(1)) if regs else None, "spill_bytes": sum(spills) if spills else None,
            "ptxas_ok": done.returncode == 0}


def compile_cell(capture: dict, config: dict, arch: str) -> dict:
    """Compile one captured launch with one config for one architecture and read what it became."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    capability, _, smem_limit = ARCHS[arch]
    blocks = {k: v for k, v in config.items() if k not in ("num_warps", "num_stages", "label")}
    signature, constexprs = _signature(capture["kernel"], capture["args"], {**capture["constexprs"], **blocks})
    cell = {"config": {k: v for k, v in config.items() if k != "label"}, "label": config.get("label")}
    try:
        compiled = triton.compile(ASTSource(capture["kernel"], signature, constexprs=constexprs),
                                  target=GPUTarget("cuda", capability, 32),
                                  options=dict(num_warps=config["num_warps"], num_stages=config["num_stages"]))
    except Exception as error:  # the compiler's own message is the result of this cell
        return {**cell, "compiled": False, "error": f"{type(error).__name__}: {str(error)[-400:]}"}
    ptx = compiled.asm["ptx"]
    cell.update(compiled=True, shared_bytes=int(compiled.metadata.shared), shared_limit=smem_limit,
                fits_shared=int(compiled.metadata.shared) <= smem_limit, **_ptxas(ptx, capability),
                instructions={k: bool(re.search(p, ptx)) for k, p in INSTRUCTIONS.items()})
    return cell


def build_matrix(archs=tuple(ARCHS)) -> list[dict]:
    rows = []
    for case, run in _paper_cases():
        record: list = []
        with intercepted_launches(record):
            run()
        if not record:
            raise RuntimeError(f"{case}: the launcher returned without launching")
        captures: dict[str, dict] = {}
        for launched in record:  # a kernel launched once per slot is compiled once
            captures.setdefault(launched["name"], launched)
        for capture, arch in ((c, a) for c in captures.values() for a in archs):
            table = capture["table"]
            configs = [c for c in table.get(ARCHS[arch][1], table["other"]) if capture["fits"](c)]
            for config in configs:
                cell = compile_cell(capture, config, arch)
                rows.append({"kernel": capture["name"], "case": case, "arch": arch,
                             "has_products": DOT_KERNELS.get(capture["name"], lambda c: False)(capture["constexprs"]),
                             **cell})
                status = "ok" if cell["compiled"] else "FAILED"
                extra = (f"{cell.get('registers')} regs, {cell.get('spill_bytes')} B spill, "
                         f"{cell.get('shared_bytes', 0) / 1024:.0f} KiB smem, "
                         + ",".join(k for k, v in cell.get("instructions", {}).items() if v)) if cell["compiled"] \
                    else cell["error"][:200]
                print(f"{arch:7s} {case:45s} {str(cell['config']):60s} {status} {extra}", flush=True)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    import triton

    from benchmarks.environment import write_result

    rows = build_matrix()
    version = ".".join(triton.__version__.split(".")[:2])
    print(write_result(f"compile_matrix_triton{version}", {"triton": triton.__version__, "rows": rows}, args.out))
    return 0 if all(r["compiled"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

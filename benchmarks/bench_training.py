"""Peak training memory and tokens/s: the plain loss against the chunked and the fused (Triton) loss.

Each variant trains the same drafter on the same synthetic features (random target hidden states of the
right shapes: speed and memory do not depend on their values) for a few :class:`dspark.train.trainer.Trainer`
steps, in a fresh process so that peaks do not mix:

* ``plain``: the PyTorch loss with every ``[rows, V]`` fp32 logit tensor alive at once;
* ``chunked``: the PyTorch loss over ``--chunk-rows`` rows at a time, recomputed in backward;
* ``fused``: the Triton loss kernel (GPU only; the CPU interpreter says nothing about speed);
* ``bf16``: the plain loss with ``TrainConfig(precision="bf16")`` (bf16 operands in every product; the other
  variants run in ``precision="auto"``: fp32 on a CPU, bf16 autocast on a GPU);
* ``bf16-vocab``: ``bf16`` with a reduced draft vocabulary of ``--draft-vocab`` tokens (the CPU recipe);
* ``recipe``: ``bf16-vocab`` as ``python -m dspark train`` runs it, after
  :func:`dspark.runtime.machine.tune_cpu_allocator` (speed runs only; its memory run keeps the default allocator).

Peak memory is the process's peak resident set on the CPU (``ru_maxrss``, measured above what it held
before the first step) and ``torch.cuda.max_memory_allocated`` above the same baseline on a GPU.
Tokens/s counts the block slots trained per second (anchors × γ per sequence): the median over timed steps
of each run, then the median over ``--repeats`` runs, the variants taking turns.
On the CPU each variant also runs once for memory, with glibc's mmap threshold fixed low, so that freed
blocks go back to the system and the resident set follows live memory; its speed runs use the default
allocator, as training does (the low threshold turns every large allocation into fresh pages and
slows a step by up to half).

    python benchmarks/bench_training.py --device cpu --scale default   # or --scale recipe
    python benchmarks/bench_training.py --device cuda --scale paper

``--study batching`` measures the step itself at the recipe shape (the ``recipe`` variant) for 1, 4 and 16
sequences per step: ATen ops of one step (counted with a ``TorchDispatchMode``, every op a kernel launch on
a GPU) and block slots/s, for this checkout, for ``--baseline`` (a checkout of the per-sequence step, e.g.
``git worktree add /tmp/per-sequence 2ed17a0``), and for this checkout as 2 gloo ranks under torchrun
(DDP and FSDP2) against 1 process, and for this checkout's step under ``torch.compile``, all in one run:

    python benchmarks/bench_training.py --study batching --baseline /tmp/per-sequence --baseline-commit 2ed17a0
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
if "--checkout" in sys.argv:  # a batching child measuring another checkout imports dspark from there
    sys.path.insert(0, sys.argv[sys.argv.index("--checkout") + 1])

from benchmarks.environment import write_result  # noqa: E402

# default: SmolLM2-135M-Instruct's drafter as the shipped recipe trains it; paper: a Qwen3-8B drafter at
# the DeepSpec recipe's 512 anchors per sequence, the shape of method.md §8's memory pitfall.
SCALES = {
    "default": dict(hidden=576, heads=9, kv_heads=3, intermediate=1536, vocab=49152, target_layers=30, rank=32,
                    anchors=32, sequences=2, seq_len=320),
    # the committed recipe's step (benchmarks/recipes/smollm2_drafter.json), at the corpus's mean length
    "recipe": dict(hidden=576, heads=9, kv_heads=3, intermediate=1536, vocab=49152, target_layers=30, rank=32,
                   anchors=48, sequences=4, seq_len=227, layers=2),
    "paper": dict(hidden=4096, heads=32, kv_heads=8, intermediate=12288, vocab=151936, target_layers=36, rank=256,
                  anchors=512, sequences=1, seq_len=4096),
}


class SyntheticFeatures:
    """Random taps and final hidden states, made once per sequence (so timing excludes their creation)."""

    def __init__(self, seq_len: int, taps: int, hidden: int, count: int):
        gen = torch.Generator().manual_seed(1)
        self.rows = [(torch.randn(seq_len, taps * hidden, generator=gen),
                      torch.randn(seq_len, hidden, generator=gen)) for _ in range(count)]

    def features(self, index, sample):
        return self.rows[index]


def rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


class OpCounter(TorchDispatchMode):
    """Counts the ATen ops that run under it (each one a kernel launch on a GPU)."""

    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def measure(variant: str, scale: str, device: str, steps: int, chunk_rows: int, draft_vocab: int,
            memory_run: bool, sequences: int | None = None, parallel: str = "auto", precision: str | None = None,
            compiled: str | None = None) -> dict:
    """One variant's step: seconds (median of ``steps`` timed steps after a warm-up) and peak memory; with
    ``sequences``, that many per step instead of the scale's, and the ATen ops of one more step (not when
    ``compiled``, ``"default"`` or ``"reduce-overhead"``: ``torch.compile``'s kernels are not ATen ops); with
    ``precision``, that precision instead of the variant's."""
    from dspark import DSparkConfig, DSparkDrafter
    from dspark.runtime.machine import tune_cpu_allocator
    from dspark.train.config import TrainConfig
    from dspark.train.samples import Sample
    from dspark.train.trainer import Trainer

    if variant == "recipe" and device == "cpu" and not memory_run:
        tune_cpu_allocator()

    s = dict(SCALES[scale], **({} if sequences is None else {"sequences": sequences}))
    torch.manual_seed(0)
    taps = [1, s["target_layers"] // 4, s["target_layers"] // 2, 3 * s["target_layers"] // 4, s["target_layers"] - 3]
    config = DSparkConfig(vocab_size=s["vocab"], hidden_size=s["hidden"], num_attention_heads=s["heads"],
                          num_key_value_heads=s["kv_heads"], intermediate_size=s["intermediate"],
                          num_target_layers=s["target_layers"], target_layer_ids=taps, mask_token_id=s["vocab"] - 1,
                          block_size=7, num_draft_layers=s.get("layers", 1), markov_rank=s["rank"],
                          draft_vocab_size=draft_vocab if variant in ("bf16-vocab", "recipe") else None)
    with torch.device(device):  # built in place: initialising paper-scale tables on the CPU takes a minute
        drafter = DSparkDrafter(config)
        with torch.no_grad():
            drafter.init_weights()
    lm_head = torch.randn(s["vocab"], s["hidden"], device=device) * 0.02
    drafter.load_target_embeddings(lm_head.clone(), lm_head)
    gen = torch.Generator().manual_seed(2)
    samples = []
    for _ in range(s["sequences"]):
        ids = torch.randint(s["vocab"] - 1, (s["seq_len"],), generator=gen)
        mask = torch.zeros(s["seq_len"], dtype=torch.bool)
        mask[s["seq_len"] // 8:] = True
        samples.append(Sample(ids, mask))
    source = SyntheticFeatures(s["seq_len"], len(taps), s["hidden"], len(samples))
    backend = "triton" if variant == "fused" else "torch"
    # Only when asked: a checkout from before the engines were an option has no such setting.
    engine = {} if parallel == "auto" else {"parallel": parallel}
    if compiled:
        engine["compile"] = True if compiled == "default" else compiled
    train_config = TrainConfig(steps=steps + 3, num_anchors=s["anchors"], sequences_per_step=s["sequences"],
                               eval_every=0, loss_backend=backend, **engine,
                               precision=precision
                               or ("bf16" if variant in ("bf16", "bf16-vocab", "recipe") else "auto"),
                               loss_chunk_rows=chunk_rows if variant == "chunked" else None)
    trainer = Trainer(drafter, lm_head, source, samples, train_config)
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = rss_bytes()
    trainer.train_step()  # warm-up: kernels compiled, optimiser state allocated
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        trainer.train_step()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    peak = (torch.cuda.max_memory_allocated() if device == "cuda" else rss_bytes()) - base
    slots = s["anchors"] * config.block_size * s["sequences"]
    seconds = statistics.median(times)
    row = {"variant": variant, "scale": scale, "chunk_rows": chunk_rows if variant == "chunked" else None,
           "rows_per_step": slots, "vocab": config.draft_vocab_size, "seconds_per_step": seconds,
           "tokens_per_s": slots / seconds, "peak_bytes_above_start": peak}
    if sequences is not None:
        counter = OpCounter()
        if not compiled:
            with counter:
                trainer.train_step()
        row.update(sequences_per_step=s["sequences"], ops_per_step=None if compiled else counter.ops,
                   precision=train_config.precision, compiled=compiled)
    return row


def run_child(cmd: list[str], env: dict[str, str]) -> dict:
    """One variant in a fresh process (so that peaks do not mix), with ``env`` added to the environment."""
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env})
    if done.returncode:
        raise RuntimeError(done.stderr.strip()[-2000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def batching_study(args) -> None:
    """Ops per step and block slots/s against sequences per step at the recipe shape: this checkout, the
    ``--baseline`` checkout (the per-sequence step), and this checkout under torchrun with 2 gloo ranks."""
    from dspark.runtime.machine import fastest_precision

    checkouts = {"batched": str(ROOT), **({"per-sequence": str(args.baseline)} if args.baseline else {})}
    # The recipe's precision as `python -m dspark train` resolves it here (bf16 is emulated on AVX2-only CPUs).
    child = [sys.executable, __file__, "--variant", "recipe", "--scale", "recipe", "--steps", str(args.steps),
             "--device", args.device, "--precision", fastest_precision(args.device)]
    runs = {}
    for name, path in checkouts.items():
        for n in args.sequences:
            runs[(name, n, "none")] = child + ["--child-sequences", str(n), "--checkout", path]
    # The step under torch.compile at the recipe's batch (compiled once in the warm-up step: every synthetic
    # sequence has the same length, so one length bucket).
    runs[("batched-compiled", 4, "none")] = child + ["--child-sequences", "4", "--compile"]
    if args.device == "cuda":  # and captured into CUDA graphs, one replay a step
        runs[("batched-cuda-graphs", 4, "none")] = child + ["--child-sequences", "4", "--compile", "reduce-overhead"]
    for engine in ("ddp", "fsdp") if args.device == "cpu" else ():
        # One process of 2 threads against 2 processes of 1 thread each (torchrun's default) on the same cores.
        runs[("batched", args.rank_sequences, engine)] = [
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *child[1:],
            "--child-sequences", str(args.rank_sequences), "--parallel", engine]
    rows, speeds = {}, {key: [] for key in runs}
    for _ in range(args.repeats):  # the runs take turns, so that a slow spell falls on all of them alike
        for key, cmd in runs.items():
            row = run_child(cmd, {})
            rows.setdefault(key, row)
            speeds[key].append(row["seconds_per_step"])
    for (name, n, engine), row in rows.items():
        seconds = statistics.median(speeds[(name, n, engine)])
        row.update(step=name, parallel=engine, processes=1 if engine == "none" else 2,
                   seconds_per_step=seconds, seconds_per_step_runs=speeds[(name, n, engine)],
                   tokens_per_s=row["rows_per_step"] / seconds)
        ops = "-" if row["ops_per_step"] is None else f"{row['ops_per_step']:,}"
        print(f"{name:16s} {engine:5s} {n:3d} sequences: {ops:>7s} ops/step {row['tokens_per_s']:8.0f} slots/s",
              flush=True)
    print(write_result(f"training_batching_{args.device}",
                       {"baseline_commit": args.baseline_commit, "rows": list(rows.values())}, args.out))


def child_main(args) -> None:
    """One variant's measurement, printed as JSON (by rank 0 of a torchrun job)."""
    distributed = args.parallel in ("ddp", "fsdp")
    if distributed:
        torch.distributed.init_process_group("gloo")
    row = measure(args.variant, args.scale, args.device, args.steps, args.chunk_rows, args.draft_vocab,
                  args.memory_run, args.child_sequences, args.parallel, args.precision, args.compile)
    if not distributed or torch.distributed.get_rank() == 0:
        print(json.dumps(row), flush=True)
    if distributed:
        torch.distributed.barrier()
        os._exit(0)  # without gloo's teardown, which can abort a rank whose peer is still closing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--study", choices=["loss", "batching"], default="loss",
                        help="loss: the loss variants below; batching: ops and slots/s against sequences per step")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--scale", choices=list(SCALES), default="default")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--chunk-rows", type=int, default=128)
    parser.add_argument("--draft-vocab", type=int, default=16384, help="the bf16-vocab variant's draft vocabulary")
    parser.add_argument("--variants", nargs="+", choices=["plain", "chunked", "fused", "bf16", "bf16-vocab", "recipe"],
                        default=None)
    parser.add_argument("--sequences", nargs="+", type=int, default=[1, 4, 16],
                        help="batching: sequences per step to measure")
    parser.add_argument("--rank-sequences", type=int, default=4, help="batching: the global batch of the 2-rank runs")
    parser.add_argument("--baseline", type=Path, default=None,
                        help="batching: a checkout of the per-sequence step (e.g. a git worktree of an older commit)")
    parser.add_argument("--baseline-commit", default=None, help="batching: the commit that checkout is at")
    parser.add_argument("--variant", default=None, help=argparse.SUPPRESS)  # the child process's one variant
    parser.add_argument("--memory-run", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--checkout", default=None, help=argparse.SUPPRESS)  # read before argparse runs
    parser.add_argument("--child-sequences", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--parallel", default="auto", help=argparse.SUPPRESS)
    parser.add_argument("--precision", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--compile", nargs="?", const="default", choices=["default", "reduce-overhead"],
                        default=None, help=argparse.SUPPRESS)
    parser.add_argument("--repeats", type=int, default=3, help="speed runs per variant, interleaved (median kept)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.variant:
        child_main(args)
        return
    if args.study == "batching":
        batching_study(args)
        return
    variants = args.variants or ["plain", "chunked"] + (["fused"] if args.device == "cuda"
                                                        else ["bf16", "bf16-vocab", "recipe"])
    commands = {v: [sys.executable, __file__, "--variant", v, "--device", args.device, "--scale", args.scale,
                    "--steps", str(args.steps), "--chunk-rows", str(args.chunk_rows),
                    "--draft-vocab", str(args.draft_vocab)] for v in variants}
    rows, speeds = {}, {v: [] for v in variants}
    try:
        if args.device == "cpu":
            for v in variants:
                rows[v] = run_child(commands[v] + ["--memory-run"], {"MALLOC_MMAP_THRESHOLD_": "131072"})
        # Speed children take turns, so that a slow spell of a shared machine falls on every variant alike.
        for _ in range(args.repeats):
            for v in variants:
                row = run_child(commands[v], {})
                rows.setdefault(v, row)
                speeds[v].append(row["seconds_per_step"])
    except RuntimeError as error:
        print(f"failed\n{error}", flush=True)
        raise SystemExit(1) from error
    for v in variants:
        row = rows[v]
        row["seconds_per_step_runs"] = speeds[v]
        row["seconds_per_step"] = statistics.median(speeds[v])
        row["tokens_per_s"] = row["rows_per_step"] / row["seconds_per_step"]
        runs = ", ".join(f"{row['rows_per_step'] / t:.0f}" for t in speeds[v])
        print(f"{v:10s} {row['tokens_per_s']:10.0f} tokens/s (runs: {runs})  "
              f"peak +{row['peak_bytes_above_start'] / 2**20:9.1f} MiB", flush=True)
    rows = list(rows.values())
    print(write_result(f"training_{args.device}_{args.scale}", {"rows": rows}, args.out))


if __name__ == "__main__":
    main()

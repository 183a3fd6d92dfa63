"""Peak training memory and tokens/s: the plain loss against the chunked and the fused (Triton) loss.

Each variant trains the same drafter on the same synthetic features (random target hidden states of the
right shapes: speed and memory do not depend on their values) for a few :class:`dspark.training.Trainer`
steps, in a fresh process so that peaks do not mix:

* ``plain``: the PyTorch loss with every ``[rows, V]`` fp32 logit tensor alive at once;
* ``chunked``: the PyTorch loss over ``--chunk-rows`` rows at a time, recomputed in backward;
* ``fused``: the Triton loss kernel (GPU only; the CPU interpreter says nothing about speed);
* ``bf16``: the plain loss with ``TrainConfig(precision="bf16")`` (bf16 operands in every product; the other
  variants run in ``precision="auto"``: fp32 on a CPU, bf16 autocast on a GPU);
* ``bf16-vocab``: ``bf16`` with a reduced draft vocabulary of ``--draft-vocab`` tokens (the CPU recipe);
* ``recipe``: ``bf16-vocab`` as ``python -m dspark train`` runs it, after
  :func:`dspark.training.tune_cpu_allocator` (speed runs only; its memory run keeps the default allocator).

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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

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


def measure(variant: str, scale: str, device: str, steps: int, chunk_rows: int, draft_vocab: int,
            memory_run: bool) -> dict:
    from dspark import DSparkConfig, DSparkDrafter
    from dspark.training import Sample, TrainConfig, Trainer, tune_cpu_allocator

    if variant == "recipe" and device == "cpu" and not memory_run:
        tune_cpu_allocator()

    s = SCALES[scale]
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
    train_config = TrainConfig(steps=steps + 2, num_anchors=s["anchors"], sequences_per_step=s["sequences"],
                               eval_every=0, loss_backend=backend,
                               precision="bf16" if variant in ("bf16", "bf16-vocab", "recipe") else "auto",
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
    return {"variant": variant, "scale": scale, "chunk_rows": chunk_rows if variant == "chunked" else None,
            "rows_per_step": slots, "vocab": config.draft_vocab_size, "seconds_per_step": seconds,
            "tokens_per_s": slots / seconds,
            "peak_bytes_above_start": peak}


def run_child(cmd: list[str], env: dict[str, str]) -> dict:
    """One variant in a fresh process (so that peaks do not mix), with ``env`` added to the environment."""
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env})
    if done.returncode:
        raise RuntimeError(done.stderr.strip()[-2000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--scale", choices=list(SCALES), default="default")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--chunk-rows", type=int, default=128)
    parser.add_argument("--draft-vocab", type=int, default=16384, help="the bf16-vocab variant's draft vocabulary")
    parser.add_argument("--variants", nargs="+", choices=["plain", "chunked", "fused", "bf16", "bf16-vocab", "recipe"],
                        default=None)
    parser.add_argument("--variant", default=None, help=argparse.SUPPRESS)  # the child process's one variant
    parser.add_argument("--memory-run", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--repeats", type=int, default=3, help="speed runs per variant, interleaved (median kept)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(measure(args.variant, args.scale, args.device, args.steps, args.chunk_rows,
                                 args.draft_vocab, args.memory_run)))
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

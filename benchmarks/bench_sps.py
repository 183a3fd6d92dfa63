"""Target steps per second against verify tokens per step, the SPS table the scheduler plans with (method.md §6.1).

One verify pass with B tokens is ``R`` requests of ``t`` new tokens each (t = γ + 1 = 8 once B ≥ 8, so
B = 8 … 512 is 1 … 64 requests verifying full blocks; B < 8 is one request), every request over its own
KV cache of ``--context`` tokens. Each step runs the target's forward in eager Hugging Face transformers
(sdpa attention), then the cache is cropped back, so every repeat sees the same context. The median of
``--repeats`` timed steps after a warm-up is the latency; SPS = 1 / latency.

* ``--device cpu``: the real default target (SmolLM2-135M-Instruct, fp32) on this machine, in each layout
  ``dspark.linear`` can give few-row products on CPU (``(W · xᵀ)ᵀ``; MKL-packed weights from 2 rows and from 4
  rows, where torch has MKL) and with ``F.linear`` everywhere, passes alternating, so each machine's results
  show what each layout is worth there. Where oneDNN runs bf16 on this CPU, the same target in bf16 follows, up
  to 64 tokens (the batches CPU decoding uses), with invariant attention (``dspark.runtime.invariant``) and
  oneDNN-packed weights or ``F.linear`` (both in calls of at most 32 rows, as ``dspark.linear`` runs bf16), and with
  packed weights and stock attention, which tells what invariance costs.
* ``--device cuda``: random-weight bf16 models of two architectures, SmolLM2-135M and Qwen3-8B (the
  paper's scale). Latency does not depend on weight values, so random weights measure the real curve.

    python benchmarks/bench_sps.py --device cpu [--tag xeon] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.environment import write_result  # noqa: E402
from dspark.linear import SKINNY_ROWS, few_row_layout, packed_layout_available  # noqa: E402

TOKENS_PER_REQUEST = 8
COUNTS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 384, 512]

ARCHITECTURES = {
    "smollm2-135m": dict(model_type="llama", hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True,
                         max_position_embeddings=8192, rope_theta=100000.0),
    "qwen3-8b": dict(model_type="qwen3", hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=151936,
                     tie_word_embeddings=False, max_position_embeddings=40960, rope_theta=1000000.0),
}


def random_model(name: str, device: str, dtype: torch.dtype):
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = dict(ARCHITECTURES[name])
    config = AutoConfig.for_model(spec.pop("model_type"), **spec)
    config._attn_implementation = "sdpa"
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


def layout(count: int) -> tuple[int, int]:
    """(requests, tokens each) for a verify pass of ``count`` tokens."""
    if count < TOKENS_PER_REQUEST:
        return 1, count
    if count % TOKENS_PER_REQUEST:
        raise ValueError(f"token counts from {TOKENS_PER_REQUEST} up must be multiples of {TOKENS_PER_REQUEST}")
    return count // TOKENS_PER_REQUEST, TOKENS_PER_REQUEST


@torch.no_grad()
def profile(model, counts: list[int], context: int, repeats: int, device: str,
            layouts: dict[str, tuple[int, str, int]], attention: dict[str, str] | None = None) -> dict[str, list[dict]]:
    """Rows of latencies per layout; ``layouts`` maps a name to ``dspark.linear.set_skinny_rows`` arguments, and
    ``attention`` (optional) a name to the model's attention implementation for its passes. Within each count the
    layouts' passes alternate, so a machine that drifts during the run slows every layout alike."""
    from transformers import DynamicCache

    vocab = model.config.vocab_size
    gen = torch.Generator(device="cpu").manual_seed(0)
    rows, caches = {name: [] for name in layouts}, {}
    for count in counts:
        requests, tokens = layout(count)
        if requests not in caches:
            caches.clear()  # keep one context batch alive at a time
            cache = DynamicCache()
            prompt = torch.randint(vocab, (requests, context), generator=gen).to(device)
            model(input_ids=prompt, past_key_values=cache, use_cache=True)
            caches[requests] = cache
        cache = caches[requests]
        ids = torch.randint(vocab, (requests, tokens), generator=gen).to(device)
        positions = torch.arange(context, context + tokens, device=device).expand(requests, -1)

        def step(ids=ids, positions=positions, cache=cache, tokens=tokens):
            model(input_ids=ids, position_ids=positions, past_key_values=cache, use_cache=True)
            cache.crop(-tokens)
            if device == "cuda":
                torch.cuda.synchronize()

        times = {name: [] for name in layouts}
        for repeat in range(repeats + 1):  # the first round warms up
            for name, setting in layouts.items():
                if attention:
                    model.set_attn_implementation(attention[name])
                with few_row_layout(*setting):
                    start = time.perf_counter()
                    step()
                    if repeat:
                        times[name].append(time.perf_counter() - start)
        for name in layouts:
            seconds = statistics.median(times[name])
            rows[name].append({"tokens": count, "requests": requests, "tokens_per_request": tokens,
                               "seconds": seconds, "sps": 1.0 / seconds})
        print(f"  B={count:4d} ({requests:3d} × {tokens}): " + ", ".join(
            f"{name} {r[-1]['seconds'] * 1e3:8.2f} ms" for name, r in rows.items()), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--context", type=int, default=None, help="KV tokens per request (cpu 256, cuda 1024)")
    parser.add_argument("--repeats", type=int, default=None, help="timed passes per count (cpu 5, cuda 10)")
    parser.add_argument("--tag", default=None,
                        help="keep another machine's results apart: writes sps_<device>_<tag>.json")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.tag is not None and not re.fullmatch(r"[A-Za-z0-9-]+", args.tag):
        parser.error(f"--tag takes letters, digits and dashes, got {args.tag!r}")
    torch.manual_seed(0)
    profiles = []
    if args.device == "cpu":
        from dspark.runtime.target import load_default_target

        context, repeats = args.context or 256, args.repeats or 5
        target = load_default_target()
        layouts = {"skinny": (SKINNY_ROWS, "transposed", 1), "F.linear": (0, "transposed", 1)}
        if packed_layout_available(torch.float32):
            layouts.update({"packed": (SKINNY_ROWS, "packed", 2), "packed from 4": (SKINNY_ROWS, "packed", 4)})
        print(f"SmolLM2-135M-Instruct (real weights, fp32), context {context}, linear layouts alternating")
        for name, rows in profile(target.model, COUNTS, context, repeats, "cpu", layouts).items():
            skinny_rows, skinny_layout, min_rows = layouts[name]
            profiles.append({"model": "SmolLM2-135M-Instruct", "weights": "real", "dtype": "float32",
                             "context": context, "linear_layout": name, "skinny_rows": skinny_rows,
                             "skinny_layout": skinny_layout, "min_rows": min_rows, "rows": rows})
        if packed_layout_available(torch.bfloat16):
            from dspark.runtime import invariant

            del target
            target = load_default_target(dtype=torch.bfloat16, invariant_attention=True)
            layouts = {"bf16 packed": (SKINNY_ROWS, "packed", 1), "bf16 F.linear": (SKINNY_ROWS, "transposed", 1),
                       "bf16 packed, stock attention": (SKINNY_ROWS, "packed", 1)}
            attention = {name: "sdpa" if "stock" in name else invariant.NAME for name in layouts}
            print(f"SmolLM2-135M-Instruct (real weights, bf16), context {context}, invariant attention unless stock")
            counts = [c for c in COUNTS if c <= SKINNY_ROWS]
            for name, rows in profile(target.model, counts, context, repeats, "cpu", layouts, attention).items():
                skinny_rows, skinny_layout, min_rows = layouts[name]
                profiles.append({"model": "SmolLM2-135M-Instruct", "weights": "real", "dtype": "bfloat16",
                                 "context": context, "linear_layout": name, "attention": attention[name],
                                 "skinny_rows": skinny_rows, "skinny_layout": skinny_layout, "min_rows": min_rows,
                                 "rows": rows})
    else:
        context, repeats = args.context or 1024, args.repeats or 10
        for name in ARCHITECTURES:
            model = random_model(name, "cuda", torch.bfloat16)
            print(f"{name} (random weights, bf16), context {context}")
            rows = profile(model, COUNTS, context, repeats, "cuda", {"F.linear": (0, "transposed", 1)})["F.linear"]
            profiles.append({"model": name, "weights": "random", "dtype": "bfloat16", "context": context,
                             "rows": rows})
            del model
            torch.cuda.empty_cache()
    name = f"sps_{args.device}" + (f"_{args.tag}" if args.tag else "")
    print(write_result(name, {"tokens_per_request": TOKENS_PER_REQUEST, "profiles": profiles},
                       args.out))


if __name__ == "__main__":
    main()

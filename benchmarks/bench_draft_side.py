"""What the draft side of one decode round costs, dynamic, static and captured, against a target step.

The draft side is every call a round makes besides the target's pass: uniform draws, drafter forward → Markov
block sampler → confidence, the scheduler, and the rejection sampler over the pass's logits. It is called here
exactly as ``SpeculativeDecoder`` calls it, back to back ``--iterations`` times with the device synchronised only
at both ends, so the wall time per call is what a round pays, host and device together (on a GPU at small
batch, mostly the host's launches). Modes:

* ``dynamic``: ``graphs="off"`` with fixed-width verification, the shapes following the round;
* ``static``: ``graphs="eager"``, the static shapes run op by op;
* ``captured``: ``graphs="captured"``, two CUDA graph replays and the scheduler (GPU only).

Against: the target's pass of the same round (γ + 1 tokens a request over ``--context`` tokens of KV cache,
through Hugging Face's eager forward, timed the same way), and the pass's floor, the target's weights read once
at the card's copy bandwidth. ``--scale paper``: a random-weight Qwen3-8B target (bf16) and a DSpark drafter of
the paper's shapes (5 layers of the target's width, Markov rank 256, γ = 7, the full 151,936-token vocabulary).
``--scale small``: a 4-layer toy of the same structure, for a dry run on a CPU. Results go to
``draft_side_<device>.json``.

    python benchmarks/bench_draft_side.py --device cuda [--requests 1 16 64 256] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_kernels import peak_bandwidth  # noqa: E402
from benchmarks.environment import write_result  # noqa: E402
from dspark import DSparkDrafter, trusted_values  # noqa: E402
from dspark.runtime.decoding import SamplingConfig, SpeculativeDecoder  # noqa: E402
from dspark.runtime.target import TargetModel  # noqa: E402
from dspark.scheduler import FixedLength  # noqa: E402

GAMMA = 7
MODES = {"dynamic": "off", "static": "eager", "captured": "captured"}


def build(scale: str, device: str) -> tuple[TargetModel, DSparkDrafter]:
    """A random-weight target and a random drafter of its shapes (see the module docstring)."""
    torch.manual_seed(0)
    if scale == "paper":
        from benchmarks.bench_sps import random_model

        dtype, layers, rank = torch.bfloat16, 5, 256
        target = TargetModel(random_model("qwen3-8b", device, dtype))
    else:
        from benchmarks.bench_round_counts import build as toy

        dtype, layers, rank = torch.float32, 2, 32
        target, _ = toy()
    drafter = DSparkDrafter(target.drafter_config(block_size=GAMMA, num_draft_layers=layers, markov_rank=rank,
                                                  enable_confidence_head=True, confidence_head_with_markov=True))
    drafter.load_target_embeddings(target.embed_weight(), target.lm_head_weight())
    return target, drafter.to(device=device, dtype=dtype).eval()


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def per_call(fn, iterations: int, device: str) -> float:
    """Seconds per call of ``fn`` over ``iterations`` back-to-back calls, after two that warm up."""
    for _ in range(2):
        fn()
    synchronize(device)
    start = time.perf_counter()
    for _ in range(iterations):
        fn()
    synchronize(device)
    return (time.perf_counter() - start) / iterations


def draft_side(decoder: SpeculativeDecoder, logits: torch.Tensor, valid_len: torch.Tensor):
    """One round's calls besides the target's pass, as ``SpeculativeDecoder.step`` makes them."""
    num, gamma = len(decoder.active), decoder.gamma
    with trusted_values():
        draft = decoder._draft(decoder._uniforms(num, gamma, dtype=decoder.dtype))
        verify_len = decoder.scheduler(draft.confidence, valid_len)
        return decoder._verify_round(logits, draft, verify_len, gamma, decoder._verify_draws(num, gamma, logits.dtype))


def target_pass(target: TargetModel, requests: int, context: int, device: str):
    """A function running the target's verify pass (γ + 1 tokens a request over ``context`` cached tokens) and
    rolling its cache back, so it can be called again."""
    from transformers import DynamicCache

    gen = torch.Generator().manual_seed(requests)
    cache = DynamicCache()
    with torch.no_grad():
        target.model(input_ids=torch.randint(target.vocab_size, (requests, context), generator=gen).to(device),
                     past_key_values=cache, use_cache=True)
    ids = torch.randint(target.vocab_size, (requests, GAMMA + 1), generator=gen).to(device)
    positions = torch.arange(context, context + GAMMA + 1, device=device).expand(requests, -1)

    @torch.no_grad()
    def run():
        target.model(input_ids=ids, position_ids=positions, past_key_values=cache, use_cache=True)
        cache.crop(-(GAMMA + 1))
    return run


def measure(target, drafter, requests: int, context: int, modes: list[str], iterations: int, device: str,
            floor_s: float) -> dict:
    gen = torch.Generator().manual_seed(requests)
    prompts = torch.randint(target.vocab_size - 1, (requests, context), generator=gen).tolist()
    config = SamplingConfig(max_new_tokens=4 * GAMMA, temperature=1.0, eos_token_id=target.vocab_size - 1)
    dtype = next(target.model.parameters()).dtype
    logits = torch.randn(requests, GAMMA + 1, target.vocab_size, generator=gen).to(device, dtype)
    valid_len = torch.full((requests,), GAMMA, device=device)
    row = {"requests": requests, "context": context}
    row["target_pass_ms"] = 1e3 * per_call(target_pass(target, requests, context, device), iterations, device)
    row["target_floor_ms"] = 1e3 * floor_s
    for mode in modes:
        decoder = SpeculativeDecoder(target, drafter, config, scheduler=FixedLength(GAMMA), backend="auto",
                                     fixed_width=True, graphs=MODES[mode])
        decoder.start(prompts)
        decoder.step()  # a real round first: the caches hold a round's rows, the kernels are compiled
        seconds = per_call(lambda decoder=decoder: draft_side(decoder, logits, valid_len), iterations, device)
        row[mode] = {"draft_side_ms": 1e3 * seconds, "graph_mode": decoder.graph_mode,
                     "of_target_pass": 1e3 * seconds / row["target_pass_ms"],
                     "of_target_floor": seconds / floor_s}
        print(f"R={requests:3d} {mode:8s}: draft side {1e3 * seconds:8.3f} ms = "
              f"{row[mode]['of_target_pass']:.3f} target passes ({row['target_pass_ms']:.2f} ms), "
              f"{row[mode]['of_target_floor']:.3f} of the weight-read floor ({1e3 * floor_s:.2f} ms)", flush=True)
        del decoder
        if device == "cuda":
            torch.cuda.empty_cache()
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    parser.add_argument("--scale", choices=["paper", "small"], default=None, help="paper on cuda, small on cpu")
    parser.add_argument("--requests", type=int, nargs="+", default=[1, 16, 64, 256])
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=None,
                        help="default: all three on cuda, dynamic and static on cpu")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda, but torch sees no GPU")
    scale = args.scale or ("paper" if args.device == "cuda" else "small")
    modes = args.modes or (list(MODES) if args.device == "cuda" else ["dynamic", "static"])
    target, drafter = build(scale, args.device)
    weight_bytes = sum(p.numel() * p.element_size() for p in target.model.parameters())
    floor_s = weight_bytes / peak_bandwidth(args.device)
    rows = [measure(target, drafter, r, args.context, modes, args.iterations, args.device, floor_s)
            for r in args.requests]
    path = write_result(f"draft_side_{args.device}", {
        "scale": scale, "weights": "random", "gamma": GAMMA, "drafter_config": drafter.config.to_dict(),
        "target_weight_bytes": weight_bytes, "iterations": args.iterations, "rows": rows}, args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

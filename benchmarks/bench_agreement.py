"""Why decoding accepts the first drafted slot less often than training's evaluation scores it: the same drafter
at the same anchors.

The trained drafter decodes held-out prompts greedily with every slot verified (each evaluation domain from
``--offset``, and held-out ShareGPT prompts: the last of the recipe's pool, which training evaluates on), with the
fp32 target, so that decoding's cached context and one full forward over the decoded text differ only by
rounding. Every drafted block is recorded, then the drafter is teacher-forced over the decoded text
(``dspark.train.features.teacher_forced_tokens``). Reported per group:

* ``agreement``: the share of drafted slots equal to teacher forcing's argmax at the same anchor, fed the drafted
  tokens before them. 1 means decoding drafts exactly what training scores.
* ``teacher_forced_slot1_all``: slot-1 accuracy at every position of the decoded answers, what training's held-out
  evaluation averages (over the target's own answers).
* ``teacher_forced_slot1_at_rounds``: slot-1 accuracy at the anchors decoding drafted from.
* ``decoded_slot1``: the share of rounds whose first drafted slot was accepted.

A round starts where the previous one stopped: after a rejection, at the token the drafter just got wrong, or
after a fully accepted block. If the first two accuracies differ, that is where rounds start, not a difference
between training and decoding. Writes ``agreement_cpu.json``.

    python benchmarks/bench_agreement.py [--prompts-per-group 8] [--max-new-tokens 64] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from tqdm.auto import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.environment import write_result  # noqa: E402
from dspark.demo import describe_drafter  # noqa: E402
from dspark.files.checkpoint import find_default_drafter  # noqa: E402
from dspark.runtime.decoding import SamplingConfig, SpeculativeDecoder  # noqa: E402
from dspark.runtime.prompts import DOMAINS, load_prompts  # noqa: E402
from dspark.runtime.target import load_default_target  # noqa: E402
from dspark.train.corpus import corpus_order  # noqa: E402
from dspark.train.features import target_features, teacher_forced_tokens  # noqa: E402
from dspark.train.pools import load_training_prompts

HELD_OUT = 48  # the recipe's held-out sequences: the last of its pool in corpus order


def measure(target, drafter, prompts: list[list[int]], max_new_tokens: int) -> dict:
    """The four accuracies of one group of prompts, decoded one at a time (see the module docstring)."""
    counts = {"slots": 0, "agree": 0, "rounds": 0, "round_hits": 0, "accepted": 0, "positions": 0, "hits": 0}
    gamma = drafter.config.block_size
    for prompt in tqdm(prompts, desc="prompts", leave=False):
        decoder = SpeculativeDecoder(target, drafter, SamplingConfig(temperature=0.0, max_new_tokens=max_new_tokens),
                                     record_drafts=True).start([prompt])
        while not decoder.finished:
            decoder.step()
        sequence = torch.tensor(prompt + decoder.out[0])
        taps, _ = target_features(target, sequence)
        anchors = torch.cat([positions for _, positions, _ in decoder.drafts])
        blocks = torch.cat([tokens for _, _, tokens in decoder.drafts])
        replayed = teacher_forced_tokens(drafter, sequence, taps, anchors, blocks[:, :-1])
        counts["slots"] += blocks.numel()
        counts["agree"] += int((replayed == blocks).sum())
        first = sequence[(anchors + 1).clamp(max=len(sequence) - 1)]
        inside = anchors + 1 < len(sequence)
        counts["rounds"] += int(inside.sum())
        counts["round_hits"] += int(((replayed[:, 0] == first) & inside).sum())
        counts["accepted"] += int(((blocks[:, 0] == first) & inside).sum())
        # Every answer token with a next one as the anchor, fed the true tokens, as training's evaluation does.
        every = torch.arange(len(prompt), len(sequence) - 1)
        truth = sequence[(every[:, None] + torch.arange(1, gamma + 1)).clamp(max=len(sequence) - 1)]
        guessed = teacher_forced_tokens(drafter, sequence, taps, every, truth[:, :-1])
        counts["positions"] += len(every)
        counts["hits"] += int((guessed[:, 0] == truth[:, 0]).sum())
    return {"prompts": len(prompts), "drafted_slots": counts["slots"], "rounds": counts["rounds"],
            "agreement": counts["agree"] / counts["slots"],
            "teacher_forced_slot1_all": counts["hits"] / counts["positions"],
            "teacher_forced_slot1_at_rounds": counts["round_hits"] / counts["rounds"],
            "decoded_slot1": counts["accepted"] / counts["rounds"]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts-per-group", type=int, default=8)
    parser.add_argument("--offset", type=int, default=50, help="first prompt index of each evaluation domain")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.prompts_per_group < 1 or args.prompts_per_group > HELD_OUT:
        parser.error(f"--prompts-per-group must lie in [1, {HELD_OUT}]")
    target = load_default_target()
    drafter = find_default_drafter(target)
    if drafter is None:
        raise SystemExit("no trained drafter found: run `python -m dspark train` first")
    n = args.prompts_per_group
    pool = load_training_prompts(None)
    groups = {d: [p.text for p in load_prompts(d)[args.offset: args.offset + n]] for d in DOMAINS}
    groups["sharegpt-held-out"] = [pool[i] for i in corpus_order(len(pool))[-HELD_OUT:][:n]]
    rows = []
    for name, texts in groups.items():
        row = {"group": name, **measure(target, drafter, [target.encode_chat(t) for t in texts], args.max_new_tokens)}
        rows.append(row)
        print(f"{name:17s} agreement {row['agreement']:.4f}  slot 1: teacher-forced everywhere "
              f"{row['teacher_forced_slot1_all']:.3f}, at the rounds' anchors "
              f"{row['teacher_forced_slot1_at_rounds']:.3f}, decoded {row['decoded_slot1']:.3f}", flush=True)
    print(write_result("agreement_cpu", {"drafter": describe_drafter(drafter), "max_new_tokens": args.max_new_tokens,
                                         "offset": args.offset, "dtype": "float32", "rows": rows}, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

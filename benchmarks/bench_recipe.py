"""The training recipe's record: the corpus, regeneration speed, draft-vocabulary coverage, each arm's wall-clock
per phase and its held-out τ_prob against the answer tokens it had seen.

Reads what ``python -m dspark train --config benchmarks/recipes/smollm2_drafter.json`` (and ``--objective dflash`` /
``eagle3``, and ``--ce-weight 1 --l1-weight 0``) wrote: the trained drafters (``benchmarks.trained``: cached, else
committed), whose metadata holds the run, and the corpus's ``corpus.json``. The corpus was answered in other
sessions, on a machine whose speed varies from day to day, so regeneration is also timed here: the same bf16
target answers ``--regen-prompts`` pool prompts in batches of the corpus's size (feature capture and writes
included, to a scratch folder), in the same run as plain batch-1 generation on a few held-out prompts. Writes
``training_recipe.json``.

    python benchmarks/bench_recipe.py [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.environment import write_result  # noqa: E402
from benchmarks.trained import trained_at, trained_drafters  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", type=Path, default=Path(__file__).parent / "recipes" / "smollm2_drafter.json")
    parser.add_argument("--batch1-prompts", type=int, default=3)
    parser.add_argument("--regen-prompts", type=int, default=64,
                        help="pool prompts answered here, beside batch-1 generation (default: one batch of 64)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    from dspark.runtime.decoding import SamplingConfig, generate
    from dspark.runtime.prompts import load_prompt_mix
    from dspark.runtime.target import cache_root, load_default_target
    from dspark.train.corpus import build_corpus, load_corpus
    from dspark.train.pools import PoolSpec, load_training_prompts

    recipe = json.loads(args.recipe.read_text(encoding="utf-8"))
    arms = {}
    for objective, directory in trained_drafters().items():
        meta = json.loads((directory / "config.json").read_text(encoding="utf-8"))["metadata"]
        pool_sequences = [k for k in meta if k.endswith("_sequences")]  # each pool's, and the ShareGPT ones
        arms[objective] = {k: meta.get(k) for k in (*pool_sequences, "steps", "train_answer_tokens",
                                                     "vocab", "curve", "final", "sts")}
        arms[objective]["run"] = meta.get("run")
        arms[objective]["directory"] = str(directory)
        # Results measured before this used an earlier drafter.
        arms[objective]["written_at"] = trained_at(directory)
    if not arms:
        raise SystemExit("no trained drafters: run `python -m dspark train --config ...` first")
    corpus_dir = cache_root() / "training" / f"corpus-bf16-{recipe.get('max_new_tokens', 192)}"
    corpus = json.loads((corpus_dir / "corpus.json").read_text(encoding="utf-8"))
    runs = corpus["runs"]
    answered = sum(r["answer_tokens"] for r in runs)
    seconds = sum(r["seconds"] for r in runs)
    # The corpus as it is on disk; runs interrupted before the manifest recorded them after every batch left
    # samples but no time, so the speed below is over the timed runs only.
    samples = load_corpus(corpus_dir)
    corpus_tokens = sum(int(s.loss_mask.sum()) for s in samples)
    target = load_default_target(dtype=torch.bfloat16)
    prompts = [target.encode_chat(p.text) for p in load_prompt_mix(1)[: args.batch1_prompts]]
    config = SamplingConfig(max_new_tokens=64, temperature=0.0)
    # The first call pays one-time allocation and dispatch costs that the long regeneration runs amortise.
    generate(target, prompts[:1], SamplingConfig(max_new_tokens=8, temperature=0.0))
    plain = [generate(target, [p], config) for p in prompts]
    batch1 = sum(r.new_tokens for r in plain) / sum(r.seconds for r in plain)
    with tempfile.TemporaryDirectory() as scratch:
        here = build_corpus(target, load_training_prompts(), scratch, max_new_tokens=recipe.get("max_new_tokens", 192),
                            batch_size=runs[-1]["batch_size"], max_samples=args.regen_prompts, progress=False)
    regeneration = {"answer_tokens": corpus_tokens, "samples": len(samples), "timed_answer_tokens": answered,
                    "seconds": seconds, "tokens_per_s": answered / seconds,
                    "batch_size": runs[-1]["batch_size"], "runs": runs, "settings": corpus["settings"],
                    "batch1_generate_tokens_per_s": batch1, "speedup_over_batch1": answered / seconds / batch1,
                    "same_run": {"prompts": here.samples_written, "answer_tokens": here.answer_tokens,
                                 "seconds": here.seconds, "tokens_per_s": here.tokens_per_second,
                                 "batch_size": runs[-1]["batch_size"],
                                 "speedup_over_batch1": here.tokens_per_second / batch1},
                    "note": "tokens/s over whole timed runs (prefill, decoding, feature capture and writes), bf16 "
                            "target; runs may have shared the CPU with other work"}
    extra = {f"{name}_corpus": pool_corpus(PoolSpec.from_dict(name, pool).corpus_dir(corpus_dir))
             for name, pool in recipe.get("pools", {}).items()}
    print(f"corpus: {len(samples)} samples, {corpus_tokens} answer tokens; regeneration: {answered} answer tokens "
          f"of timed runs in {seconds:.0f} s = {answered / seconds:.0f} tok/s "
          f"({answered / seconds / batch1:.1f}x plain batch-1 generation, {batch1:.1f} tok/s); answering "
          f"{here.samples_written} prompts here: {here.tokens_per_second:.0f} tok/s, "
          f"{here.tokens_per_second / batch1:.1f}x")
    for name, arm in arms.items():
        print(f"{name}: {arm['steps']} steps, final τ_prob {arm['final'].get('eval_tau_prob')}, "
              f"seconds {arm['run'].get('seconds')}")
    result = {"recipe": recipe, "regeneration": regeneration, "arms": arms,
              **{name: corpus for name, corpus in extra.items() if corpus is not None}}
    print(write_result("training_recipe", result, args.out))
    return 0


def pool_corpus(directory: Path) -> dict | None:
    """What an extra prompt pool's corpus (code or word problems) at ``directory`` holds and what answering it
    took, or None."""
    from dspark.train.corpus import load_corpus

    if not (directory / "corpus.json").exists():
        return None
    manifest = json.loads((directory / "corpus.json").read_text(encoding="utf-8"))
    samples = load_corpus(directory)
    answered = sum(r["answer_tokens"] for r in manifest["runs"])
    seconds = sum(r["seconds"] for r in manifest["runs"])
    return {"samples": len(samples), "pool": manifest["settings"]["num_prompts"],
            "answer_tokens": sum(int(s.loss_mask.sum()) for s in samples),
            "prompt_tokens": sum(int((~s.loss_mask).sum()) for s in samples),
            "timed_answer_tokens": answered, "seconds": seconds, "tokens_per_s": answered / seconds,
            "runs": manifest["runs"], "settings": manifest["settings"]}


if __name__ == "__main__":
    sys.exit(main())

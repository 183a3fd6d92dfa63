"""Two ways to get the training corpus' features: answer the prompts (a prefill and one decode step per answer
token, features captured on the way) or rebuild them from stored answers (one forward per batch of whole
sequences). Both are timed here in one run on the same prompts: the first ``--prompts`` of the recipe's
shuffled order, with the bf16 target the recipe answers with.

Also reports how far the rebuilt features are from the captured ones (the same target reading the same
tokens, batched and cached differently: bf16 rounding only) and the size of the answers archive per answer
token. Writes ``corpus_rebuild_cpu.json``.

``--batch-sizes B ...`` instead times answering alone at each batch size on the same prompts (greedy, or sampled
at ``--temperature``), to choose the batch a long regeneration runs at; it writes ``corpus_batch_cpu.json``.

``--lazy`` instead times the two ways a run gets the features of committed answers, on the first ``--prompts``
of the recipe's archive: rebuilding them all up front (batches of 32 whole sequences sorted by length) or
computing them as training first reads them (``features="lazy"``: one padded forward per step's ``--group``
sequences, in no length order), interleaved; ``corpus_lazy_cpu.json``.

    python benchmarks/bench_corpus.py [--prompts 128] [--repeats 2] [--out benchmarks/results]
    python benchmarks/bench_corpus.py --batch-sizes 64 128 256 --prompts 256 [--temperature 0.7]
    python benchmarks/bench_corpus.py --lazy [--prompts 128] [--group 4] [--repeats 2]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.environment import write_result  # noqa: E402


def feature_error(first: Path, second: Path, target) -> dict:
    """Largest and mean absolute difference of the two corpora's features, relative to the features' RMS."""
    from dspark.train.corpus import load_corpus
    from dspark.train.features import OfflineFeatures

    sources = [OfflineFeatures(d, target.tap_layers, target.hidden_size) for d in (first, second)]
    largest, total, squares, count = 0.0, 0.0, 0.0, 0
    for a, b in zip(load_corpus(first), load_corpus(second)):
        if a.key != b.key or not torch.equal(a.token_ids, b.token_ids):
            raise RuntimeError(f"sample {a.key}: the two corpora hold different tokens")
        for x, y in zip(sources[0].features(a.key, a), sources[1].features(b.key, b)):
            diff = (x.float() - y.float()).abs()
            largest = max(largest, float(diff.max()))
            total += float(diff.sum())
            squares += float(x.float().square().sum())
            count += x.numel()
    rms = (squares / count) ** 0.5
    return {"max_abs_over_rms": largest / rms, "mean_abs_over_rms": total / count / rms, "feature_rms": rms}


def answer_batch_sizes(target, prompts: list[str], args) -> dict:
    """Answering tokens/s at each of ``args.batch_sizes`` on the first ``args.prompts`` of the shuffled order."""
    from dspark.train.corpus import build_corpus

    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for batch_size in args.batch_sizes:
            report = build_corpus(target, prompts, Path(scratch) / f"batch-{batch_size}",
                                  max_new_tokens=args.max_new_tokens, batch_size=batch_size,
                                  temperature=args.temperature, max_samples=args.prompts, progress=False)
            rows.append({"batch_size": batch_size, "answer_tokens": report.answer_tokens, "seconds": report.seconds,
                         "answer_tokens_per_s": report.tokens_per_second})
            print(f"batch {batch_size}: {report.answer_tokens} answer tokens in {report.seconds:.1f} s "
                  f"({report.tokens_per_second:.0f} tok/s)")
    base = rows[0]["answer_tokens_per_s"]
    for row in rows:
        row["speedup"] = row["answer_tokens_per_s"] / base
    return {"prompts": args.prompts, "max_new_tokens": args.max_new_tokens, "temperature": args.temperature,
            "target_dtype": "bfloat16", "threads": torch.get_num_threads(), "rows": rows,
            "note": "build_corpus (prefill, decode steps with feature capture and writes) on the same prompts at "
                    "each batch size, one after another in one run; speedup against the first batch size"}


def lazy_against_rebuild(target, prompts: list[str], args) -> dict:
    """Sequence tokens/s of rebuilding the features of the archive's first ``args.prompts`` answers up front
    against computing each on first read, ``args.repeats`` interleaved pairs, and how far the two disagree."""
    import time

    from dspark.train.answers import load_answers, rebuild_corpus
    from dspark.train.corpus import corpus_order
    from dspark.train.features import OfflineFeatures

    archive = Path(__file__).resolve().parent / "recipes" / "smollm2_drafter.answers.npz"
    keys = corpus_order(len(prompts))[: args.prompts]
    samples = load_answers(archive).samples(keys)
    tokens = sum(len(s.token_ids) for s in samples)
    runs = []
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        for repeat in range(args.repeats):
            rebuilt, lazy = scratch / f"rebuilt-{repeat}", scratch / f"lazy-{repeat}"
            rebuild = rebuild_corpus(target, prompts, archive, rebuilt, max_new_tokens=args.max_new_tokens,
                                     keys=keys, progress=False)
            source = OfflineFeatures(lazy, target.tap_layers, target.hidden_size, target=target)
            start = time.perf_counter()
            for g in range(0, len(samples), args.group):
                step = samples[g: g + args.group]
                source.prefetch([(sample.key, sample) for sample in step])
                for sample in step:
                    source.features(sample.key, sample)
            lazy_seconds = time.perf_counter() - start
            runs.append({"rebuild_seconds": rebuild.seconds, "lazy_seconds": lazy_seconds,
                         "lazy_build_seconds": source.build_seconds,
                         "rebuild_tokens_per_s": tokens / rebuild.seconds, "lazy_tokens_per_s": tokens / lazy_seconds,
                         "lazy_over_rebuild_time": lazy_seconds / rebuild.seconds})
            print(f"repeat {repeat}: {tokens} sequence tokens; rebuilding {rebuild.seconds:.1f} s "
                  f"({runs[-1]['rebuild_tokens_per_s']:.0f} tok/s), lazily {lazy_seconds:.1f} s "
                  f"({runs[-1]['lazy_tokens_per_s']:.0f} tok/s)")
        error = feature_error(scratch / "rebuilt-0", scratch / "lazy-0", target)
    ratio = sum(r["lazy_seconds"] for r in runs) / sum(r["rebuild_seconds"] for r in runs)
    print(f"on first read in groups of {args.group} takes {ratio:.2f}x the rebuild's time; features differ by max "
          f"{error['max_abs_over_rms']:.3g}, mean {error['mean_abs_over_rms']:.3g} of their RMS")
    answer_tokens = sum(int(s.loss_mask.sum()) for s in samples)
    return {"prompts": args.prompts, "group": args.group, "sequence_tokens": tokens, "answer_tokens": answer_tokens,
            "target_dtype": "bfloat16", "threads": torch.get_num_threads(), "runs": runs,
            "lazy_over_rebuild_time": ratio, "feature_error": error,
            "note": "the committed ShareGPT answers' first prompts in the recipe's order; rebuilding: rebuild_corpus, "
                    "batches of 32 whole sequences sorted by length; lazily: OfflineFeatures given the target, "
                    "one padded forward per group of consecutive samples (as a training step prefetches its "
                    "sequences); both write bf16 files; interleaved in one run"}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=128)
    parser.add_argument("--max-new-tokens", type=int, default=192)
    parser.add_argument("--repeats", type=int, default=2, help="answer / rebuild pairs, interleaved")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=None,
                        help="time answering alone at these batch sizes instead")
    parser.add_argument("--temperature", type=float, default=0.0, help="with --batch-sizes: sample at this")
    parser.add_argument("--group", type=int, default=4, help="with --lazy: sequences per step")
    parser.add_argument("--lazy", action="store_true",
                        help="time computing committed answers' features on first read against rebuilding them")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.batch_sizes is not None and min(args.batch_sizes) < 1:
        raise SystemExit("--batch-sizes must be positive")
    if args.group < 1:
        raise SystemExit("--group must be positive")
    from dspark.runtime.target import load_default_target
    from dspark.train.answers import rebuild_corpus, save_answers
    from dspark.train.corpus import build_corpus
    from dspark.train.pools import load_training_prompts

    prompts = load_training_prompts()
    target = load_default_target(dtype=torch.bfloat16)
    if args.batch_sizes is not None:
        print(write_result("corpus_batch_cpu", answer_batch_sizes(target, prompts, args), args.out))
        return 0
    if args.lazy:
        print(write_result("corpus_lazy_cpu", lazy_against_rebuild(target, prompts, args), args.out))
        return 0
    runs = []
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        for repeat in range(args.repeats):
            answered, rebuilt = scratch / f"answered-{repeat}", scratch / f"rebuilt-{repeat}"
            answer = build_corpus(target, prompts, answered, max_new_tokens=args.max_new_tokens,
                                  max_samples=args.prompts, progress=False)
            archive = save_answers(answered, scratch / f"answers-{repeat}.npz")
            rebuild = rebuild_corpus(target, prompts, archive, rebuilt, max_new_tokens=args.max_new_tokens,
                                     progress=False)
            if rebuild.answer_tokens != answer.answer_tokens:
                raise RuntimeError("the rebuilt corpus holds other answers than the answered one")
            runs.append({"answer_tokens": answer.answer_tokens, "answer_seconds": answer.seconds,
                         "rebuild_seconds": rebuild.seconds, "archive_bytes": archive.stat().st_size,
                         "answer_tokens_per_s": answer.tokens_per_second,
                         "rebuild_tokens_per_s": rebuild.tokens_per_second,
                         "speedup": answer.seconds / rebuild.seconds})
            print(f"repeat {repeat}: {answer.answer_tokens} answer tokens; answering {answer.seconds:.1f} s "
                  f"({answer.tokens_per_second:.0f} tok/s), rebuilding {rebuild.seconds:.1f} s "
                  f"({rebuild.tokens_per_second:.0f} tok/s): {runs[-1]['speedup']:.1f}x; archive "
                  f"{runs[-1]['archive_bytes'] / answer.answer_tokens:.2f} bytes per answer token")
        error = feature_error(scratch / "answered-0", scratch / "rebuilt-0", target)
    speedup = sum(r["answer_seconds"] for r in runs) / sum(r["rebuild_seconds"] for r in runs)
    print(f"rebuilding is {speedup:.1f}x faster than answering over all repeats")
    print(f"rebuilt vs captured features: max |diff| {error['max_abs_over_rms']:.3g}, mean "
          f"{error['mean_abs_over_rms']:.3g} of their RMS")
    payload = {"prompts": args.prompts, "max_new_tokens": args.max_new_tokens, "target_dtype": "bfloat16",
               "threads": torch.get_num_threads(), "runs": runs, "speedup": speedup,
               "feature_error": error,
               "note": "answering: prefill, decode steps with feature capture and writes (build_corpus, batch 64); "
                       "rebuilding: one forward per batch of 32 whole sequences and writes (rebuild_corpus); "
                       "same prompts, interleaved in one run"}
    print(write_result("corpus_rebuild_cpu", payload, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Acceptance on held-out real prompts: τ and per-position acceptance per domain, T = 0 and T = 1.

Each available drafter for the default target (``--drafters name=DIR``; by default the trained DSpark, DFlash and
EAGLE-3-style drafters and DSpark trained on cross-entropy alone, cached or committed: ``benchmarks.trained``, and
the committed DSpark drafter at DFlash's steps when the shipped one trained longer)
decodes the same held-out prompts (math: GSM8K, code: HumanEval, chat: MT-Bench first turns; never in the training
pool) with every drafted slot verified. τ counts the bonus token (``paper/method.md`` §9, vLLM's ``1 + accepted /
drafts``); acceptance by position is given both conditional (the paper's Fig. 2) and unconditional (DeepSpec's
``accept_rate@pos``). Each prompt's committed tokens and rounds are kept too, so that two drafters can be compared
prompt by prompt (the paper's paired interval), and how often a drafted token repeats the slot before it, beside how
often the decoded output does. Writes ``acceptance_cpu.json`` (``--name`` another name, such as
``acceptance_candidates_cpu`` for drafters decoded before deciding whether to ship one).

``--reuse FILE`` keeps an earlier run's rows for each drafter that is unchanged (the same training metadata,
decoded on the same prompts with the same settings and torch version) instead of decoding it again, and records
at which commit and date those rows were decoded (``reused``). Re-training one arm then re-decodes only that arm.
With ``--keep`` the rows of FILE's drafters that this run does not name are kept as well (a candidate drafter
that is no longer on disk stays in the comparison), under the same conditions.

    python benchmarks/bench_acceptance.py [--prompts-per-domain 8] [--max-new-tokens 64] [--reuse FILE [--keep]]
                                          [--name NAME]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.environment import write_result  # noqa: E402
from benchmarks.trained import equal_budget_drafters, trained_drafters  # noqa: E402
from dspark.files.checkpoint import load_drafter  # noqa: E402
from dspark.runtime.decoding import SamplingConfig, speculative_generate  # noqa: E402
from dspark.runtime.prompts import DOMAINS, load_prompts  # noqa: E402
from dspark.runtime.target import load_default_target  # noqa: E402
from dspark.scheduler import FixedLength  # noqa: E402


def _repeat_rate(outputs: list[list[int]]) -> float:
    """How often a decoded token equals the one before it: the rate drafts' repeats are to be read against."""
    pairs = [(a == b) for tokens in outputs for a, b in zip(tokens, tokens[1:])]
    return sum(pairs) / len(pairs) if pairs else float("nan")


def _canonical(value) -> str:
    return json.dumps(value, sort_keys=True)


def reusable_rows(earlier: dict, settings: dict, metadata: dict[str, dict], temperatures: list[float],
                  prompts_per_domain: int) -> dict[str, tuple[list[dict], dict]]:
    """The rows of ``earlier`` (an acceptance result) that this run would decode again: ``{name: (rows,
    provenance)}`` for each drafter whose training ``metadata`` the earlier run recorded unchanged, when that run
    used the same ``settings`` (offset, new tokens, torch version) and holds a row for every temperature and domain,
    each over ``prompts_per_domain`` prompts. ``provenance`` is the commit and date those rows were decoded at,
    carried over when the earlier run had itself reused them."""
    environment = earlier.get("environment", {})
    had = {"offset": earlier.get("offset"), "max_new_tokens": earlier.get("max_new_tokens"),
           "torch": environment.get("torch")}
    if had != settings:
        return {}
    wanted = {(float(t), d) for t in temperatures for d in DOMAINS}
    kept = {}
    for name, meta in metadata.items():
        if _canonical(earlier.get("drafter_metadata", {}).get(name)) != _canonical(meta):
            continue
        rows = [r for r in earlier.get("rows", []) if r["drafter"] == name]
        cells = {(float(r["temperature"]), r["domain"]) for r in rows}
        if cells != wanted or len(rows) != len(wanted) or any(r["prompts"] != prompts_per_domain for r in rows):
            continue
        provenance = earlier.get("reused", {}).get(name) or {"commit": environment.get("commit"),
                                                            "date": environment.get("date")}
        kept[name] = (rows, provenance)
    return kept


def kept_rows(earlier: dict, settings: dict, named: set[str], temperatures: list[float],
              prompts_per_domain: int) -> dict[str, tuple[list[dict], dict]]:
    """The rows of ``earlier``'s drafters that this run does not decode (not among ``named``), as
    :func:`reusable_rows` gives them. Refuses, rather than leaving one out, when any of them was decoded with other
    settings, prompts or temperatures than this run's."""
    others = {name: meta for name, meta in earlier.get("drafter_metadata", {}).items() if name not in named}
    kept = reusable_rows(earlier, settings, others, temperatures, prompts_per_domain)
    if set(kept) != set(others):
        raise SystemExit(f"cannot keep {sorted(set(others) - set(kept))}: decoded with other settings, prompts or "
                         "temperatures than this run's")
    return kept


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--drafters", nargs="*", default=None,
                        help="name=DIR pairs (default: the trained ones, cached or committed, and DSpark at "
                             "DFlash's steps)")
    parser.add_argument("--prompts-per-domain", type=int, default=8)
    parser.add_argument("--offset", type=int, default=50, help="first prompt index of each domain")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    parser.add_argument("--reuse", type=Path, default=None,
                        help="an earlier acceptance_cpu.json whose rows of unchanged drafters are kept")
    parser.add_argument("--keep", action="store_true",
                        help="with --reuse: also keep the rows of its drafters that --drafters does not name")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--name", default="acceptance_cpu", help="the results file's name, without .json")
    args = parser.parse_args(argv)
    if not re.fullmatch(r"[A-Za-z0-9_-]+", args.name):
        parser.error(f"--name takes letters, digits, dashes and underscores, got {args.name!r}")
    if args.keep and args.reuse is None:
        parser.error("--keep keeps rows of the file --reuse names; give --reuse FILE")
    if args.drafters:
        drafters = dict(item.split("=", 1) for item in args.drafters)
    else:
        drafters = trained_drafters()
        drafters.update(equal_budget_drafters(drafters))
    if not drafters:
        raise SystemExit("no trained drafters found: run `python -m dspark train` (and --objective dflash) first")
    target = load_default_target()
    prompts = {d: [target.encode_chat(p.text) for p in
                   load_prompts(d)[args.offset: args.offset + args.prompts_per_domain]] for d in DOMAINS}
    metadata = {name: load_drafter(directory, target).metadata for name, directory in drafters.items()}
    reused, kept = {}, {}
    if args.reuse is not None:
        settings = {"offset": args.offset, "max_new_tokens": args.max_new_tokens, "torch": torch.__version__}
        earlier = json.loads(args.reuse.read_text(encoding="utf-8"))
        reused = reusable_rows(earlier, settings, metadata, args.temperatures, args.prompts_per_domain)
        if args.keep:
            kept = kept_rows(earlier, settings, set(drafters), args.temperatures, args.prompts_per_domain)
    rows = []
    for name, directory in drafters.items():
        if name in reused:
            rows.extend(reused[name][0])
            print(f"{name:7s} unchanged since {reused[name][1]['commit']}: its rows are kept from {args.reuse}")
            continue
        drafter = load_drafter(directory, target)
        for temperature in args.temperatures:
            for domain in DOMAINS:
                config = SamplingConfig(max_new_tokens=args.max_new_tokens, temperature=temperature, seed=0)
                result = speculative_generate(target, drafter, prompts[domain], config,
                                              scheduler=FixedLength(drafter.config.block_size))
                row = {"drafter": name, "temperature": temperature, "domain": domain,
                       "prompts": len(prompts[domain]), **result.stats.as_dict(),
                       "per_prompt": {"committed": [len(t) - 1 for t in result.tokens],
                                      "rounds": result.request_rounds},
                       "tokens_per_second": result.tokens_per_second,
                       "output_repeat_rate": _repeat_rate(result.tokens)}
                rows.append(row)
                print(f"{name:7s} T={temperature:g} {domain:5s} tau={row['tau']:.3f} "
                      f"cond={[round(x, 2) for x in row['conditional_acceptance']]}")
    paths = {name: str(directory) for name, directory in drafters.items()}
    for name, (carried, provenance) in kept.items():
        rows.extend(carried)
        paths[name], metadata[name] = earlier["drafters"][name], earlier["drafter_metadata"][name]
        print(f"{name:7s} not named: its rows are kept from {args.reuse} (decoded at {provenance['commit']})")
    reused.update(kept)
    write_result(args.name, {"max_new_tokens": args.max_new_tokens, "offset": args.offset, "drafters": paths,
                           "drafter_metadata": metadata,
                           "reused": {name: provenance for name, (_, provenance) in reused.items()},
                           "rows": rows}, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

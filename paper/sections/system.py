"""§7: DSpark as a system: concurrent load, long contexts, and the cost of streaming features."""

from __future__ import annotations

from pathlib import Path

from paper.common import machine, num, quote, results
from paper.figures import pyplot, save

# Kimi K3 figures quoted in press coverage; no model card we hold states them, so the text calls them unverified.
REPORTED_THROUGHPUT = {1: 177, 16: 683}  # aggregate output tokens/s at concurrency 1 and 16
REPORTED_TTFT_MS = {1: 379, 16: 479}  # median time to first token
REPORTED_LONG_CONTEXT = (378, 5.31)  # thousands of prompt tokens (LongBench-v2), accepted tokens per iteration
MODES = (("target_only", "target alone", "tab:gray"), ("dspark", "DSpark, Algorithm 1", "tab:red"))


def section_system(out: list[str], figures: Path) -> None:
    out.append("## 7. DSpark as a system\n")
    out.append("The reports judge DSpark as a serving system, not by acceptance alone: speed as concurrent requests "
               "rise, time to first token, acceptance on long contexts, and what moving hidden states between an "
               "inference plane and a training plane costs. This section measures the three at small scale. The "
               "Kimi K3 numbers quoted beside ours come from press coverage that we could not trace to a model "
               "card, so we treat them as unverified.\n")
    _concurrency(out, figures)
    _long_context(out, figures)
    _streaming(out)


def _concurrency(out: list[str], figures: Path) -> None:
    result = results(out, "concurrency_cpu", "### From 1 to 16 concurrent requests",
                     "benchmarks/bench_concurrency.py")
    if result is None:
        return
    rows = result["rows"]
    out.append("**How it was measured.** `benchmarks/bench_concurrency.py`: a closed loop of c clients, each "
               "sending its next request when its last one has finished, served by continuous batching with c "
               f"places; {num(rows[0]['prompts'], 'd')} held-out prompts (math, code, chat), greedy, "
               f"{num(result['max_new_tokens'], 'd')} new tokens each, the default target with the shipped drafter "
               f"in {result['precision']}. DSpark runs Algorithm 1 on a verify-latency profile taken at batch c. Both "
               f"modes decode the same prompts {num(result['repeats'], 'd')} times in turns; the table gives the "
               "median over repeats, the figure the range. A request arrives when its place comes free, so its time "
               "to first token (TTFT) includes the prefills queued before its own. One decode per mode at "
               f"concurrency 1 warmed up first and is not counted. Idle machine; {machine(result)}.\n")
    out.append("| concurrency | target alone, tokens/s | DSpark, tokens/s | speedup | τ | TTFT p50 / p90, target alone "
               "(ms) | TTFT p50 / p90, DSpark (ms) | inter-token latency, target alone / DSpark (ms) | identical "
               "outputs | reported, Kimi K3 |")
    out.append("|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        c, plain, spec = row["concurrency"], row["target_only"], row["dspark"]
        reported = ""
        if c in REPORTED_THROUGHPUT:
            reported = (f"{quote(REPORTED_THROUGHPUT[c], 'd')} tokens/s, TTFT p50 {quote(REPORTED_TTFT_MS[c], 'd')} "
                        "ms")
        out.append(f"| {num(c, 'd')} | {num(plain['output_tokens_per_s']['median'], '.1f')} "
                   f"| {num(spec['output_tokens_per_s']['median'], '.1f')} | {num(row['speedup'], '.2f')}× "
                   f"| {num(row['tau'], '.2f')} | {_ttft(plain)} | {_ttft(spec)} "
                   f"| {num(plain['tpot_ms']['median'], '.0f')} / {num(spec['tpot_ms']['median'], '.0f')} "
                   f"| {'yes' if row['identical_outputs'] else 'no'} | {reported} |")
    out.append("")
    first, last = rows[0], rows[-1]
    gain = last["dspark"]["output_tokens_per_s"]["median"] / first["dspark"]["output_tokens_per_s"]["median"]
    reported_gain = REPORTED_THROUGHPUT[16] / REPORTED_THROUGHPUT[1]
    out.append(f"From concurrency {num(first['concurrency'], 'd')} to {num(last['concurrency'], 'd')}, DSpark's "
               f"aggregate throughput grows {num(gain, '.2f')}× here, against the reported "
               f"{quote(reported_gain, '.2f')}×; its speedup over the target alone goes from "
               f"{num(first['speedup'], '.2f')}× to {num(last['speedup'], '.2f')}×. On this CPU a verify pass costs "
               "more with every token it carries (section 5), so Algorithm 1 sends fewer drafts as the batch grows "
               f"(τ {num(first['tau'], '.2f')} at one request, {num(min(row['tau'] for row in rows), '.2f')} at the "
               "lowest), where a GPU's pass stays nearly flat up to far larger batches; where it sends almost "
               "nothing, the rounds in which the drafter still runs (the back-off's probes) cost more than the few "
               "drafts they send, and DSpark falls slightly behind the target alone. TTFT rises with concurrency "
               "because requests that arrive together are prefilled one after another.\n")
    _figure_concurrency(rows, figures)
    out.append("![Throughput and TTFT against concurrency](figures/concurrency.png)\n")
    out.append("*Figure 7. Left: aggregate output tokens/s against concurrent requests, median over repeats with bars "
               "from the lowest to the highest repeat; the axis starts at zero. Right: median TTFT (solid) and its "
               "90th percentile (dashed), with the same bars.*\n")


def _ttft(mode: dict) -> str:
    return f"{num(mode['ttft_p50_ms']['median'], '.0f')} / {num(mode['ttft_p90_ms']['median'], '.0f')}"


def _figure_concurrency(rows: list[dict], figures: Path) -> None:
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(9.5, 3.4))
    xs = [row["concurrency"] for row in rows]
    for key, name, color in MODES:
        for ax, metric, style in ((left, "output_tokens_per_s", "-"), (right, "ttft_p50_ms", "-"),
                                  (right, "ttft_p90_ms", "--")):
            values = [row[key][metric] for row in rows]
            median = [v["median"] for v in values]
            errors = [[m - v["low"] for m, v in zip(median, values)], [v["high"] - m for m, v in zip(median, values)]]
            ax.errorbar(xs, median, yerr=errors, color=color, linestyle=style, marker="o", capsize=3,
                        label=name if style == "-" else None)
    for ax, ylabel in ((left, "output tokens/s, all requests"), (right, "time to first token (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.set_xlabel("concurrent requests")
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    left.legend(fontsize=8)
    save(fig, figures, "concurrency.png")


def _long_context(out: list[str], figures: Path) -> None:
    result = results(out, "long_context_cpu", "### Acceptance on long contexts",
                     "benchmarks/bench_long_context.py")
    if result is None:
        return
    rows = result["rows"]
    out.append("**How it was measured.** `benchmarks/bench_long_context.py`: prompts of about "
               + ", ".join(num(row["nominal_tokens"], "d") for row in rows)
               + " tokens, each the start of a page of Python's reference documentation (`pydoc_data`, which no "
               f"training pool draws on) followed by the question \"{result['question']}\", "
               f"{num(len(rows[0]['prompt_tokens']), 'd')} prompts per length starting at different pages. Each is "
               f"decoded greedily, {num(result['max_new_tokens'], 'd')} new tokens, every drafted slot verified, by "
               f"the default target with the shipped drafter in {result['precision']}. τ pools a length's rounds; "
               f"the range is that of its prompts. {machine(result)}.\n")
    out.append("| context tokens | τ (lowest – highest prompt) | acceptance at slot 1 / 2 / 3, given the slots before "
               "| prefill (s) | drafter context cache (MiB) | target KV cache (MiB) |")
    out.append("|---|---|---|---|---|---|")
    for row in rows:
        slots = " / ".join(num(a, ".2f") for a in row["conditional_acceptance"][:3])
        out.append(f"| {num(row['context_tokens'], 'd')} | {num(row['tau'], '.2f')} ({num(row['tau_low'], '.2f')} – "
                   f"{num(row['tau_high'], '.2f')}) | {slots} | {num(row['prefill_s'], '.1f')} "
                   f"| {num(row['drafter_cache_mib'], '.1f')} | {num(row['target_kv_cache_mib'], '.0f')} |")
    out.append("")
    short, long = rows[0], rows[-1]
    trend = "falls" if long["tau_high"] < short["tau_low"] else "rises" if long["tau_low"] > short["tau_high"] else \
        "holds within the spread between prompts"
    out.append(f"From {num(short['context_tokens'], 'd')} to {num(long['context_tokens'], 'd')} tokens of context, τ "
               f"{trend} ({num(short['tau'], '.2f')} → {num(long['tau'], '.2f')}), and the first slot carries most of "
               f"the change: its acceptance goes from {num(short['conditional_acceptance'][0], '.2f')} to "
               f"{num(long['conditional_acceptance'][0], '.2f')}. The first slot is the one that reads the context "
               "most (the later ones also lean on the slots before them, through the block and the Markov head), and "
               "the drafter trained on sequences of about a thousand tokens at most, most of them a few hundred: "
               "positions and attention spans this long were never in its training data, which we take to be the "
               "cause rather than the method. The reports give "
               f"{quote(REPORTED_LONG_CONTEXT[1], '.2f')} tokens per iteration at "
               f"{quote(REPORTED_LONG_CONTEXT[0], 'd')}K tokens for a drafter trained on sequences up to "
               f"{quote(32, 'd')}K tokens. The drafter's context cache holds two layers' keys and values per context "
               "token against the target's thirty, and stays a small fraction of the target's cache at every "
               "length.\n")
    _figure_long_context(rows, figures)
    out.append("![τ against context length](figures/long_context.png)\n")
    out.append("*Figure 8. τ against prompt length (log scale), pooled over a length's prompts, with bars from the "
               "lowest to the highest prompt. The axis starts at τ = 1, no draft accepted.*\n")


def _figure_long_context(rows: list[dict], figures: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.2, 3.2))
    xs = [row["context_tokens"] for row in rows]
    taus = [row["tau"] for row in rows]
    errors = [[t - row["tau_low"] for t, row in zip(taus, rows)], [row["tau_high"] - t for t, row in zip(taus, rows)]]
    ax.errorbar(xs, taus, yerr=errors, color="tab:red", marker="o", capsize=3)
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [f"{x:,}" for x in xs])
    ax.set_xlabel("prompt tokens")
    ax.set_ylabel("τ (tokens per round)")
    ax.set_ylim(bottom=1)
    ax.grid(alpha=0.3)
    save(fig, figures, "long_context.png")


def _streaming(out: list[str]) -> None:
    result = results(out, "streaming_cpu", "### The cost of streaming features", "benchmarks/bench_streaming.py")
    if result is None:
        return
    out.append("**How it was measured.** `benchmarks/bench_streaming.py`, on this machine over loopback: samples of "
               f"{num(result['tokens_per_sample'], 'd')} tokens with the default target's {num(result['taps'], 'd')} "
               f"taps and final hidden state of width {num(result['hidden_size'], 'd')} in bf16 "
               f"({num(result['bytes_per_sample'] / 1e6, '.2f')} MB each). A producer process serves features it "
               "holds as fast as the transport takes them, so the transport and the consumer are measured, not a "
               "target's forward; both share this machine's cores. Training runs the recipe's batch on the shipped "
               "drafter's structure, reading the same samples from disk or from the stream, and counts the time "
               f"spent waiting inside the feature source (its first {num(result['warm_up_steps'], 'd')} steps not "
               f"counted). {machine(result)}.\n")
    out.append("| transport | samples/s | MB/s of bf16 features |")
    out.append("|---|---|---|")
    for row in result["transport"]:
        out.append(f"| {row['transport']} | {num(row['samples_per_s'], '.1f')} | {num(row['mb_per_s'], '.0f')} |")
    out.append("")
    out.append("| features | seconds per step | waiting for features |")
    out.append("|---|---|---|")
    for row in result["training"]:
        out.append(f"| {row['features']} | {num(row['step_s'], '.2f')} | {num(100 * row['wait_fraction'], '.1f')}% |")
    out.append("")
    mooncake = next((row for row in result["transport"] if row["transport"] == "mooncake"), None)
    if mooncake is not None:
        out.append("The Mooncake transport sends features as fp32, "
                   f"{num(mooncake['wire_mb_per_s'], '.0f')} MB/s on the wire for the bf16 bytes above. Either "
                   "transport delivers samples far faster than a training step reads them, so streamed training "
                   "waits no more than training from disk. Training on the "
                   "`torch.distributed` transport was not measured because it fails: its producers join the default "
                   "process group, which the trainer takes for its data-parallel ranks, so a step's first all-reduce "
                   "waits for processes that never join it. Training streams over Mooncake until the trainer gets "
                   "a group of its own.\n")
    link = result["kimi_k3_link"]
    out.append(f"**At Kimi K3's scale (a calculation, not a measurement).** With {num(link['taps'], 'd')} taps and the "
               f"final hidden state of width {num(link['hidden_size'], 'd')} (Kimi K2's; the K3 reports we hold state "
               f"none) in bf16, a token's features take {num(link['bytes_per_token'] / 1e3, '.1f')} kB, so one "
               f"{num(link['link_gbit_per_s'], 'd')} Gb/s link carries about "
               f"{num(link['tokens_per_s_per_link'] / 1e3, '.0f')}K tokens of features per second, "
               f"{num(link['samples_per_s_per_link'], '.1f')} samples of {num(link['tokens_per_sample'], 'd')} tokens. "
               "A target node produces features only as fast as it prefills, so a link of that speed keeps up with "
               "prefill rates up to that many tokens per second.\n")

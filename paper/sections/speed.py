"""§6: speed and memory."""

from __future__ import annotations

from pathlib import Path

from paper.common import load, machine, num, quote
from paper.figures import pyplot, save

# The Markov and rejection samplers became parallel over the vocabulary at this time; GPU rows measured
# before it are of the one-program-per-request kernels they replaced (ISO dates compare as text).
# When kernels were rewritten: GPU rows measured before then are of the previous kernel.
SAMPLERS_REWRITTEN = "2026-11-30T20:50:00+00:00"
SCHEDULER_REWRITTEN = "2026-12-01T00:15:48+00:00"
LOSS_REWRITTEN = "2026-12-01T02:16:34+00:00"
REWRITTEN = {"markov_sample_block": SAMPLERS_REWRITTEN, "markov_sample_block_greedy": SAMPLERS_REWRITTEN,
             "verify": SAMPLERS_REWRITTEN, "schedule_greedy": SCHEDULER_REWRITTEN,
             "allocate_top_k": SCHEDULER_REWRITTEN, "dspark_loss_fwd_bwd": LOSS_REWRITTEN}


def _previous_kernel(result: dict, row: dict) -> bool:
    return row["op"] in REWRITTEN and result["environment"]["date"] < REWRITTEN[row["op"]]


def _kernel_verdict(rows) -> str:
    faster, slower = {}, {}
    for r in rows:
        if "speedup_triton_over_torch" in r:
            side = faster if r["speedup_triton_over_torch"] > 1 else slower
            side.setdefault(r["op"], []).append(num(r["requests"], "d"))
    def listed(side):
        return ", ".join(f"{op} (R = {' and '.join(rs)})" for op, rs in side.items()) or "none"
    return f"The Triton kernel is faster than PyTorch for {listed(faster)}; slower for {listed(slower)}."


def section_speed(out: list[str], figures: Path) -> None:
    out.append("## 6. Speed and memory\n")
    e2e = load("e2e_cpu")
    if e2e is not None:
        precision = e2e.get("precision", "fp32")
        fp32_alone = "fp32_target_only_tokens_per_s" in e2e["rows"][0]
        out.append(f"**End to end on this CPU** (`benchmarks/bench_e2e.py`): greedy decoding of "
                   f"{num(e2e['rows'][0]['prompts'], 'd')} held-out prompts with the shipped DSpark drafter, "
                   f"{num(e2e['max_new_tokens'], 'd')} new tokens, measured on {machine(e2e)}, target and drafter in "
                   f"{precision}; speculative decoding "
                   "either verifies every drafted slot or lets Algorithm 1 (with the demo's back-off) choose verify "
                   "lengths on a verify-latency profile taken at that batch. The few-row products of all three modes "
                   "take the layout that profile found fastest (`dspark.runtime.profiling.choose_few_row_layout`). "
                   "A round's parts are in units of one plain decoding step of the target at the same batch"
                   + (". The fp32 target alone ran on the same prompts in the same rotation, with stock attention: "
                      "its outputs differ from the bf16 target's by rounding, so it is the plain decoding a user "
                      "would otherwise run, not the one the outputs are checked against" if fp32_alone else "")
                   + ":\n")
        if precision.startswith("bf16"):
            out.append("In bf16 the target computes attention one query at a time over exactly the keys that query "
                       "sees (`dspark.runtime.invariant`), and its few-row products go to oneDNN in calls that oneDNN "
                       "keeps apart (`dspark.linear.bf16_call_rows` measures them per CPU and weight shape: on a Xeon "
                       "with AMX, calls of up to 32 rows keep every SmolLM2-135M shape's rows apart; on a 2-core AMD "
                       "EPYC, oneDNN sums a single row of the down projection in another order than 2 to 32 rows, so "
                       "single rows go in padded with a zero row), so each row gets what it would get alone. A "
                       "verify pass then gives each token the logits a one-token step gives it, bit for bit, so greedy "
                       "speculative decoding equals greedy decoding of the same requests whatever their near-ties. "
                       "With stock attention, bf16's coarse rounding let verify passes summed in another order flip "
                       "greedy tokens on these prompts.\n")
        if any(r.get("batching") == "continuous" for r in e2e["rows"]):
            out.append("At batch 4 the prompts run twice: in static chunks of 4, where a chunk's last rounds carry "
                       "only the requests that have not finished, and with continuous batching, where a request "
                       "that finishes hands its place to the next prompt (`max_batch=4`; each mode decodes every "
                       "prompt twice, in mirrored order, and each request is prefilled alone).\n")
        out.append("| batch | batching | few-row products | verify lengths | target only (tok/s) | speculative (tok/s) "
                   "| speedup " + ("| fp32 target only (tok/s) | speedup over it " if fp32_alone else "")
                   + "| τ | round (target steps) | draft | verify forward | verification | other | outputs identical |")
        out.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|---|" if fp32_alone else ""))
        for r in e2e["rows"]:
            parts = r["round_parts_in_target_steps"]
            other = parts["schedule"] + parts["bookkeeping"]
            lengths = "every slot" if r["scheduler"] == "every slot" else "Algorithm 1"
            versus = ""
            if fp32_alone:  # the fp32 target runs in the static rotation only
                versus = (f"{num(r['fp32_target_only_tokens_per_s'], '.1f')} | "
                          f"{num(r['speedup_over_fp32_target_only'], '.2f')}× | "
                          if "fp32_target_only_tokens_per_s" in r else "– | – | ")
            batching = r.get("batching", "static")
            out.append(f"| {num(r['batch'], 'd')} | {batching} | {r['few_row_layout']} | {lengths} | "
                       f"{num(r['target_only_tokens_per_s'], '.1f')} | "
                       f"{num(r['speculative_tokens_per_s'], '.1f')} | {num(r['speedup'], '.2f')}× | {versus}"
                       f"{num(r['tau'])} | {num(r['round_in_target_steps'], '.2f')} | {num(parts['draft'], '.2f')} | "
                       f"{num(parts['target'], '.2f')} | {num(parts['verify'], '.2f')} | {num(other, '.2f')} | "
                       f"{'yes' if r['identical_outputs'] else 'no'} |")
        out.append("")
    _section_round_cuda(out)
    kernels = load("kernels_cpu")
    if kernels is not None:
        out.append("**PyTorch modules against the loop references** (`benchmarks/bench_kernels.py --device cpu`, "
                   f"small shapes, {machine(kernels)}); the Triton kernels run on the CPU only under the "
                   "interpreter, which says nothing about speed:\n")
        out.append("| op | PyTorch (ms) | reference (ms) | reference / PyTorch |")
        out.append("|---|---|---|---|")
        for r in kernels["rows"]:
            out.append(f"| {r['op']} | {num(r['torch_ms'])} | {num(r['reference_ms'])} | "
                       f"{num(r['speedup_torch_over_reference'], '.1f')}× |")
        out.append("")
    gpu = load("kernels_gpu")
    if gpu is None:
        out.append("GPU kernel timings: not measured (no GPU was lent).\n")
    else:
        out.append(f"**Triton kernels against the PyTorch modules on a GPU** (`benchmarks/bench_kernels.py --device "
                   f"cuda`, `triton.testing.do_bench` medians, the paper's scale V = {quote(151936, 'd')}, "
                   f"r = {quote(256, 'd')}, γ = 7, bf16 where "
                   f"the op allows, autotuned), measured on {machine(gpu)}. Bandwidth is the minimum bytes each op "
                   f"must move over its time, against a measured device copy of "
                   f"{num(gpu['peak_bandwidth_gbps'], '.0f')} GB/s:\n")
        out.append("| op | R | Triton (ms) | PyTorch (ms) | PyTorch / Triton | Triton bandwidth | peak memory "
                   "Triton / PyTorch (MiB) |")
        out.append("|---|---|---|---|---|---|---|")
        previous = [r for r in gpu["rows"] if _previous_kernel(gpu, r)]
        for r in gpu["rows"]:
            if "triton_ms" not in r:
                continue
            op = f"{r['op']} (previous kernel)" if r in previous else r["op"]
            mem = ""
            if "triton_peak_mem_mib" in r and "torch_peak_mem_mib" in r:
                mem = f"{num(r['triton_peak_mem_mib'], '.0f')} / {num(r['torch_peak_mem_mib'], '.0f')}"
            ratio = num(r["speedup_triton_over_torch"], ".2f")
            out.append(f"| {op} | {num(r['requests'], 'd')} | {num(r['triton_ms'])} | {num(r['torch_ms'])} | "
                       f"{ratio}× | {num(100 * r['triton_peak_fraction'], '.1f')}% | {mem} |")
        out.append("")
        out.append(_kernel_verdict([r for r in gpu["rows"] if r not in previous]) + " Block attention feeds bf16 "
                   "tiles to the tensor cores (wgmma on this card) with fp32 accumulation.\n")
        if previous:
            out.append("Rows marked *previous kernel* were measured before those kernels were rewritten, and no GPU "
                       "has run the rewrites yet, so no speed is claimed for them. The samplers then ran one program "
                       "per request that walked the vocabulary serially and re-read W2 for every request and slot, "
                       "so few multiprocessors worked; both are now parallel over the vocabulary (a grid of "
                       "vocabulary tiles and request tiles, the rank-r bias as one `tl.dot` per tile, tile masses "
                       "combined in fixed point, kernels/markov.py and kernels/rejection.py). The scheduler kernels "
                       "then ranked candidates by counting every pair, quadratic in R·γ; they now sort the entries "
                       "in registers (a bitonic sort, O(n log² n) compare-and-swaps) and find groups with scans "
                       "(kernels/scheduler.py). The fused loss then copied both LM heads to fp32 and ran its "
                       "vocabulary products there (most of its peak memory, and fp32 GEMMs); it now runs them on "
                       "the operands' bf16, as the PyTorch loss does. The rewrites pass the interpreter's "
                       "equivalence tests and compile for sm_90, sm_100 and sm_103 (below).\n")
    if gpu is None or not any(r["op"] == "block_attention_fwd_bwd" for r in gpu["rows"]):
        out.append("Block attention's backward is fused too (kernels/attention.py: one Triton kernel for dQ and the "
                   "block's own keys and values, one per context tile for the context's, from the forward's saved "
                   "log-sum-exp). It equals autograd through the reference under the interpreter and compiles for "
                   "all three architectures, but no GPU has timed it yet: `bench_kernels.py` has its "
                   "`block_attention_fwd_bwd` row ready for the next lease.\n")
    _section_compile_matrix(out)
    training = [t for t in (load("training_cpu_default"), load("training_cpu_recipe"), load("training_cuda_recipe"),
                            load("training_cuda_paper")) if t is not None]
    if training:
        out.append("**Training step memory and throughput** (`benchmarks/bench_training.py`): the same drafter and "
                   "synthetic features, a few Trainer steps per variant in a fresh process; peak memory above what "
                   "the process held before its first step (CPU: resident set; GPU: allocated), tokens = block "
                   "slots trained per second (on the CPU, the median of interleaved runs). *bf16* runs every "
                   "product on bf16 operands, *bf16-vocab* adds the reduced draft vocabulary, and *recipe* is "
                   "*bf16-vocab* as `python -m dspark train` runs it, with freed buffers kept for reuse "
                   "(`tune_cpu_allocator`):\n")
        out.append("| where | scale | rows per step | loss | tokens/s | peak memory (MiB) | vs plain |")
        out.append("|---|---|---|---|---|---|---|")
        for t in training:
            plain = next((r for r in t["rows"] if r["variant"] == "plain" and "error" not in r), None)
            for r in t["rows"]:
                if "error" in r:
                    continue
                versus = ""
                if plain is not None and r is not plain:
                    versus = (f"{num(r['peak_bytes_above_start'] / plain['peak_bytes_above_start'], '.2f')}× memory, "
                              f"{num(r['tokens_per_s'] / plain['tokens_per_s'], '.2f')}× speed")
                out.append(f"| {t['environment']['device']} | {r['scale']} | {num(r['rows_per_step'], 'd')} | "
                           f"{r['variant']} | {num(r['tokens_per_s'], '.0f')} | "
                           f"{num(r['peak_bytes_above_start'] / 2**20, '.0f')} | {versus} |")
        out.append("")
    _section_sps(out, figures)


def _section_round_cuda(out: list[str]) -> None:
    """What a round costs on a GPU, where the real weights cannot travel (``bench_round.py``)."""
    rounds = load("round_cuda")
    if rounds is None:
        return
    out.append(f"**What a round costs on a GPU** (`benchmarks/bench_round.py`, measured on {machine(rounds)}): a "
               "random-weight bf16 target of SmolLM2-135M's shapes and a random drafter of the shipped drafter's "
               "shapes, eager PyTorch, every drafted slot verified, "
               f"{num(rounds['max_new_tokens'], 'd')} new tokens per request, the median of "
               "interleaved runs. Random weights accept almost nothing, so only the cost is a result: the round in "
               "target steps is the τ a drafter must reach to break even there. The parts are host-side times: a "
               "part that only queues work shows little and the part that waits for it shows the rest, so only "
               "their sum is the round's cost. Eager PyTorch launches every kernel of a 135M model from Python, so "
               "a step is bound by the host, whose timings varied between two runs on the same machine (the "
               "other is in `gpu_check.log`): read these as rough.\n")
    out.append("| batch | drafting kernels | target step (ms) | round (target steps) | draft | verify forward | "
               "verification | other | outputs identical |")
    out.append("|---|---|---|---|---|---|---|---|---|")
    for r in rounds["rows"]:
        for backend in ("triton", "torch"):
            if backend not in r:
                continue
            b = r[backend]
            parts = b["round_parts_in_target_steps"]
            out.append(f"| {num(r['batch'], 'd')} | {backend} | {num(r['target_step_ms'], '.1f')} | "
                       f"{num(b['round_in_target_steps'], '.2f')} | {num(parts['draft'], '.2f')} | "
                       f"{num(parts['target'], '.2f')} | {num(parts['verify'], '.2f')} | "
                       f"{num(parts['schedule'] + parts['bookkeeping'], '.2f')} | "
                       f"{'yes' if b['identical_to_target_only'] else 'no'} |")
    out.append("")


def _section_sps(out: list[str], figures: Path) -> None:
    profiles = []
    for device in ("cpu", "cuda"):
        result = load(f"sps_{device}")
        if result is not None:
            profiles += [(result["environment"]["device"], p) for p in result["profiles"]]
    if not profiles:
        return
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    for device, p in profiles:
        ax = axes[0] if device == "cpu" else axes[1]
        rows = p["rows"]
        layout = f", {p['linear_layout']} layout" if "linear_layout" in p else ""
        ax.plot([r["tokens"] for r in rows], [1e3 * r["seconds"] for r in rows], marker="o",
                label=f"{p['model']} ({p['weights']} weights, {p['dtype']}{layout})")
    for ax, title in zip(axes, ("this CPU", "lent GPU")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tokens in the verify pass B")
        ax.set_ylabel("latency per pass (ms)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7)
    save(fig, figures, "sps.png")
    out.append("![SPS profiles](figures/sps.png)\n")
    out.append("*Figure 6. Verify-pass latency against tokens per pass, the SPS tables the scheduler plans with. "
               "The GPU curve for SmolLM2-135M is flat apart from noise (launch-bound eager PyTorch): on that "
               "target a GPU pass costs the same whatever the verify length. The first Qwen3-8B points are slower "
               "than the next ones, a warm-up artifact of one short run (one warm-up pass per point); the "
               "scheduler's tables are made non-decreasing by a running maximum, so the artifact flattens the "
               "planned curve at small B instead of bending it.*\n")
    _layout_sentence(out)


def _layout_sentence(out: list[str]) -> None:
    """What the few-row linear layouts do to the CPU verify pass, from the CPU profiles of every layout."""
    profiles = {}
    for name in ("sps_cpu", "sps_cpu_xeon"):
        result = load(name)
        layouts = {p.get("linear_layout"): p for p in result["profiles"]} if result else {}
        if {"skinny", "F.linear"} <= layouts.keys():
            profiles[name] = (result, layouts)
    if "sps_cpu" not in profiles:
        return

    def relative(name: str, layout: str) -> str:
        ms = {r["tokens"]: r["seconds"] for r in profiles[name][1][layout]["rows"]}
        return " / ".join(num(ms[b] / ms[1], ".2f") for b in (2, 4, 8))

    result, layouts = profiles["sps_cpu"]
    text = ("**The verify pass on a CPU.** With `F.linear`, a pass of 2 / 4 / 8 tokens costs "
            f"{relative('sps_cpu', 'F.linear')}× a one-token pass on {machine(result)}: with 2 to 64 rows the BLAS "
            "call is a GEMM that, going by these timings, pays for repacking each weight matrix, where one row is a "
            "matrix-vector product that reads it once. `dspark.linear` can compute "
            f"products of up to {num(layouts['skinny']['skinny_rows'], 'd')} rows as (W·xᵀ)ᵀ instead, which "
            f"streams each weight once: {relative('sps_cpu', 'skinny')}×.")
    if "sps_cpu_xeon" in profiles:
        text += (f" Another CPU's BLAS behaves otherwise: on {machine(profiles['sps_cpu_xeon'][0])}, the same "
                 f"passes cost {relative('sps_cpu_xeon', 'F.linear')}× with `F.linear` and "
                 f"{relative('sps_cpu_xeon', 'skinny')}× as (W·xᵀ)ᵀ.")
    packed = [name for name in profiles if {"packed", "packed from 4"} <= profiles[name][1].keys()]
    if packed:
        text += (" A third layout multiplies by weights that MKL has packed once for its GEMM kernel, so no call "
                 "repacks them (rows padded up to a bucket of 4, 8, 16, 32 or 64): "
                 + "; ".join(f"on {machine(profiles[name][0])}, {relative(name, 'packed')}× packed from 2 rows and "
                             f"{relative(name, 'packed from 4')}× from 4 rows (`F.linear` below)" for name in packed)
                 + ".")
    bf16 = [name for name in profiles
            if {"bf16 packed", "bf16 F.linear", "bf16 packed, stock attention"} <= profiles[name][1].keys()]
    for name in bf16:
        def ms(layout: str, tokens: int, name: str = name) -> float:
            return 1e3 * next(r["seconds"] for r in profiles[name][1][layout]["rows"] if r["tokens"] == tokens)

        extra = {b: ms("bf16 packed", b) / ms("bf16 packed, stock attention", b) - 1 for b in (1, 8)}
        text += (f" In bf16, on {machine(profiles[name][0])}, oneDNN multiplies by weights it has packed once, from "
                 "one row on, and its cost hardly grows with the rows: a pass of 2 / 4 / 8 tokens costs "
                 f"{relative(name, 'bf16 packed, stock attention')}× a one-token pass with stock attention, and "
                 f"{relative(name, 'bf16 packed')}× with the invariant attention above, whose loop over queries "
                 f"adds {num(100 * extra[1], '.0f')}% to a one-token pass and {num(100 * extra[8], '.0f')}% to an "
                 f"8-token one. Unpacked bf16 weights take {relative(name, 'bf16 F.linear')}× and "
                 f"{num(ms('bf16 F.linear', 1), '.1f')} ms for one token, against {num(ms('bf16 packed', 1), '.1f')} "
                 f"ms packed ({num(ms('bf16 packed, stock attention', 1), '.1f')} with stock attention) and "
                 f"{num(ms('F.linear', 1), '.1f')} ms in fp32 (timed minutes apart, not interleaved with the fp32 "
                 "passes: compare across dtypes with care).")
    out.append(text + " So the layout is not fixed: `dspark.runtime.profiling.choose_few_row_layout` profiles the "
               "verify pass in each at start-up, as the demo and `bench_e2e.py` do, and keeps the fastest for the "
               "process (the verify-pass profiles are single runs of a few repeats, so read differences under about "
               "10% as noise).\n")


def _section_compile_matrix(out: list[str]) -> None:
    matrices = [m for m in (load("compile_matrix_triton3.9"), load("compile_matrix_triton3.6")) if m is not None]
    if not matrices:
        return
    out.append("**Ahead-of-time compilation for Hopper and Blackwell** (`benchmarks/compile_matrix.py`, no GPU "
               "needed): every kernel, with every config its launcher would pick at the paper's shapes, compiled "
               "for sm_90 (H100/H200), sm_100 (B200/GB200) and sm_103 (GB300); registers and spills from `ptxas -v`, "
               "shared memory from the compiled kernel, tensor-core instructions read from the PTX. Worst cell per "
               "kernel and architecture:\n")
    out.append("| Triton | kernel | arch | configs | compiled | max registers | max spill (bytes) | max shared (KiB) "
               "| tensor cores |")
    out.append("|---|---|---|---|---|---|---|---|---|")
    for m in matrices:
        groups = dict.fromkeys((r["kernel"], r["arch"]) for r in m["rows"])
        for kernel, arch in groups:
            cells = [r for r in m["rows"] if r["kernel"] == kernel and r["arch"] == arch]
            ok = [r for r in cells if r["compiled"]]
            cores = {i for r in ok for i in ("wgmma", "tcgen05", "mma_sync") if r["instructions"][i]}
            out.append(f"| {m['triton']} | {kernel} | {arch} | {num(len(cells), 'd')} | {num(len(ok), 'd')} | "
                       f"{num(max(r['registers'] for r in ok), 'd')} | {num(max(r['spill_bytes'] for r in ok), 'd')} | "
                       f"{num(max(r['shared_bytes'] for r in ok) / 1024, '.0f')} | {', '.join(sorted(cores)) or '-'} |")
    out.append("")
    summaries = []
    for m in matrices:
        spilling = {arch: sorted({r["kernel"] for r in m["rows"] if r["arch"] in arch and r["compiled"]
                                  and r["spill_bytes"]}) for arch in (("sm_100", "sm_103"), ("sm_90",))}
        blackwell = ("every Blackwell config compiles with 0 spill bytes" if not spilling[("sm_100", "sm_103")]
                     else "on Blackwell, " + ", ".join(spilling[("sm_100", "sm_103")]) + " still spill")
        hopper = ("so does every Hopper config" if not spilling[("sm_90",)] else
                  "on Hopper, " + ", ".join(spilling[("sm_90",)])
                  + (" spills" if len(spilling[("sm_90",)]) == 1 else " spill") + " in some configs of the list")
        summaries.append(f"with Triton {m['triton']} (made on {machine(m)}), {blackwell}; {hopper}")
    out.append("Every listed config compiles within shared memory for all three architectures, and the products "
               "of attention (forward and backward) and of the Markov bias reach the tensor cores on each (wgmma, "
               "tcgen05; the Markov sampler's one-launch slot kernel for up to 4 requests multiplies 16-row tiles, "
               "on mma.sync). " + ". ".join(x[0].upper() + x[1:] for x in summaries) + ". The scheduler sorts its "
               "R·γ entries in registers, so one program holds them all.")
    out.append("No speed is claimed for Blackwell: no Blackwell GPU ran these kernels.\n")

"""paper/dspark.md is exactly what paper/build.py makes of benchmarks/results: no number typed by hand."""

import json
import re
import subprocess
from pathlib import Path

import pytest

import paper.build as builder
from paper import common, provenance, stats
from paper.sections import acceptance, limits, training

ROOT = Path(__file__).resolve().parents[1]
# Standalone numbers: not part of a word, an identifier, a version string, a decimal or a "§4.3" reference.
NUMBER = re.compile(r"(?<![\w.§])\d+(?:\.\d+)?(?![\w.])")
# Section, figure, slot and position numbers, γ and layer counts, "T = 0/1": structure, not measurements.
STRUCTURAL = {str(i) for i in range(17)}


def test_paper_text_is_generated_from_the_results(tmp_path, monkeypatch):
    monkeypatch.setattr(builder, "PAPER", tmp_path)  # figures go to a scratch folder
    committed = (ROOT / "paper" / "dspark.md").read_text(encoding="utf-8")
    assert builder.build() == committed, "paper/dspark.md is stale or edited by hand: run python -m paper.build"


def test_every_number_in_the_paper_comes_from_a_results_file_or_the_paper(tmp_path, monkeypatch):
    monkeypatch.setattr(builder, "PAPER", tmp_path)
    text = builder.build()
    stray = sorted({n for n in NUMBER.findall(text) if n not in common.printed and n not in STRUCTURAL})
    assert not stray, f"numbers in paper/dspark.md from neither a results file nor the DSpark paper: {stray}"
    assert common.quoted, "the paper's own numbers must be quoted beside ours"


def test_the_provenance_check_catches_a_typed_number(tmp_path, monkeypatch):
    monkeypatch.setattr(builder, "PAPER", tmp_path)
    text = builder.build() + "\nA speedup of 3.14× that nobody measured.\n"
    assert "3.14" in {n for n in NUMBER.findall(text) if n not in common.printed and n not in STRUCTURAL}


def test_provenance_is_what_git_says():
    """paper/provenance.json (which the text's provenance lines come from) against git, at the commit it was
    built at: each results file's commit, and the commits and files under its sources changed since."""
    recorded = json.loads(provenance.PROVENANCE.read_text(encoding="utf-8"))
    inside = subprocess.run(["git", "rev-parse", "--is-inside-work-tree"], cwd=ROOT, capture_output=True, text=True)
    if inside.returncode != 0:
        pytest.skip("not a git checkout: provenance can only be checked against git history")
    assert provenance.compute_provenance(head=recorded["built_at"]) == recorded


def test_every_section_with_results_cites_their_commits(tmp_path, monkeypatch):
    monkeypatch.setattr(builder, "PAPER", tmp_path)
    sections = builder.build().split("\n## ")[1:]
    for section in sections:
        if "Measured on" in section or "measured on" in section:
            assert "*Provenance (paper built at " in section, section.splitlines()[0]


def _acceptance_row(drafter, committed, rounds, domain="math"):
    return {"drafter": drafter, "temperature": 0.0, "domain": domain,
            "per_prompt": {"committed": committed, "rounds": rounds}}


def test_the_paired_gap_resamples_prompts_for_both_drafters_at_once():
    rows = [_acceptance_row("dspark", [30, 20, 10], [10, 10, 10]),
            _acceptance_row("dflash", [20, 20, 20], [10, 10, 10])]
    gap, low, high = stats.paired_gap(rows, "dspark", "dflash", 0.0, "math")
    assert gap == pytest.approx(0.0) and low < 0 < high
    # One drafter better on every prompt by the same margin: every resample sees exactly that margin.
    rows[1] = _acceptance_row("dflash", [25, 15, 5], [10, 10, 10])
    assert stats.paired_gap(rows, "dspark", "dflash", 0.0, "math") == pytest.approx((0.5, 0.5, 0.5))
    assert stats.paired_gap(rows, "dspark", "dflash", 0.0, "code") is None
    assert stats.paired_gap(rows[:1], "dspark", "dflash", 0.0, "math") is None


def test_the_eagle3_budget_sentence_says_what_differs_from_dspark():
    dspark = {"steps": 2000, "train_sequences": 7638, "train_answer_tokens": 1229250}
    assert common.eagle3_budget_sentence({"dspark": dspark}) == ""
    same = common.eagle3_budget_sentence({"dspark": dspark, "eagle3": dict(dspark)})
    assert "same number of steps" in same and "answer tokens" not in same
    regenerated = common.eagle3_budget_sentence({"dspark": dspark,
                                                  "eagle3": {**dspark, "train_answer_tokens": 1229327}})
    assert "(1229327 answer tokens; DSpark's held 1229250)" in regenerated
    shorter = common.eagle3_budget_sentence({"dspark": dspark, "eagle3": {**dspark, "steps": 900}})
    assert "trained for 900 steps on 7638 sequences, DSpark for 2000 on 7638" in shorter


def test_a_paired_gap_says_when_budgets_differ():
    assert acceptance._unequal_budget({"dspark": {"steps": 2000}, "dflash": {"steps": 2000}}, "dspark", "dflash") == ""
    assert acceptance._unequal_budget({"dspark": {"steps": 2000}}, "dspark", "dflash") == ""
    sentence = acceptance._unequal_budget({"dspark": {"steps": 4000}, "dflash": {"steps": 2000}}, "dspark", "dflash")
    assert "DSpark was trained for 4000 steps and DFlash for 2000" in sentence
    assert "not at equal training budget" in sentence
    ablation = acceptance._unequal_budget({"dspark-ce": {"steps": 1000}, "dspark": {"steps": 4000}}, "dspark",
                                          "dspark-ce")
    assert "DSpark was trained for 4000 steps and DSpark, CE only for 1000" in ablation


def test_dspark_is_compared_with_dflash_at_dflash_budget_when_an_earlier_checkpoint_was_decoded():
    assert common.label("dspark-steps8000") == "DSpark at 8000 steps"
    assert common.label("dspark-ce") == "DSpark, CE only"
    equal = {"dspark": {"steps": 8000}, "dflash": {"steps": 8000}}
    assert acceptance._at_budget_of(equal, ["dspark", "dflash"], "dflash") == "dspark"
    longer = {"dspark": {"steps": 10000}, "dflash": {"steps": 8000}, "dspark-steps8000": {"steps": 8000}}
    assert acceptance._at_budget_of(longer, ["dspark", "dflash", "dspark-steps8000"], "dflash") == "dspark-steps8000"
    assert acceptance._at_budget_of(longer, ["dspark", "dflash"], "dflash") == "dspark"  # not decoded: no pairs
    mislabelled = {**longer, "dspark-steps8000": {"steps": 6000}}
    assert acceptance._at_budget_of(mislabelled, ["dspark", "dflash", "dspark-steps8000"], "dflash") == "dspark"


def _continued(steps: list[int], rates: list[float]) -> dict:
    run = {"arguments": {"steps": steps[0], "lr": rates[0]}}
    for n, lr in zip(steps[1:], rates[1:]):
        run = {"arguments": {"steps": n, "lr": lr}, "parent": {"run": run}}
    return run


def test_continuations_are_described_run_by_run():
    assert common.continuation_sentence(_continued([4000], [1e-3])) == ""
    once = common.continuation_sentence(_continued([4000, 2000], [1e-3, 5e-4]))
    assert "continued once, for 2000 more steps at a peak learning rate of 0.0005 over" in once
    twice = common.continuation_sentence(_continued([4000, 2000, 2000], [1e-3, 5e-4, 5e-4]))
    assert "continued twice, each time for 2000 more steps at a peak learning rate of 0.0005 over" in twice
    uneven = common.continuation_sentence(_continued([4000, 2000, 2000, 4000], [1e-3, 5e-4, 5e-4, 5e-4]))
    assert "continued three times, for 2000, 2000 and 4000 more steps, each at a peak learning rate of 0.0005," \
        in uneven
    rates = common.continuation_sentence(_continued([4000, 2000, 2000], [1e-3, 5e-4, 1e-4]))
    assert "continued twice, for 2000 more steps at a peak learning rate of 0.0005, then for 2000 more steps at a " \
           "peak learning rate of 0.0001, over" in rates
    grouped = common.continuation_sentence(_continued([4000, 2000, 2000, 4000, 8000], [1e-3, 5e-4, 5e-4, 5e-4, 4e-4]))
    assert "continued four times, for 2000, 2000 and 4000 more steps at a peak learning rate of 0.0005, then for " \
           "8000 more steps at a peak learning rate of 0.0004, over" in grouped
    assert rates.startswith(" Its first 4000 steps were the recipe's;")


def test_the_generalization_table_names_each_run_and_a_mean_s_ingredients():
    def row(name: str, steps: int, held: float, **extra) -> dict:
        curve = [{"step": steps - 4000, "tau_prob": 2.14}, {"step": steps - 2000, "tau_prob": 2.09},
                 {"step": steps, "tau_prob": held}]
        return {"drafter": name, "steps": steps, "lr": 3e-4, "held_out": {"tau_prob": held, "ce": 3.2},
                "train": {"tau_prob": 2.7, "ce": 2.6}, "last_run_curve": curve, **extra}

    result = {"samples": 48, "rows": [
        row("shipped", 61000, 2.14, layers=2), row("parent", 57000, 2.11, layers=2),
        row("slow", 67000, 2.16, lr=1e-4, sampled_prompts=4096, sampled_temperature=0.7),
        row("noisy", 65000, 2.145, dropout=0.1),
        row("mean", 67000, 2.19, average_of=["shipped", "slow", "elsewhere"]),
        row("deep", 65000, 2.146, layers=3, lr=2e-4, dropout=0.1),
        row("chatty", 65000, 2.17, dropout=0.1, followup_prompts=6144)]}
    text = limits.generalization_bullet(result)
    assert "| 1 | `shipped` | shipped | 2.140 | 2.700 | 0.560 | 3.20 | 2.140 → 2.090 (59000) → 2.140 |" in text
    assert "| 2 | `parent` | its parent |" in text
    assert "| 3 | `slow` | 6000 steps more, 4096 sampled answers (T = 0.7), peak learning rate 0.0001 |" in text
    assert "| 4 | `noisy` | 4000 steps more, dropout 0.1 |" in text
    # A mean has no curve of its own; an ingredient outside the table is named by its directory.
    assert "| 5 | `mean` | mean of the weights of #1, #3 and `elsewhere` | 2.190 | 2.700 | 0.510 | 3.20 | – |" in text
    assert "| 6 | `deep` | 4000 steps more, grown to 3 layers, dropout 0.1, peak learning rate 0.0002 |" in text
    assert "| 7 | `chatty` | 4000 steps more, dropout 0.1, 6144 later ShareGPT turns |" in text
    assert "#3 raised held-out τ_prob (2.160), #4 left held-out τ_prob where it was (2.145), #6 left " \
           "held-out τ_prob where it was (2.146) and #7 raised held-out τ_prob (2.170)" in text
    assert "; layers grown on top aim at capacity (" in text
    # The grown drafter is set beside the continuation with its data and length: #4 (dropout 0.1, 4000 steps), not
    # #7, which added prompts.
    assert "The drafter grown to 3 layers (#6) ends level with #4, the same data and length with 2 layers at a " \
           "peak learning rate of 0.0003 instead of 0.0002 (held-out τ_prob 2.146 against 2.145, training τ_prob " \
           "2.700 against 2.700)." in text
    # Added prompts are set beside the run that differs only in lacking them.
    assert "With 6144 later ShareGPT turns added (#7), the drafter ends above #4, the same run without them " \
           "(held-out τ_prob 2.170 against 2.145, training τ_prob 2.700 against 2.700)." in text
    assert "which costs no training, scored above the best of its ingredients (2.190 against 2.160)" in text


def test_a_continuation_that_clears_three_seeds_spread_is_judged_by_decoding():
    def row(name: str, steps: int, held: float, **extra) -> dict:
        return {"drafter": name, "steps": steps, "lr": 3e-4, "layers": 2, "held_out": {"tau_prob": held, "ce": 3.2},
                "train": {"tau_prob": 2.7, "ce": 2.6}, **extra}

    result = {"samples": 48, "rows": [row("shipped-dir", 61000, 2.14), row("twin-dir", 65000, 2.141),
                                      row("best-dir", 65000, 2.18, followup_prompts=6144)]}
    # Per prompt, τ is committed tokens over rounds: the candidate gains 0.4 on every math prompt, ties on code
    # and loses 0.4 on every chat prompt, so each bootstrap interval is a single point on a known side of zero.
    committed = {"math": 24, "code": 20, "chat": 16}

    def decoded_rows(name: str, candidate: bool) -> list[dict]:
        return [{"drafter": name, "temperature": 0.0, "domain": domain, "prompts": 4,
                 "tau": (committed[domain] if candidate else 20) / 10,
                 "per_prompt": {"committed": [committed[domain] if candidate else 20] * 4, "rounds": [10] * 4}}
                for domain in ("math", "code", "chat")]

    directories = {"shipped": "a/shipped-dir", "new": "/b/best-dir", "twin": "c/twin-dir"}
    decoded = {"max_new_tokens": 64, "drafters": directories,
               "rows": decoded_rows("shipped", False) + decoded_rows("new", True) + decoded_rows("twin", False)}
    text = limits.generalization_bullet(result, decoded)
    assert "None of them was shipped" not in text
    assert "The best, #3, clears three times the seed spread over the shipped drafter (+0.040), so it was " \
           "decoded before deciding whether to ship it: greedy, every slot verified, 4 held-out prompts a " \
           "domain and 64 new tokens (`acceptance_candidates_cpu`), it reaches τ 2.000 on average against the " \
           "shipped drafter's 2.000, ahead in math, behind in chat, level in code (τ difference paired over " \
           "prompts, with its 95% bootstrap interval: math +0.400 [+0.400, +0.400]; code +0.000 [+0.000, +0.000]; " \
           "chat -0.400 [-0.400, -0.400])." in text
    assert "#2 (held-out τ_prob 2.141), decoded beside them, reaches 2.000; against it #3 is ahead in math, " \
           "behind in chat, level in code (" in text
    assert text.endswith("The shipped drafter stays: what #3 gained on held-out sequences shows in decoding as "
                         "+0.000 τ on average.")
    undecoded = limits.generalization_bullet(result, None)
    assert undecoded.endswith("(+0.040), and is to be decoded before deciding whether to ship it (`python "
                              "benchmarks/bench_acceptance.py --drafters shipped=DIR best=DIR --temperatures 0 "
                              "--name acceptance_candidates_cpu`).")


def test_rows_kept_from_earlier_runs_say_when_they_were_measured_and_decoded():
    def row(name: str, steps: int, held: float, **extra) -> dict:
        return {"drafter": name, "steps": steps, "lr": 3e-4, "layers": 2, "held_out": {"tau_prob": held, "ce": 3.2},
                "train": {"tau_prob": 2.7, "ce": 2.6}, **extra}

    then = {"commit": "abc1234", "date": "2026-12-05T20:46:20+00:00"}
    environment = {"commit": "def5678", "device": "cpu", "cpu_model": "AMD EPYC", "cpu_count": 2,
                   "torch": "2.13.0+cpu", "triton": "3.9.0", "processor": "x86_64"}
    result = {"samples": 48, "environment": environment, "rows": [
        row("shipped-dir", 61000, 2.14), row("old-dir", 65000, 2.172, followup_prompts=6144, measured=then),
        row("new-dir", 63500, 2.2, followup_prompts=32768)]}
    decoded_rows = [{"drafter": name, "temperature": 0.0, "domain": domain, "prompts": 4, "tau": 2.0,
                     "per_prompt": {"committed": [20] * 4, "rounds": [10] * 4}}
                    for name in ("shipped", "old", "new") for domain in ("math", "code", "chat")]
    decoded = {"max_new_tokens": 64, "rows": decoded_rows, "reused": {"old": then},
               "drafters": {"shipped": "a/shipped-dir", "old": "b/old-dir", "new": "c/new-dir"}}
    text = limits.generalization_bullet(result, decoded)
    assert "Rows of drafters that are no longer on disk were kept from the runs that measured them (`--keep`), on " \
           "the same sequences: #2 at commit abc1234 (2026-12-05); #1 and #3 in this run (CPU (AMD EPYC, 2 cores), " \
           "torch 2.13.0+cpu, Triton 3.9.0, commit def5678)." in text
    assert "The rows of #2 are those decoded at commit abc1234 (2026-12-05), on the same prompts with the same " \
           "settings (`--reuse`, `--keep`)." in text
    assert {"abc1234", "2026", "12", "05"} <= common.printed
    result["rows"][1].pop("measured")
    decoded.pop("reused")
    fresh = limits.generalization_bullet(result, decoded)
    assert "--keep" not in fresh and "no longer on disk" not in fresh


def test_the_limits_say_whether_a_grown_layer_paid():
    def row(name: str, steps: int, held: float, layers: int, **extra) -> dict:
        return {"drafter": name, "steps": steps, "layers": layers, "held_out": {"tau_prob": held}, **extra}

    shipped = row("shipped", 61000, 2.14, 2)
    assert limits.grown_sentence(None) == ""
    assert limits.grown_sentence({"rows": [shipped, row("longer", 65000, 2.15, 2)]}) == ""
    flat = limits.grown_sentence({"rows": [shipped, row("deep", 65000, 2.146, 3),
                                            row("mean", 65000, 2.2, 3, average_of=["deep", "shipped"])]})
    assert flat == (" Growing layers onto the shipped drafter did not pay: at 3 layers and 4000 steps more it reached "
                    "held-out τ_prob 2.146 against 2.140 (below), so more layers would mean training from scratch as "
                    "well.")
    # A gain of three seeds' spread (0.03) is a result, not a limit: the sentence is left out.
    assert limits.grown_sentence({"rows": [shipped, row("deep", 65000, 2.18, 3)]}) == ""


def test_a_continuation_that_added_prompt_pools_says_so_and_from_which_step():
    plain = _continued([4000, 2000], [1e-3, 5e-4])
    assert "over the same sequences (" in common.continuation_sentence(plain)
    assert common.pool_start_steps(plain) == {}
    with_code = _continued([4000, 2000, 8000], [1e-3, 5e-4, 3e-4])
    with_code["arguments"]["code_prompts"] = 1600
    sentence = common.continuation_sentence(with_code)
    assert "over the same ShareGPT sequences, the last run with 1600 standard-library code prompts added (" in sentence
    assert common.pool_start_steps(with_code) == {"code": 6000}
    both = {"arguments": {"steps": 6000, "lr": 3e-4, "code_prompts": 1600, "math_prompts": 1200},
            "parent": {"run": with_code}}
    sentence = common.continuation_sentence(both)
    assert "the last 2 runs with 1600 standard-library code prompts added and the last run with 1200 word problems " \
           "added (§2)" in sentence
    assert common.pool_start_steps(both) == {"code": 6000, "math": 14000}
    three = {"arguments": {"steps": 4000, "lr": 3e-4, "code_prompts": 1600, "math_prompts": 1200,
                           "math2_prompts": 800}, "parent": {"run": both}}
    assert "the last 3 runs with 1600 standard-library code prompts added, the last 2 runs with 1200 word problems " \
           "added and the last run with 800 second-series word problems added (§2)" in \
           common.continuation_sentence(three)
    assert acceptance.shipped_pools_clause({"code_sequences": 1, "math_sequences": 1, "math2_sequences": 1}) == \
        " (the shipped DSpark drafter's later training also on standard-library code prompts, word problems and " \
        "second-series word problems)"
    four = {"arguments": {"steps": 3000, "lr": 3e-4, "code_prompts": 1600, "math_prompts": 1200,
                          "math2_prompts": 800, "math3_prompts": 600}, "parent": {"run": three}}
    assert "the last 4 runs with 1600 standard-library code prompts added, the last 3 runs with 1200 word problems " \
           "added, the last 2 runs with 800 second-series word problems added and the last run with 600 " \
           "third-series word problems added (§2)" in common.continuation_sentence(four)
    assert common.pool_counts({"math2_sequences": 800, "math3_sequences": 600}) == \
        "800 of them second-series word problems, 600 third-series word problems"
    five = {"arguments": {"steps": 2000, "lr": 3e-4, "code_prompts": 1600, "math_prompts": 1200,
                          "math2_prompts": 800, "math3_prompts": 600, "code2_prompts": 400}, "parent": {"run": four}}
    assert "and the last run with 400 second-series code prompts added (§2)" in common.continuation_sentence(five)
    assert common.pool_counts({"code_sequences": 1600, "code2_sequences": 400}) == \
        "1600 of them code prompts, 400 second-series code prompts"
    assert common.pool_counts({"code_sequences": 1600, "math_sequences": 1200}) == \
        "1600 of them code prompts, 1200 word problems"
    assert common.pool_counts({"code_sequences": 0, "math_sequences": 1200, "math2_sequences": 800}) == \
        "1200 of them word problems, 800 second-series word problems"
    assert common.pool_counts({"code_sequences": 0}) == ""


def test_the_phases_each_arm_ran_are_counted_from_the_runs_it_recorded():
    def arms(**runs):
        return {name: {"run": _continued([4000] + [2000] * (n - 1), [1e-3] + [5e-4] * (n - 1))}
                for name, n in runs.items()}

    assert training.phases_clause(arms(dspark=1, dflash=1)) == ""
    assert training.phases_clause(arms(dspark=5, dflash=3, eagle3=1)) == \
        ", each phase continuing the drafter the phase before it wrote (phases run: DSpark 5; DFlash 3; " \
        "EAGLE-3-style 1)"


def test_the_command_the_paper_gives_names_the_recipes_arms():
    recipe = json.loads(training.RECIPE.read_text(encoding="utf-8"))
    command = training.recipe_command()
    assert command.startswith("`python -m dspark train --config benchmarks/recipes/smollm2_drafter.json [--arm ")
    assert all(arm in command for arm in recipe["arms"])


def test_dspark_trained_longer_is_also_read_at_dflash_steps():
    dflash = {"steps": 8000, "final": {"eval_tau_prob": 1.6}}
    longer = {"steps": 12000, "curve": [{"step": 8000, "eval_tau_prob": 1.8}, {"step": 12000, "eval_tau_prob": 1.9}]}
    assert training._at_dflash_steps({"dspark": longer, "dflash": dflash}) == \
        " At DFlash's 8000 steps DSpark had 1.800 against DFlash's 1.600."
    assert training._at_dflash_steps({"dspark": {**longer, "steps": 8000}, "dflash": dflash}) == ""
    assert training._at_dflash_steps({"dspark": {**longer, "curve": []}, "dflash": dflash}) == ""


def test_a_reweighted_loss_is_named_and_the_recipe_loss_is_not():
    assert acceptance.loss_difference({"ce_weight": None, "l1_weight": None}) == ""
    assert acceptance.loss_difference({}) == ""
    sentence = acceptance.loss_difference({"ce_weight": 1.0, "l1_weight": 0.0})
    assert "cross-entropy by 1 and L1 by 0, where the recipe weighs them by 0.1 and 0.9" in sentence


def test_paired_cells_need_every_domain_at_both_temperatures():
    def row(name, temperature, domain, committed, rounds):
        return {"drafter": name, "temperature": temperature, "domain": domain,
                "per_prompt": {"committed": committed, "rounds": rounds}}

    rows = [row(n, t, d, c, [2, 2]) for n, c in (("a", [4, 4]), ("b", [2, 2]))
            for t in (0.0, 1.0) for d in common.DOMAINS]
    cells = acceptance._paired_cells(rows, "a", "b")
    assert cells[0.0].startswith("math +1.000 [+1.000, +1.000]")  # τ 2 against 1 on every prompt
    assert acceptance._paired_cells(rows[:-1], "a", "b") is None


def test_a_named_dtype_is_not_an_earlier_recipe_where_the_recipe_says_auto():
    recipe = {"precision": "auto", "lr": 0.001, "steps": 4000}
    assert common.recipe_difference({"precision": "bf16", "lr": 0.001, "steps": 2000}, recipe) == ""
    assert "lr 0.003" in common.recipe_difference({"precision": "bf16", "lr": 0.003}, recipe)
    assert "precision fp32" in common.recipe_difference({"precision": "fp32"}, {"precision": "bf16"})


def test_a_continuation_on_another_loss_is_named_and_set_beside_its_twin():
    def row(name: str, steps: int, held: float, **extra) -> dict:
        return {"drafter": name, "steps": steps, "lr": 3e-4, "layers": 2, "followup_prompts": 32768,
                "held_out": {"tau_prob": held, "ce": 3.1}, "train": {"tau_prob": 2.6, "ce": 2.7}, **extra}

    shipped = dict(row("shipped", 61000, 2.141), followup_prompts=0)
    result = {"samples": 48, "rows": [shipped, row("l1", 63500, 2.179),
                                      row("ce", 63500, 2.15, ce_weight=1.0, l1_weight=0.0),
                                      row("mixed", 63500, 2.18, ce_weight=0.5, l1_weight=0.5)]}
    text = limits.generalization_bullet(result)
    assert "| 3 | `ce` | 2500 steps more, 32768 later ShareGPT turns, cross-entropy alone |" in text
    assert "| 4 | `mixed` | 2500 steps more, 32768 later ShareGPT turns, 0.5·CE + 0.5·L1 |" in text
    assert "Trained on cross-entropy alone (#3), the drafter ends below #2, the same run on the recipe's loss " \
           "(held-out τ_prob 2.150 against 2.179, CE 3.10 against 3.10)" in text
    assert "Trained on 0.5·CE + 0.5·L1 (#4), the drafter ends level with #2" in text


def _curve_result(taus: dict[str, list[tuple[int, float, float, float]]]) -> dict:
    """An acceptance result of greedy rows only: ``{drafter: [(steps, math, code, chat)]}`` checkpoints, each
    having seen 640 answer tokens a step."""
    rows, meta = [], {}
    for arm, points in taus.items():
        for steps, *values in points:
            name = arm if steps == points[-1][0] else f"{arm}-steps{steps}"
            meta[name] = {"steps": steps, "curve": [{"step": steps, "answer_tokens_seen": 640 * steps}]}
            rows += [{"drafter": name, "temperature": 0.0, "domain": d, "tau": t, "prompts": 24}
                     for d, t in zip(common.DOMAINS, values)]
    return {"rows": rows, "drafter_metadata": meta, "max_new_tokens": 64}


def test_decoded_tau_is_fitted_per_doubling_of_the_tokens_seen():
    result = _curve_result({"dspark": [(1000, 1.5, 1.4, 1.3), (2000, 1.6, 1.5, 1.4), (4000, 1.7, 1.6, 1.5),
                                       (8000, 1.8, 1.7, 1.5)],
                            "dflash": [(1000, 1.45, 1.35, 1.3), (2000, 1.5, 1.4, 1.45)]})
    arms = common.decoded_points(result)
    assert [p["name"] for p in arms["dspark"]] == ["dspark-steps1000", "dspark-steps2000", "dspark-steps4000",
                                                   "dspark"]
    assert arms["dspark"][-1]["tokens"] == 640 * 8000
    assert stats.slope_per_doubling(arms["dspark"][:3]) == pytest.approx(0.1)
    assert stats.slope_per_doubling(arms["dspark"], lambda p: p["tau"]["math"]) == pytest.approx(0.1)
    # At least a quarter of the last checkpoint's tokens: 2000, 4000 and 8000 steps, where chat gained 0.05 a doubling.
    assert [p["steps"] for p in common.late_points(arms["dspark"])] == [2000, 4000, 8000]
    sentence = limits._decoded_doublings_to(result, 2.5, seconds=3600.0)
    mean = stats.slope_per_doubling(arms["dspark"])
    doublings = (2.5 - arms["dspark"][-1]["mean"]) / mean
    assert f"gained {mean:.2f} per doubling" in sentence
    assert f"about {doublings:.0f} more doublings" in sentence
    assert f"about {2 ** doublings:.0f} hours of training" in sentence
    assert "chat gained 0.05 per doubling" in sentence
    assert limits._decoded_doublings_to(None, 2.5, None) == ""
    flat = _curve_result({"dspark": [(1000, 1.5, 1.5, 1.5), (2000, 1.5, 1.5, 1.5), (4000, 1.5, 1.4, 1.5)]})
    assert "has not risen with the tokens seen; it stands at 1.467" in limits._decoded_doublings_to(flat, 2.5, None)


def test_the_decoded_curve_compares_the_arms_at_equal_steps(tmp_path, monkeypatch):
    result = _curve_result({"dspark": [(1000, 1.5, 1.4, 1.3), (2000, 1.6, 1.5, 1.4), (4000, 1.7, 1.6, 1.5)],
                            "dflash": [(1000, 1.45, 1.35, 1.3), (2000, 1.6, 1.5, 1.45)]})
    monkeypatch.setattr(training, "load", lambda name, cited=True: result if name == "acceptance_curve_cpu" else None)
    out: list[str] = []
    training._decoded_curve(out, tmp_path)
    text = "\n".join(out)
    assert "Mean τ rose from 1.400 to 1.600, about 0.10 per doubling" in text
    assert "From 1000 steps on (3 checkpoints) the rates were math +0.10, code +0.10, chat +0.10." in text
    assert "At the 1000 and 2000 steps where both arms have a checkpoint on the same data, DSpark's mean τ is above " \
           "DFlash's at 1 of 2 (1.400 against 1.367; 1.500 against 1.517)." in text
    assert (tmp_path / "decoded_tau_vs_tokens.png").stat().st_size > 0


def test_the_decoded_curve_names_the_pools_that_joined_its_late_stretch(tmp_path, monkeypatch):
    result = _curve_result({"dspark": [(1000, 1.5, 1.4, 1.4), (2000, 1.6, 1.5, 1.41), (4000, 1.8, 1.6, 1.42)]})
    run = _continued([1000, 1000, 2000], [1e-3, 5e-4, 3e-4])
    run["arguments"]["math_prompts"] = 4000
    curve = [{"step": steps, "answer_tokens_seen": 640 * steps} for steps in (2000, 4000)]
    result["drafter_metadata"]["dspark"].update(run=run, curve=curve)
    monkeypatch.setattr(training, "load", lambda name, cited=True: result if name == "acceptance_curve_cpu" else None)
    out: list[str] = []
    training._decoded_curve(out, tmp_path)
    assert "the rates were math +0.15, code +0.10, chat +0.01, while word problems joined the data (§2); chat, whose " \
           "ShareGPT data stayed the same, stayed nearly flat. The curve is that of this drafter's path" in out[0]

"""Export to the speculators format and back; reduced draft vocabularies end to end."""

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

import dspark
from dspark.runtime.decoding import SamplingConfig, generate, speculative_generate
from dspark.testing import randomize_
from dspark.vocab import build_draft_vocab, d2t_offsets, token_counts
from tests.e2e.conftest import drafter_for, tiny_target

SPECULATORS_PYTHON = os.environ.get("DSPARK_SPECULATORS_PYTHON")


def _draft_outputs(drafter, target, prompt, seed=0):
    step_state = target.new_state(1)
    ids = torch.tensor([prompt])
    step = target.forward(step_state, ids, torch.arange(len(prompt))[None], torch.ones_like(ids, dtype=torch.bool))
    cache = drafter.new_cache(1)
    drafter.extend_cache(cache, step.taps, torch.tensor([len(prompt) - 1]))
    u = torch.rand(1, drafter.config.block_size, generator=torch.Generator().manual_seed(seed))
    return drafter.draft(torch.tensor([prompt[-1]]), cache, u, temperature=1.0)


@pytest.mark.parametrize("head, reduced", [("vanilla", False), ("vanilla", True), ("rnn", False)])
def test_export_then_load_gives_identical_drafts(tmp_path, head, reduced):
    target = tiny_target()
    overrides = dict(markov_head_type=head, draft_vocab_size=40 if reduced else None)
    drafter = drafter_for(target, **overrides)
    if reduced:
        counts = token_counts([torch.randint(0, 64, (500,), generator=torch.Generator().manual_seed(1))], 64)
        drafter.set_draft_vocab(build_draft_vocab(counts, 40), target.lm_head_weight())
    drafter.sts_temperatures.copy_(torch.linspace(0.8, 1.6, drafter.config.block_size))
    with torch.no_grad():  # bf16 export: make every weight exactly representable
        for p in drafter.parameters():
            p.copy_(p.bfloat16().float())
    if head == "rnn":
        with pytest.warns(UserWarning, match="vLLM serves only"):
            dspark.export(drafter, tmp_path, verifier_name_or_path="tiny", verifier_architectures=["LlamaForCausalLM"])
    else:
        dspark.export(drafter, tmp_path, verifier_name_or_path="tiny", verifier_architectures=["LlamaForCausalLM"])
    with pytest.raises(ValueError, match="verifier="):  # the export leaves the embedding to the verifier
        dspark.load(tmp_path)
    # The verifier's weights as the drafter holds them (rounded to bf16 above).
    loaded = dspark.load(tmp_path, verifier=(target.embed_weight().bfloat16().float(),
                                             target.lm_head_weight().bfloat16().float()))
    assert loaded.config == drafter.config
    a, b = _draft_outputs(drafter, target, [3, 9, 4, 1, 5]), _draft_outputs(loaded, target, [3, 9, 4, 1, 5])
    for name in ("tokens", "draft_probs", "confidence_logits", "confidence", "survival"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name


def test_exported_config_has_the_speculators_keys(tmp_path):
    target = tiny_target(taps=(-1, 3))
    drafter = drafter_for(target, draft_vocab_size=50)
    dspark.export(drafter, tmp_path, verifier_name_or_path="org/model", verifier_architectures=["LlamaForCausalLM"])
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["speculators_model_type"] == "dspark" and cfg["architectures"] == ["DSparkSpeculator"]
    assert cfg["aux_hidden_state_layer_ids"] == [0, 4]  # 1-based layer boundaries: embeddings are 0
    assert cfg["sample_from_anchor"] is True and "sample_from_anchor" in cfg
    proposal = cfg["speculators_config"]["proposal_methods"][0]
    assert proposal["speculative_tokens"] == cfg["block_size"] == drafter.config.block_size
    assert cfg["speculators_config"]["default_proposal_method"] == proposal["proposal_type"] == "greedy"
    assert cfg["transformer_layer_config"]["num_hidden_layers"] == drafter.config.num_draft_layers
    import safetensors.torch

    tensors = safetensors.torch.load_file(tmp_path / "model.safetensors")
    assert torch.equal(tensors["d2t"], d2t_offsets(drafter.draft_to_target))
    assert tensors["t2d"].dtype == torch.bool and int(tensors["t2d"].sum()) == 50
    for name in ("fc.weight", "hidden_norm.weight", "norm.weight", "lm_head.weight",
                 "markov_head.markov_w1.weight", "markov_head.markov_w2.weight", "confidence_head.proj.weight"):
        assert name in tensors
    assert "embed_tokens.weight" not in tensors  # the verifier's, as speculators' own checkpoints leave it
    assert tensors["lm_head.weight"].shape[0] == 50 and tensors["markov_head.markov_w1.weight"].shape[0] == 64


def test_dflash_checkpoint_loads_and_z_lab_layout_is_refused(tmp_path):
    target = tiny_target()
    dflash = drafter_for(target, markov_rank=0, enable_confidence_head=False)
    dspark.export(dflash, tmp_path / "dflash", verifier_name_or_path="t", verifier_architectures=["X"])
    assert json.loads((tmp_path / "dflash/config.json").read_text())["speculators_model_type"] == "dflash"
    loaded = dspark.load(tmp_path / "dflash", verifier=target)
    assert not loaded.config.has_markov and not loaded.config.enable_confidence_head
    cfg = json.loads((tmp_path / "dflash/config.json").read_text())
    cfg["sample_from_anchor"] = False
    (tmp_path / "dflash/config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="z-lab"):
        dspark.load(tmp_path / "dflash", verifier=target)


def test_drafter_without_qk_norm_is_refused(tmp_path):
    target = tiny_target()
    drafter = drafter_for(target, qk_norm=False)
    with pytest.raises(ValueError, match="q/k norms"):
        dspark.export(drafter, tmp_path, verifier_name_or_path="t", verifier_architectures=["X"])


def test_reduced_vocabulary_decodes_losslessly():
    """W1 over the target vocabulary, W2 and lm_head over 40 frequent tokens: greedy output unchanged."""
    target = tiny_target()
    prompts = [[1, 2, 3], [7, 8, 9, 10], [5]]
    config = SamplingConfig(max_new_tokens=16)
    plain = generate(target, prompts, config).tokens
    counts = token_counts([torch.tensor(p + t) for p, t in zip(prompts, plain)], 64)
    drafter = drafter_for(target, draft_vocab_size=40)
    drafter.set_draft_vocab(build_draft_vocab(counts, 40), target.lm_head_weight())
    assert speculative_generate(target, drafter, prompts, config).tokens == plain
    out = _draft_outputs(drafter, target, [1, 2, 3])
    assert bool(torch.isin(out.tokens, drafter.draft_to_target).all())
    outside = torch.ones(64, dtype=torch.bool)
    outside[drafter.draft_to_target] = False
    assert float(out.draft_probs[..., outside].abs().sum()) == 0


def test_build_draft_vocab_keeps_frequent_and_required_tokens():
    counts = torch.tensor([5, 0, 9, 9, 1, 0])
    assert build_draft_vocab(counts, 3).tolist() == [0, 2, 3]
    assert build_draft_vocab(counts, 3, always=[5]).tolist() == [2, 3, 5]
    with pytest.raises(ValueError, match="draft_vocab_size"):
        build_draft_vocab(counts, 7)


@pytest.mark.skipif(SPECULATORS_PYTHON is None and not os.environ.get("CI"),
                    reason="set DSPARK_SPECULATORS_PYTHON to a Python with speculators installed (.ci/run does)")
@pytest.mark.parametrize("reduced", [False, True])
def test_round_trip_with_speculators_both_ways(tmp_path, reduced):
    """dspark.export → speculators, and speculators' save_pretrained → dspark.load: equal block logits.

    speculators runs its own training forward on one block (fp32); dspark runs ``training_logits`` in fp64 on
    the same inputs. 1e-4 bounds fp32 rounding through one draft layer at these sizes (measured ≈ 2e-6);
    a wrong mask, rope θ or head layout moves logits by O(1).
    """
    if SPECULATORS_PYTHON is None:
        pytest.fail("CI must provide DSPARK_SPECULATORS_PYTHON (see .ci/run)")
    target = tiny_target()
    drafter = randomize_(drafter_for(target, markov_rank=8, draft_vocab_size=40 if reduced else None), 5, std=0.3)
    drafter.load_target_embeddings(target.embed_weight(), target.lm_head_weight())  # a served drafter's are these
    if reduced:
        counts = token_counts([torch.randint(0, 64, (500,), generator=torch.Generator().manual_seed(1))], 64)
        drafter.set_draft_vocab(build_draft_vocab(counts, 40), target.lm_head_weight())
    verifier = tmp_path / "verifier"
    target.model.save_pretrained(verifier)
    dspark.export(drafter, tmp_path / "exported", verifier_name_or_path=str(verifier),
                  verifier_architectures=["LlamaForCausalLM"], dtype=torch.float32)
    script = Path(__file__).with_name("speculators_check.py")
    result = subprocess.run([SPECULATORS_PYTHON, str(script), str(tmp_path / "exported"), str(tmp_path / "written"),
                             str(tmp_path / "report.pt")], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    report = torch.load(tmp_path / "report.pt", weights_only=True)
    assert report["config_type"] == "DSparkSpeculatorConfig"
    assert report["missing"] == [] and report["unexpected"] == [], report

    written = json.loads((tmp_path / "written" / "config.json").read_text())
    assert written["transformer_layer_config"]["rope_parameters"]["rope_theta"] == 1e5
    with pytest.raises(ValueError, match="verifier="):
        dspark.load(tmp_path / "written")
    loaded = dspark.load(tmp_path / "written", verifier=target)
    assert loaded.checkpoint_format == "speculators" and loaded.config.rope_theta == 1e5

    ids, taps, p = report["input_ids"], report["taps"].double(), report["anchor"]
    gamma = drafter.config.block_size
    for name, model in (("exported", drafter), ("written", loaded)):
        with torch.no_grad():
            logits, confidence = model.double().training_logits(ids[:, p][None], torch.tensor([[p]]), taps,
                                                                ids[:, p + 1:p + gamma][None])
        torch.testing.assert_close(logits[0, 0], report[f"{name}_logits"].double(), rtol=1e-4, atol=1e-4,
                                   msg=lambda m, name=name: f"{name}: draft logits differ from speculators'\n{m}")
        torch.testing.assert_close(confidence[0, 0], report[f"{name}_confidence"].double(), rtol=1e-4, atol=1e-4,
                                   msg=lambda m, name=name: f"{name}: confidence logits differ\n{m}")


def test_load_reads_dspark_checkpoints_and_says_which_format(tmp_path):
    from dspark.files.checkpoint import save_drafter

    target = tiny_target()
    drafter = drafter_for(target)
    save_drafter(drafter, tmp_path / "own")
    with pytest.raises(ValueError, match="pass the target"):
        dspark.load(tmp_path / "own")
    loaded = dspark.load(tmp_path / "own", verifier=target)
    assert loaded.checkpoint_format == "dspark" and loaded.config == drafter.config
    a, b = _draft_outputs(drafter, target, [3, 9, 4]), _draft_outputs(loaded, target, [3, 9, 4])
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.draft_probs, b.draft_probs)


@pytest.mark.parametrize("reduced", [False, True])
def test_speculators_checkpoints_without_shared_weights_take_them_from_the_verifier(tmp_path, reduced):
    import safetensors.torch

    target = tiny_target()
    drafter = drafter_for(target, draft_vocab_size=40 if reduced else None)
    if reduced:
        counts = token_counts([torch.randint(0, 64, (500,), generator=torch.Generator().manual_seed(1))], 64)
        drafter.set_draft_vocab(build_draft_vocab(counts, 40), target.lm_head_weight())
    dspark.export(drafter, tmp_path, verifier_name_or_path="t", verifier_architectures=["X"], dtype=torch.float32)
    # The export writes what speculators' own save_pretrained writes: no embedding, and an LM head only when the
    # draft vocabulary is reduced.
    tensors = safetensors.torch.load_file(tmp_path / "model.safetensors")
    assert "embed_tokens.weight" not in tensors and ("lm_head.weight" in tensors) == reduced
    with pytest.raises(ValueError, match="verifier="):
        dspark.load(tmp_path)
    for verifier in (target, (target.embed_weight(), target.lm_head_weight())):
        loaded = dspark.load(tmp_path, verifier=verifier)
        assert loaded.checkpoint_format == "speculators"
        a, b = _draft_outputs(drafter, target, [3, 9, 4]), _draft_outputs(loaded, target, [3, 9, 4])
        assert torch.equal(a.tokens, b.tokens) and torch.equal(a.draft_probs, b.draft_probs)


def test_rope_theta_is_read_from_rope_parameters_and_scaled_rope_is_refused(tmp_path):
    target = tiny_target()
    dspark.export(drafter_for(target), tmp_path, verifier_name_or_path="t", verifier_architectures=["X"])
    path = tmp_path / "config.json"
    cfg = json.loads(path.read_text())
    layer = cfg["transformer_layer_config"]
    layer.pop("rope_theta")
    layer["rope_parameters"] = {"rope_type": "default", "rope_theta": 100000.0}  # transformers 5's form
    path.write_text(json.dumps(cfg))
    assert dspark.load(tmp_path, verifier=target).config.rope_theta == 100000.0
    layer["rope_parameters"]["rope_type"] = "yarn"
    path.write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="RoPE type 'yarn'"):
        dspark.load(tmp_path, verifier=target)

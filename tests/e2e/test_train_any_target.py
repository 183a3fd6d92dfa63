"""``python -m dspark train --target DIR --prompts FILE``: the whole pipeline on tiny targets of every family the
adapter supports, each saved as a Hugging Face directory with a tokenizer of its own."""

import json

import pytest
import torch

from dspark.files.export import load
from dspark.runtime.decoding import SamplingConfig, generate, speculative_generate
from dspark.runtime.target import load_target
from dspark.scheduler import FixedLength
from dspark.train.any_target import train_for_target
from dspark.train.pools import read_prompts
from tests.e2e.conftest import save_tiny_target, tiny_target

WORDS = ["cat", "river", "boat", "seven", "number", "story", "add", "dog", "twelve", "function"]
# A few steps on a few prompts: enough to run every stage; no quality is asserted.
TINY = dict(num_prompts=12, max_new_tokens=12, steps=4, num_draft_layers=1, block_size=4, markov_rank=8,
            num_anchors=4, sequences_per_step=2, eval_every=2, checkpoint_every=2, progress=False)


def prompt_file(path, count: int = 12):
    """A JSONL prompt file mixing the three record shapes :func:`read_prompts` takes."""
    lines = []
    for i in range(count):
        text = f"Tell me about the {WORDS[i % len(WORDS)]} and the {WORDS[(3 * i + 1) % len(WORDS)]} {i}."
        record = [text, {"prompt": text},
                  {"messages": [{"role": "user", "content": text}, {"role": "assistant", "content": "ok"}]}][i % 3]
        lines.append(json.dumps(record))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("architecture", ["llama", "qwen3", "mistral", "gemma3"])
def test_trained_drafter_decodes_losslessly(tmp_path, architecture):
    """The command's drafter loads with :func:`dspark.load` and decodes greedily to the target's own tokens;
    ``run.json`` records the choices read from the target's config, and the spent checkpoint is removed."""
    model = save_tiny_target(tmp_path / "model", architecture)
    out = train_for_target(model, prompt_file(tmp_path / "prompts.jsonl"), tmp_path / "drafter", **TINY)
    run = json.loads((tmp_path / "drafter.work" / "run.json").read_text())
    target = load_target(model)
    assert run["target"]["tap_layers"] == target.tap_layers == [1, 2, 3]
    assert run["target"]["mask_token"] == "<|reserved|>"
    assert run["target"]["sliding_window"] == (16 if architecture in ("mistral", "gemma3") else None)
    assert not (tmp_path / "drafter.work" / "checkpoint").exists()
    drafter = load(out, verifier=target)
    with pytest.raises(ValueError, match="trained for another target"):
        load(out, verifier=tiny_target())  # vocabulary 64, not 300
    assert drafter.metadata["steps"] == 4 and len(drafter.metadata["curve"]) == 3
    assert "sts" in drafter.metadata
    prompts = [target.encode_chat(p) for p in ["Tell me a story.", "What is twelve times seven?"]]
    config = SamplingConfig(max_new_tokens=16, temperature=0.0)
    plain = generate(target, prompts, config).tokens
    assert speculative_generate(target, drafter, prompts, config, scheduler=FixedLength(3)).tokens == plain


def test_killed_run_resumes_and_says_so(tmp_path, capsys, monkeypatch):
    """A run killed during step 4, after its step-2 checkpoint, loses steps 3 and 4 at most: the same command
    picks up at step 2, says so, and ends with the weights of a run that was never killed. A rerun with other
    settings is refused instead of mixing two runs."""
    from dspark.train.trainer import Trainer

    model = save_tiny_target(tmp_path / "model")
    prompts = prompt_file(tmp_path / "prompts.jsonl")
    straight = load(train_for_target(model, prompts, tmp_path / "straight", **TINY), verifier=load_target(model))
    step = Trainer.train_step

    def killed_in_step_4(self):
        if self.step == 3:
            raise KeyboardInterrupt
        return step(self)

    monkeypatch.setattr(Trainer, "train_step", killed_in_step_4)
    with pytest.raises(KeyboardInterrupt):
        train_for_target(model, prompts, tmp_path / "killed", **TINY)
    monkeypatch.setattr(Trainer, "train_step", step)
    with pytest.raises(ValueError, match=r"other settings \(steps\)"):
        train_for_target(model, prompts, tmp_path / "killed", **dict(TINY, steps=5))
    resumed = train_for_target(model, prompts, tmp_path / "killed", **dict(TINY, progress=True))
    assert "at step 2 of 4" in capsys.readouterr().out
    resumed = load(resumed, verifier=load_target(model)).state_dict()
    for name, value in straight.state_dict().items():
        assert torch.equal(value, resumed[name]), name


def test_what_cannot_work_is_refused(tmp_path):
    base = save_tiny_target(tmp_path / "base", chat_template=False)
    prompts = prompt_file(tmp_path / "prompts.jsonl")
    with pytest.raises(ValueError, match="no chat template.*--plain-text"):
        train_for_target(base, prompts, tmp_path / "a", **TINY)
    with pytest.raises(ValueError, match="too few"):
        train_for_target(base, prompt_file(tmp_path / "one.jsonl", 1), tmp_path / "b", plain_text=True, **TINY)
    with pytest.raises(ValueError, match="does not fit the target's vocabulary of 300"):
        train_for_target(base, prompts, tmp_path / "c", plain_text=True, draft_vocab_size=301, **TINY)
    with pytest.raises(ValueError, match="no model directory"):
        train_for_target(tmp_path / "missing", prompts, tmp_path / "d", **TINY)
    with pytest.raises(ValueError, match="cannot load its tokenizer"):
        train_for_target(tmp_path, prompts, tmp_path / "e", **TINY)


def test_prompt_files(tmp_path):
    (tmp_path / "p.txt").write_text("first prompt\n\n second prompt \n", encoding="utf-8")
    assert read_prompts(tmp_path / "p.txt") == ["first prompt", "second prompt"]
    (tmp_path / "p.json").write_text(json.dumps([{"conversations": [
        {"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}, {"from": "human", "value": "more"}]}]))
    assert read_prompts(tmp_path / "p.json") == [[{"role": "user", "content": "hi"},
                                                  {"role": "assistant", "content": "hello"},
                                                  {"role": "user", "content": "more"}]]
    (tmp_path / "bad.jsonl").write_text('"fine"\n{"prompt": \n', encoding="utf-8")
    with pytest.raises(ValueError, match="bad.jsonl, line 2: not JSON"):
        read_prompts(tmp_path / "bad.jsonl")
    (tmp_path / "odd.jsonl").write_text('{"answer": "no prompt here"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match="odd.jsonl, line 1: expected a string"):
        read_prompts(tmp_path / "odd.jsonl")
    (tmp_path / "empty.txt").write_text("\n", encoding="utf-8")
    with pytest.raises(ValueError, match="holds no prompts"):
        read_prompts(tmp_path / "empty.txt")
    with pytest.raises(ValueError, match="no prompt file"):
        read_prompts(tmp_path / "absent.jsonl")


def test_command_line_trains_then_demo_decodes_with_it(tmp_path, capsys):
    """``train --target --prompts --output``, then ``demo --target --drafter``: the demo's greedy outputs equal the
    target's (its exit status says so)."""
    from dspark.__main__ import main

    model = save_tiny_target(tmp_path / "model", "qwen3")
    prompts = prompt_file(tmp_path / "prompts.jsonl")
    out = tmp_path / "drafter"
    assert main(["train", "--target", str(model), "--prompts", str(prompts), "--output", str(out), "--steps", "2",
                 "--layers", "1", "--max-new-tokens", "8", "--checkpoint-every", "1"]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    assert main(["demo", "--target", str(model), "--drafter", str(out), "--per-domain", "1",
                 "--max-new-tokens", "8"]) == 0
    assert "greedy outputs identical to the target's: yes" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["train", "--target", "m", "--prompts", "p", "--output", "o", "--ce-weight", "1"], "--ce-weight belong"),
    (["train", "--target", "m", "--output", "o"], "needs --prompts"),
    (["train", "--prompts", "p.jsonl"], "--prompts apply to training for your own model"),
    (["demo", "--target", "m"], "give it with --drafter"),
])
def test_command_line_refuses_flags_that_do_not_apply(argv, message, capsys):
    from dspark.__main__ import main

    with pytest.raises(SystemExit):
        main(argv)
    assert message in capsys.readouterr().err

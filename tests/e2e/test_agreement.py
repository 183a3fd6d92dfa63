"""Training and decoding agree on what a slot means: a drafter over-fitted on a few target-answered sequences
drafts those answers back when decoding the same prompts.

If training and decoding disagreed on anything (which context rows a block sees, which token a slot
predicts, which previous token feeds the Markov head, the reduced-vocabulary map), the memorised answers
would not come back and τ would sit near 1 however long the drafter trained. A guard for every later
change to training or decoding.
"""

import torch

from dspark.corpus import build_corpus, load_corpus
from dspark.data import load_training_prompts
from dspark.decoding import SamplingConfig, generate, speculative_generate
from dspark.drafter import DSparkDrafter
from dspark.scheduler import FixedLength
from dspark.training import OfflineFeatures, TrainConfig, Trainer, fastest_precision
from dspark.vocab import build_draft_vocab, token_counts

GAMMA, NEW_TOKENS = 7, 32


def test_an_overfitted_drafter_drafts_its_training_answers(real_target, tmp_path):
    target = real_target
    prompts = [target.encode_chat(p) for p in load_training_prompts(6)]
    build_corpus(target, prompts, tmp_path, max_new_tokens=NEW_TOKENS, batch_size=6, dtype=torch.float32,
                 progress=False)
    samples = load_corpus(tmp_path)
    answers = [s.token_ids[s.loss_mask] for s in samples]
    torch.manual_seed(0)
    drafter = DSparkDrafter(target.drafter_config(block_size=GAMMA, num_draft_layers=1, markov_rank=32,
                                                  draft_vocab_size=512))
    # Every answer token is in the draft vocabulary (at most 6 × 32 distinct ones), so none is unlearnable.
    drafter.set_draft_vocab(build_draft_vocab(token_counts(answers, target.vocab_size), 512,
                                              always=[target.eos_token_id]))
    drafter.load_target_embeddings(target.embed_weight(), target.lm_head_weight())
    # The precision the recipe trains in on this machine: bf16 only where it is the faster (on CPUs that
    # emulate bf16 the full-vocabulary target distribution alone takes a minute a step).
    config = TrainConfig(steps=150, lr=3e-3, sequences_per_step=6, num_anchors=32, eval_every=0,
                         precision=fastest_precision("cpu"), loss_backend="torch")
    trainer = Trainer(drafter, target.lm_head_weight(), OfflineFeatures(tmp_path, target.tap_layers,
                                                                        target.hidden_size), samples, config)
    trainer.fit(progress=False)
    drafter.eval()
    sampling = SamplingConfig(max_new_tokens=NEW_TOKENS, temperature=0.0)
    plain = generate(target, prompts, sampling)
    spec = speculative_generate(target, drafter, prompts, sampling, scheduler=FixedLength(GAMMA))
    assert spec.tokens == plain.tokens
    assert [s.token_ids[s.loss_mask].tolist() for s in samples] == plain.tokens  # the answers it memorised
    # γ + 1 = 8 would be every slot accepted in every round; the last round of each request is short
    # (NEW_TOKENS is not a multiple of 8), and a misaligned slot, label or context row gives τ ≈ 1.
    assert spec.stats.tau >= 5.0, spec.table()

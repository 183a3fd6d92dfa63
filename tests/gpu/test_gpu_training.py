"""Training steps on a real GPU: the CPU recipe's drafter shape (reduced draft vocabulary, bf16) on CUDA.

Skipped without CUDA. Blocks are cut on the CPU, where the features are read, and moved to the device
whole; this holds every tensor of a step to one device.
"""

from __future__ import annotations

import pytest
import torch

from dspark import DSparkConfig, DSparkDrafter
from dspark.train.config import TrainConfig
from dspark.train.samples import Sample
from dspark.train.trainer import Trainer

pytestmark = pytest.mark.gpu


class _RandomFeatures:
    def __init__(self, seq_len: int, taps: int, hidden: int):
        gen = torch.Generator().manual_seed(1)
        self.rows = (torch.randn(seq_len, taps * hidden, generator=gen), torch.randn(seq_len, hidden, generator=gen))

    def features(self, index, sample):
        return self.rows


@pytest.mark.parametrize("loss_backend", ["torch", "triton"])
@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_a_reduced_vocabulary_drafter_trains_on_cuda(loss_backend, precision):
    vocab, draft_vocab, hidden, seq_len = 1000, 300, 64, 96
    config = DSparkConfig(vocab_size=vocab, hidden_size=hidden, num_attention_heads=4, num_key_value_heads=2,
                          intermediate_size=128, num_target_layers=8, target_layer_ids=[1, 3, 5],
                          mask_token_id=vocab - 1, block_size=7, num_draft_layers=2, markov_rank=8,
                          draft_vocab_size=draft_vocab)
    torch.manual_seed(0)
    with torch.device("cuda"):
        drafter = DSparkDrafter(config)
        with torch.no_grad():
            drafter.init_weights()
    lm_head = torch.randn(vocab, hidden, device="cuda") * 0.02
    # Every third target id drafts: labels outside the draft vocabulary must carry no weight, on the device.
    drafter.set_draft_vocab(torch.arange(0, 3 * draft_vocab, 3, device="cuda"))
    drafter.load_target_embeddings(lm_head.clone(), lm_head)
    gen = torch.Generator().manual_seed(2)
    samples = [Sample(torch.randint(vocab - 1, (seq_len,), generator=gen),
                      torch.arange(seq_len) >= seq_len // 4) for _ in range(2)]
    trainer = Trainer(drafter, lm_head, _RandomFeatures(seq_len, 3, hidden), samples,
                      TrainConfig(steps=3, num_anchors=8, sequences_per_step=2, eval_every=0, precision=precision,
                                  loss_backend=loss_backend))
    before = drafter.markov_head.markov_w2.weight.detach().clone()
    losses = [trainer.train_step()["loss"] for _ in range(3)]
    assert all(torch.isfinite(torch.tensor(losses))), losses
    assert not torch.equal(before, drafter.markov_head.markov_w2.weight), "the steps left the Markov head unchanged"

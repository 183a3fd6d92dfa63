"""Run under a Python that has speculators: both directions of the checkpoint round trip, with its own classes.

    python speculators_check.py EXPORT_DIR WRITE_DIR REPORT.pt

1. Reads EXPORT_DIR (written by ``dspark.export``) into speculators' config class and model, fills what the
   export leaves to the verifier as speculators does, and records the tensors its model missed (of those
   speculators' own ``save_pretrained`` writes) or did not expect.
2. Builds a fresh speculators model from that config (and draft vocabulary) with rope θ = 1e5 (in the
   ``rope_parameters`` form that transformers 5 writes), random weights and the verifier's embedding and
   LM head, and saves it with speculators' own ``save_pretrained`` to WRITE_DIR (which leaves out what
   comes from the verifier).
3. For both models, runs speculators' own training forward on one block anchored at a fixed position and
   records the draft logits (Markov bias included) and confidence logits, with the inputs, in REPORT.pt
   (plain tensors, read back with ``weights_only=True``) for the caller to compare with dspark's.
"""

import sys
from pathlib import Path

import safetensors.torch
import torch
from speculators.models.dspark import DSparkDraftModel, DSparkSpeculatorConfig

ANCHOR, LENGTH = 5, 12


def block_outputs(model, taps, input_ids):
    """Draft logits ``[block, V_draft]`` and confidence logits ``[block]`` of the block anchored at ANCHOR."""
    loss_mask = torch.zeros(1, LENGTH, dtype=torch.long)
    loss_mask[0, ANCHOR] = 1  # the only valid anchor, so speculators' random anchor choice picks it
    hidden_size = model.config.transformer_layer_config.hidden_size
    hidden, logits, _, _, index = model._backbone_forward(
        taps, input_ids, loss_mask, torch.zeros(1, LENGTH, hidden_size), torch.zeros(1, LENGTH, dtype=torch.long),
        max_anchors=1)
    block = model.block_size
    prev = input_ids[0, index].view(1, block)
    hidden = hidden.view(1, block, -1)
    logits = logits.view(1, block, -1)
    features = hidden
    if model.markov_head is not None:
        prev_emb = model.markov_head.prev_embeddings(prev)
        logits = logits + model.markov_head.block_bias(prev_token_ids=prev, hidden_states=hidden, prev_emb=prev_emb)
        if model.config.confidence_head_with_markov:
            features = torch.cat([hidden, prev_emb.to(hidden.dtype)], -1)
    confidence = model.confidence_head(features).reshape(block) if model.confidence_head is not None else None
    return logits[0], confidence


def randomize(model, seed):
    gen = torch.Generator().manual_seed(seed)
    for name, param in model.named_parameters():
        noise = torch.randn(param.shape, generator=gen)
        param.copy_(1 + 0.1 * noise if "norm" in name else 0.3 * noise)


export_dir, write_dir, report_path = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
config = DSparkSpeculatorConfig.from_pretrained(export_dir)
exported = DSparkDraftModel(config).eval()
state = safetensors.torch.load_file(export_dir / "model.safetensors")
missing, unexpected = exported.load_state_dict(state, strict=False)
exported.load_verifier_weights()  # what the export leaves to the verifier, as speculators' own loading fills it

config = DSparkSpeculatorConfig.from_pretrained(export_dir)
config.transformer_layer_config.rope_parameters = {"rope_type": "default", "rope_theta": 1e5}
written = DSparkDraftModel(config).eval()
with torch.no_grad():
    randomize(written, seed=7)
if "t2d" in state:  # a reduced draft vocabulary: the same one as the export's
    written.load_vocab_mappings(state["t2d"], state["d2t"])
written.load_verifier_weights()
written.save_pretrained(write_dir)
# A tensor the export lacks counts as missing only if speculators' own save writes it (verifier_* tensors, the
# embedding and a full-vocabulary LM head it leaves to the verifier).
saved = set(safetensors.torch.load_file(write_dir / "model.safetensors"))
missing = [name for name in missing if name in saved]

gen = torch.Generator().manual_seed(0)
vocab = config.transformer_layer_config.vocab_size
input_ids = torch.randint(0, vocab, (1, LENGTH), generator=gen)
taps = torch.randn(1, LENGTH, len(config.aux_hidden_state_layer_ids) * config.transformer_layer_config.hidden_size,
                   generator=gen)
report = {"config_type": type(config).__name__, "missing": sorted(missing), "unexpected": sorted(unexpected),
          "anchor": ANCHOR, "input_ids": input_ids, "taps": taps}
with torch.no_grad():
    for name, model in (("exported", exported), ("written", written)):
        report[f"{name}_logits"], report[f"{name}_confidence"] = block_outputs(model, taps, input_ids)
torch.save(report, report_path)
print("ok")

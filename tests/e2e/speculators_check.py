"""Run under a Python that has speculators: validate a dspark export with speculators' own classes.

    python speculators_check.py CHECKPOINT_DIR REPORT.json

Writes the config class it parsed into, the tensors its model missed or did not expect, and the outputs
of its Markov and confidence heads on fixed inputs, for the caller to compare with dspark's.
"""

import json
import sys
from pathlib import Path

import safetensors.torch
import torch
from speculators.models.dspark import DSparkDraftModel, DSparkSpeculatorConfig

checkpoint, report_path = Path(sys.argv[1]), Path(sys.argv[2])
config = DSparkSpeculatorConfig.from_pretrained(checkpoint)
model = DSparkDraftModel(config).eval()
state = safetensors.torch.load_file(checkpoint / "model.safetensors")
missing, unexpected = model.load_state_dict(state, strict=False)
# verifier_* tensors are excluded from saved checkpoints by speculators itself (_keys_to_ignore_on_save).
missing = [name for name in missing if not name.startswith("verifier_")]
block = config.block_size
hidden_size = config.transformer_layer_config.hidden_size
gen = torch.Generator().manual_seed(0)
prev = torch.randint(0, config.transformer_layer_config.vocab_size, (2, block), generator=gen)
hidden = torch.randn(2, block, hidden_size, generator=gen)
with torch.no_grad():
    prev_emb = model.markov_head.prev_embeddings(prev)
    bias = model.markov_head.block_bias(prev_token_ids=prev, hidden_states=hidden, prev_emb=prev_emb)
    features = torch.cat([hidden, prev_emb.to(hidden.dtype)], -1) if config.confidence_head_with_markov else hidden
    confidence = model.confidence_head(features).reshape(2, block)
report_path.write_text(json.dumps({
    "config_type": type(config).__name__,
    "missing": sorted(missing),
    "unexpected": sorted(unexpected),
    "prev_ids": prev.tolist(),
    "hidden": hidden.tolist(),
    "markov_bias": bias.tolist(),
    "confidence_logits": confidence.tolist(),
}))
print("ok")

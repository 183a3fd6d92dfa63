from types import SimpleNamespace

import pytest

from dspark import DSparkConfig, uniform_tap_layers
from dspark.testing import tiny_config


def test_round_trips_through_json(tmp_path):
    config = tiny_config(markov_head_type="rnn", confidence_head_bias=False, draft_vocab_size=20)
    assert DSparkConfig.from_json(config.to_json()) == config
    config.save(tmp_path / "c.json")
    assert DSparkConfig.load(tmp_path / "c.json") == config


def test_uniform_taps_match_deepspec_qwen3():
    assert uniform_tap_layers(36, 5) == [1, 9, 17, 25, 33]
    assert uniform_tap_layers(40, 5) == [1, 10, 19, 28, 37]


def test_from_target_config_inherits_sizes():
    target = SimpleNamespace(
        model_type="qwen3", vocab_size=151936, hidden_size=2560, num_attention_heads=32, num_key_value_heads=8,
        head_dim=128, intermediate_size=9728, num_hidden_layers=36, rope_theta=1e6, rms_norm_eps=1e-6,
        max_position_embeddings=40960, pad_token_id=None,
    )
    config = DSparkConfig.from_target_config(target, mask_token_id=151669)
    assert (config.hidden_size, config.num_key_value_heads, config.head_dim) == (2560, 8, 128)
    assert config.target_layer_ids == [1, 9, 17, 25, 33]
    assert config.qk_norm and config.rope_theta == 1e6 and config.block_size == 7 and config.markov_rank == 256


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(markov_rank=0, markov_head_type="gated"), "markov_rank=0"),
        (dict(markov_rank=0), "confidence_head_with_markov"),
        (dict(target_layer_ids=[0, 5]), "tap 5 out of range"),
        (dict(target_layer_ids=[0, -2]), "tap -2 out of range"),
        (dict(target_layer_ids=[1, 1]), "distinct"),
        (dict(num_key_value_heads=3), "multiple of"),
        (dict(head_dim=3), "even"),
        (dict(mask_token_id=37), "mask_token_id"),
        (dict(draft_vocab_size=38), "cannot exceed"),
        (dict(markov_head_type="lstm"), "markov_head_type"),
        (dict(block_size=0), "block_size"),
        (dict(sample_from_anchor=False), "not implemented"),
    ],
)
def test_bad_configs_raise_value_error(overrides, message):
    with pytest.raises(ValueError, match=message):
        tiny_config(**overrides)


def test_unknown_json_field_is_named():
    data = tiny_config().to_dict()
    data["markov_rnak"] = 3
    with pytest.raises(ValueError, match="markov_rnak"):
        DSparkConfig.from_dict(data)


def test_dflash_baseline_config_is_valid():
    config = tiny_config(markov_rank=0, enable_confidence_head=False)
    assert not config.has_markov

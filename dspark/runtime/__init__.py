"""Decoding with real targets: the target adapter, decoding, verify-cost profiles, prompts, STS by decoding."""

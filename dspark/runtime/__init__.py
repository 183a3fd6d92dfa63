"""Decoding with real targets: the target adapter, speculative and plain decoding, prompts, STS by decoding."""

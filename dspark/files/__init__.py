"""Drafter files: dspark checkpoints, and export to and loading from the speculators format that vLLM serves."""

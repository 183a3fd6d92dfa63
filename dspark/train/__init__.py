"""Training drafters: samples and features, the trainer on DDP or FSDP2, recipes, prompt pools, any target."""

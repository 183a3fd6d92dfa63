"""STS calibration by decoding: held-out rollouts of the drafter with the target, then :func:`dspark.fit_sts`."""

from __future__ import annotations

import torch

from dspark.calibration import calibration_report, fit_sts
from dspark.runtime.decoding import SamplingConfig, SpeculativeDecoder
from dspark.scheduler import FixedLength


def calibrate_drafter(target, drafter, prompts: list[list[int]], *, max_new_tokens: int = 64,
                      temperature: float = 1.0, batch_size: int = 8, grid: torch.Tensor | None = None,
                      progress: bool = False) -> dict:
    """Fit and install the drafter's STS temperatures from held-out rollouts (method.md §5.2).

    The drafter decodes ``prompts`` with every drafted slot verified (no truncation), recording the raw
    confidence logits and the realised accepted prefix of each round; :func:`fit_sts` then sets
    ``drafter.sts_temperatures``. Returns the calibration reports before and after, and the temperatures.
    """
    if not drafter.config.enable_confidence_head:
        raise ValueError("this drafter has no confidence head to calibrate")
    drafter.sts_temperatures.fill_(1.0)
    rounds = []
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(prompts) * max_new_tokens, desc="STS calibration rollouts", unit="tok")
    for start in range(0, len(prompts), batch_size):
        config = SamplingConfig(max_new_tokens=max_new_tokens, temperature=temperature, seed=start)
        decoder = SpeculativeDecoder(target, drafter, config, scheduler=FixedLength(drafter.config.block_size),
                                     record_rounds=True)
        decoder.start(prompts[start: start + batch_size])
        while not decoder.finished:
            counts = decoder.step()
            if bar is not None:
                bar.update(sum(counts))
        rounds += decoder.rounds
    if bar is not None:
        bar.close()
    logits = torch.cat([r[0] for r in rounds]).double()
    verified = torch.cat([r[1] for r in rounds])
    accepted = torch.cat([r[2] for r in rounds])
    temperatures = fit_sts(logits, verified, accepted, grid)
    drafter.sts_temperatures.copy_(temperatures.to(drafter.sts_temperatures))
    return {"rounds": int(logits.shape[0]), "temperatures": temperatures.tolist(),
            "before": calibration_report(logits, verified, accepted).as_dict(),
            "after": calibration_report(logits, verified, accepted, temperatures).as_dict()}

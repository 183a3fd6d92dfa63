"""dspark: DSpark speculative decoding, as reference oracles, PyTorch modules and fused Triton kernels.

``import dspark`` never imports Triton and never touches a GPU driver; kernels load on first use.
"""

from dspark._checks import trusted_values
from dspark.attention import block_attention
from dspark.backbone import BlockBackbone, ContextCache
from dspark.backend import resolve_backend
from dspark.calibration import calibration_report, fit_sts
from dspark.confidence import ConfidenceHead, confidence_survival, confidence_target
from dspark.config import DSparkConfig, uniform_tap_layers
from dspark.contract import VerifyOutput
from dspark.drafter import DraftOutput, DSparkDrafter
from dspark.files.export import export, load
from dspark.markov import MarkovHead, MarkovWeights, sample_block, teacher_forced_bias
from dspark.metrics import AcceptanceStats
from dspark.sampling import sample_from_probs, warp_logits
from dspark.scheduler import (
    FixedLength,
    PrefixScheduler,
    ProductionScheduler,
    SPSTable,
    Threshold,
    allocate_top_k,
    schedule_greedy,
)
from dspark.verify import verify, verify_greedy

__version__ = "0.1.0"

__all__ = [
    "AcceptanceStats",
    "FixedLength",
    "PrefixScheduler",
    "ProductionScheduler",
    "SPSTable",
    "Threshold",
    "VerifyOutput",
    "allocate_top_k",
    "calibration_report",
    "export",
    "load",
    "fit_sts",
    "schedule_greedy",
    "verify",
    "verify_greedy",
    "BlockBackbone",
    "ConfidenceHead",
    "ContextCache",
    "DSparkConfig",
    "DSparkDrafter",
    "DraftOutput",
    "MarkovHead",
    "MarkovWeights",
    "block_attention",
    "confidence_survival",
    "confidence_target",
    "resolve_backend",
    "sample_block",
    "sample_from_probs",
    "teacher_forced_bias",
    "trusted_values",
    "uniform_tap_layers",
    "warp_logits",
]

"""The paper's Appendix A counterexample, computed exactly by dspark's scheduler and verifier.

Writes ``benchmarks/results/appendix_a.json``: P(first token = A) with and without Algorithm 1's early
stop (paper: 0.70 and 0.85).

    python benchmarks/bench_appendix_a.py
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.environment import write_result  # noqa: E402
from dspark.scheduler import counterexample_first_token_probability  # noqa: E402

if __name__ == "__main__":
    with_stop = counterexample_first_token_probability(early_stop=True)
    without = counterexample_first_token_probability(early_stop=False)
    path = write_result("appendix_a", {"p_first_A_with_early_stop": with_stop, "p_first_A_without_early_stop": without,
                                       "target_p_A": 0.7})
    print(f"P(A): with early stop {with_stop:.4f}, without {without:.4f}; wrote {path}")

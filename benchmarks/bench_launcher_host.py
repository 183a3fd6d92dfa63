"""The launchers' host work per call, an earlier commit's against this tree's, side by side in one run.

At a small batch a fused op's cost on a GPU is the host's: its checks, its launcher's Python and allocations, and
Triton's launch path, for microseconds of device work. This times the first part on this CPU with the kernels
stubbed out (:func:`benchmarks.host_trace.stubbed_launches`: the launcher runs and returns without launching),
for each fused op of a sampled decode round (T = 1, so every kernel of the samplers is on the path), replaying the
arguments the round passed it, at R = 1, 16 and 64 requests.

Each tree is called as its decode loop calls the ops: the earlier commit plainly (before
:func:`dspark.trusted_values`, its loop checked every value), this tree inside :func:`dspark.trusted_values`. The
earlier commit runs from a ``git worktree`` of it; the two trees take turns, one process each per turn, for
``--turns`` turns, so that a busy or throttled machine slows both alike. Per op and R: the median over turns of
each tree's median microseconds per call, and their ratio.

    TRITON_INTERPRET=1 python benchmarks/bench_launcher_host.py [--baseline 156f169] [--turns 5] [--calls 200]
                                                               [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.environment import write_result  # noqa: E402

# The commit whose bench_round_counts.py first counted a round: every change to the launchers' host work came after.
BASELINE = "156f169"
REQUESTS = (1, 16, 64)

# Run in each tree's root; prints {"op R": median µs per call}. Only the helpers both trees share are used.
CHILD = r"""
import contextlib, gc, json, os, statistics, sys, time
import torch
sys.path.insert(0, os.getcwd())
from benchmarks import bench_round_counts as rounds
from benchmarks.host_trace import stubbed_launches
try:
    from dspark import trusted_values  # this tree's decode loop calls the ops inside it
except ImportError:
    trusted_values = contextlib.nullcontext  # the earlier one checked every call
calls, requests = int(sys.argv[1]), [int(r) for r in sys.argv[2].split(",")]
os.environ["DSPARK_BACKEND"] = "triton"
target, drafter = rounds.build()
out = {}
with torch.no_grad():
    for r in requests:
        captured = rounds.capture_round_calls(rounds.decoder_for(target, drafter, r, 1.0, "triton"))
        with stubbed_launches(), trusted_values():
            for name, (function, args, kwargs) in sorted(captured.items()):
                function(*args, **kwargs)  # imports the launcher, fills its caches
                times = []
                gc.disable()  # as timeit does: a collection is no launcher's work
                for _ in range(calls):
                    start = time.perf_counter()
                    function(*args, **kwargs)
                    times.append(time.perf_counter() - start)
                gc.enable()
                out[f"{name} {r}"] = 1e6 * statistics.median(times)
print(json.dumps(out))
"""


def worktree(commit: str, where: Path) -> Path:
    """A checkout of ``commit`` whose ``dspark`` package finds its own kernels and reference, as an install maps
    them (the repository keeps them at the top level)."""
    path = where / "baseline"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), commit], check=True,
                   capture_output=True)
    for name in ("kernels", "reference"):
        (path / "dspark" / name).symlink_to(path / name, target_is_directory=True)
    return path


def measure(tree: Path, calls: int, requests: tuple[int, ...]) -> dict[str, float]:
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(tree))
    done = subprocess.run([sys.executable, "-c", CHILD, str(calls), ",".join(map(str, requests))], cwd=tree,
                          env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode:
        raise RuntimeError(f"measuring {tree} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", default=BASELINE)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") != "1":
        parser.error("set TRITON_INTERPRET=1: the launchers run under Triton's interpreter on a CPU")
    runs: dict[str, list[dict]] = {"baseline": [], "current": []}
    with tempfile.TemporaryDirectory() as tmp:
        baseline = worktree(args.baseline, Path(tmp))
        try:
            for turn in range(args.turns):
                for name, tree in (("baseline", baseline), ("current", ROOT)):
                    runs[name].append(measure(tree, args.calls, REQUESTS))
                print(f"turn {turn + 1}/{args.turns} done", flush=True)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(baseline)], check=False)
    rows = []
    for key in sorted(runs["current"][0], key=lambda k: (int(k.split()[1]), k)):
        op, requests = key.split()
        before = statistics.median(run[key] for run in runs["baseline"])
        after = statistics.median(run[key] for run in runs["current"])
        rows.append({"op": op, "requests": int(requests), "host_us_per_call_before": before,
                     "host_us_per_call_after": after, "times_less": before / after})
        print(f"{op:20s} R={requests:>3s}: {before:6.1f} -> {after:5.1f} us per call ({before / after:.1f}x less)")
    path = write_result("launcher_host_cpu", {"baseline": args.baseline, "turns": args.turns, "calls": args.calls,
                                              "rows": rows}, args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

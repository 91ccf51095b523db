from setuptools import find_packages, setup

setup(
    name="diffusiongemma",
    version="0.1.0",
    description="DiffusionGemma block-diffusion language model for Hugging Face Transformers",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["diffusiongemma", "diffusiongemma.*"]),
    package_data={"diffusiongemma": ["sudoku/demo_model/*", "serving/playground.html"]},
    include_package_data=True,
    # Every third-party import of the package, with the versions we test (see README, "Install").
    install_requires=[
        "torch>=2.11,<2.14",  # CPU CI: 2.13.0; GPU image: 2.11. grouped_mm on CPU needs 2.9+.
        "transformers>=5.23.0,<5.24",
        "accelerate>=1.10",
        "safetensors>=0.8",
        "compressed-tensors>=0.20.1,<0.21",
        "tokenizers>=0.23.1,<0.24",
        "huggingface_hub>=1.31,<3",
        "tqdm>=4.60",
        "outlines-core>=0.2.14,<0.3",  # constrained denoising (diffusiongemma/constraints); tested: 0.2.14
        # checks every JSON schema and every constrained JSON answer at run time (constraints/schema_rules.py,
        # answer_check.py); tested: 4.26
        "jsonschema>=4.18,<5",
    ],
    extras_require={
        # the test extra carries the serve, vision and convert extras, so CI runs their tests (tests/serving,
        # the image-prompt tests, tests/conversion)
        "test": ["pytest>=8", "bitsandbytes>=0.49", "fastapi>=0.115,<1", "uvicorn>=0.30,<1", "openai>=1.98,<4",
                 "pydantic>=2,<3", "typing_extensions>=4.7", "pillow>=10", "orbax-checkpoint==0.11.33",
                 "tensorstore==0.1.86", "jax[cpu]==0.10.2", "ml_dtypes>=0.5", "numpy>=1.26", "zstandard>=0.22",
                 "peft>=0.21,<0.22", "datasets>=5.2,<6",
                 # the reference for the commit-style samplers and the pipeline our model runs in (tested: 0.42.1)
                 "diffusers>=0.42.1,<0.43",
                 # the lm-eval adapter's tests (tests/evaluation)
                 "lm_eval==0.4.13",
                 # drives the system's headless Chromium in the playground test (tested: 4.51)
                 "selenium>=4.30,<5"],
        # fine-tuning (docs/training.md): PEFT LoRA adapters, and `diffusiongemma train sft --data DATASET_DIR`
        # (a `datasets` save_to_disk folder); tested with peft 0.21.2, datasets 5.2.0
        "train": ["peft>=0.21,<0.22", "datasets>=5.2,<6"],
        # `diffusiongemma serve` / `chat`: transformers serve's own dependencies (transformers[serving]); tested with
        # fastapi 0.165, uvicorn 0.54, openai 3.57, pydantic 2.14
        "serve": ["fastapi>=0.115,<1", "uvicorn>=0.30,<1", "openai>=1.98,<4", "pydantic>=2,<3", "typing_extensions>=4.7"],
        # `diffusiongemma eval` and the lm-eval model "diffusiongemma" (docs/evaluation.md); pinned: the adapter
        # subclasses lm-eval's TemplateLM and reads its request layout, which moves between releases (tested: 0.4.13)
        "eval": ["lm_eval==0.4.13"],
        "bnb": ["bitsandbytes>=0.45"],
        "vision": ["pillow>=10"],  # image files for prompts (docs/vision.md): CLI --image, load_image (tested: 13.0)
        # `diffusiongemma convert orbax` (docs/conversion.md): TensorStore reads the Orbax arrays, orbax-checkpoint
        # (JAX on CPU) writes synthetic checkpoints. orbax-checkpoint 0.11.33 is the version the upstream converter
        # pins (it notes 0.11.34-0.11.36 fail); tensorstore and jax are the versions pip resolves with it, tested.
        # zstandard: the converter decodes zstd zarr chunks as streams (conversion/chunk_stream.py; tested: 0.25)
        "convert": ["orbax-checkpoint==0.11.33", "tensorstore==0.1.86", "jax[cpu]==0.10.2", "ml_dtypes>=0.5",
                    "numpy>=1.26", "zstandard>=0.22"],
        "plot": ["matplotlib>=3.8"],  # benchmarks/sudoku_showcase.py writes a PNG plot with it
    },
    entry_points={"console_scripts": ["diffusiongemma=diffusiongemma.cli:main"]},
)

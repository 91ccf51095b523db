from setuptools import find_packages, setup

setup(
    name="diffusiongemma",
    version="0.1.0",
    description="DiffusionGemma block-diffusion language model for Hugging Face Transformers",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["diffusiongemma", "diffusiongemma.*"]),
    package_data={"diffusiongemma": ["sudoku/demo_model/*"]},
    include_package_data=True,
    install_requires=[
        "torch>=2.6",
        "transformers>=5.23.0,<5.24",
        "accelerate>=1.10",
        "safetensors>=0.5",
        "compressed-tensors>=0.20.1,<0.21",
        "tokenizers>=0.22",
    ],
    extras_require={
        "test": ["pytest>=8", "bitsandbytes>=0.49"],
        "bnb": ["bitsandbytes>=0.45"],
    },
    entry_points={"console_scripts": ["diffusiongemma=diffusiongemma.cli:main"]},
)

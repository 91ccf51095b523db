"""Block-diffusion generation: the one denoising step (`engine`), the row pool (`pool`), samplers and stoppers as
plug-ins, per-step state and the `generate` loops.

Import the submodules directly (`diffusiongemma.generation.loop`, `.engine`, ...). This file imports nothing. The
generation config lives at the bottom layer (`diffusiongemma.generation_config`); `.config` re-exports it.
"""

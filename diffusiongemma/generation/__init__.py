"""Block-diffusion generation: the generation config, samplers, stoppers, per-step state and the `generate` loop.

Import the submodules directly (`diffusiongemma.generation.loop`, `.config`, ...). This file imports nothing, so
that `diffusiongemma.modeling` can import `generation.config` without pulling in the loop (which imports modeling).
"""

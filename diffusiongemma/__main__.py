"""`python -m diffusiongemma`: the same command line as the `diffusiongemma` console script (see cli.py)."""

import sys

from diffusiongemma.cli import main

if __name__ == "__main__":
    sys.exit(main())

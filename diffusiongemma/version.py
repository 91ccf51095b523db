"""The package version, in a leaf module: what records it (trace manifests) imports it from here, never from the
top-level package (tests/test_layering.py)."""

__version__ = "0.1.0"

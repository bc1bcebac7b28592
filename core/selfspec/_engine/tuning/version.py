"""The version of selfspec, in a leaf module (the package and the loader both read it)."""

__version__ = "0.1.0"

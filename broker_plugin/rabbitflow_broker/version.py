"""The installed distribution's version (a leaf: it imports nothing of the package).

The same as ``rabbitflow.__version__``.  Read once, on first import of this
module: :mod:`importlib.metadata` imports :mod:`socket`, and the engine's
modules import no I/O library, so they never import this one.
"""

from importlib.metadata import PackageNotFoundError, version

__all__ = ["__version__"]

try:
    __version__: str = version("rabbitflow")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"

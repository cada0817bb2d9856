"""servesim: mockserve (an OpenAI-compatible server over a simulated LLM engine) and loadgen.

``pip install servesim`` puts the ``mockserve`` and ``loadgen`` executables on PATH and this
module on the import path:

* :class:`MockServer` starts mockserve on a free local port for the length of a ``with`` block;
* :func:`binary_path` finds either executable (``binary_path("loadgen")``);
* the pytest plugin (registered automatically) provides the ``mockserve`` and
  ``mockserve_factory`` fixtures.
"""

from importlib import metadata as _metadata

from servesim._server import MockServer, MockServerError, binary_path, flag_args

__all__ = ["MockServer", "MockServerError", "binary_path", "flag_args", "__version__"]

try:
    #: The servesim release these binaries were built from (the Cargo workspace version).
    __version__: str = _metadata.version("servesim")
except _metadata.PackageNotFoundError:  # imported from a source checkout
    __version__ = "0+unknown"

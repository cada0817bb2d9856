"""pytest fixtures over :class:`servesim.MockServer`, registered through the ``pytest11`` entry
point (installing the wheel is enough; no ``conftest.py`` import needed).

* ``mockserve``: one server for the whole test session, started on first use with the flags of
  the ``mockserve_flags`` fixture (none by default: mockserve's defaults). Override
  ``mockserve_flags`` (session scope) in a ``conftest.py`` to change them.
* ``mockserve_factory``: call it with flags to start a private server for one test; every
  server it started is stopped when the test ends.

Use ``server.base_url`` (``http://127.0.0.1:PORT/v1``) as an OpenAI client's ``base_url``.
"""

from __future__ import annotations

from typing import Callable, Dict, Iterator, List

import pytest

from servesim._server import FlagValue, MockServer

__all__ = ["mockserve", "mockserve_factory", "mockserve_flags"]


@pytest.fixture(scope="session")
def mockserve_flags() -> Dict[str, FlagValue]:
    """Flags of the session's ``mockserve`` server (keyword names as for ``MockServer``)."""
    return {}


@pytest.fixture(scope="session")
def mockserve(mockserve_flags: Dict[str, FlagValue]) -> Iterator[MockServer]:
    """A mockserve server shared by the test session; stopped at the session's end."""
    with MockServer(**mockserve_flags) as server:
        yield server


@pytest.fixture
def mockserve_factory() -> Iterator[Callable[..., MockServer]]:
    """Starts servers with custom flags: ``mockserve_factory(max_waiting=1)``.

    Each call returns a started, healthy :class:`MockServer`; all are stopped after the test.
    """
    started: List[MockServer] = []

    def start(**flags: FlagValue) -> MockServer:
        server = MockServer(**flags)
        started.append(server)
        return server.start()

    yield start
    for server in reversed(started):
        server.stop()

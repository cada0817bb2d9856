"""Start and stop a ``mockserve`` process: :class:`MockServer` and the binary lookup."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.error
import urllib.request
from types import TracebackType
from typing import IO, Any, Callable, Dict, List, Mapping, Optional, Type, Union

__all__ = ["MockServer", "MockServerError", "binary_path", "flag_args"]

#: The line mockserve prints on stdout once it is bound, e.g.
#: ``mockserve listening on http://127.0.0.1:40233``.
_LISTENING = re.compile(rb"mockserve listening on http://(\S+):(\d+)\s*$", re.MULTILINE)

#: How often the startup loop looks at the process, its stdout and ``/health``, in seconds.
_POLL_S = 0.05

#: Linux's ``PR_SET_PDEATHSIG`` (``<sys/prctl.h>``).
_PR_SET_PDEATHSIG = 1


def _parent_death_signal() -> Optional[Callable[[], None]]:
    """A function for ``preexec_fn`` that asks Linux to SIGKILL the child when the thread that
    forked it ends, or None where that is not available. ``prctl`` is looked up here, in the
    parent: between fork and exec the child only calls it (no import)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (ImportError, OSError, AttributeError):
        return None
    sigkill = int(signal.SIGKILL)

    def die_with_parent() -> None:
        prctl(_PR_SET_PDEATHSIG, sigkill, 0, 0, 0)

    return die_with_parent


FlagValue = Union[str, int, float, bool, None, List[Any], tuple]


class MockServerError(RuntimeError):
    """mockserve exited, never printed its address or never became healthy.

    ``stderr`` holds what the process wrote on stderr (its clap or startup error, say) and
    ``returncode`` its exit status (None while it was still running and was stopped).
    """

    def __init__(self, message: str, stderr: str, returncode: Optional[int]) -> None:
        self.stderr = stderr
        self.returncode = returncode
        detail = stderr.strip()
        super().__init__(f"{message}\nmockserve stderr:\n{detail}" if detail else message)


def binary_path(name: str) -> str:
    """The path of the ``mockserve`` or ``loadgen`` executable this package installed.

    Looked up in this order: the environment variable ``SERVESIM_MOCKSERVE`` /
    ``SERVESIM_LOADGEN`` (an explicit override), the scripts directory of the running
    interpreter's install scheme (where ``pip install servesim`` puts both binaries, also for
    ``--user`` installs), then ``PATH``. Raises ``FileNotFoundError`` naming every place tried.
    """
    if name not in ("mockserve", "loadgen"):
        raise ValueError(f"unknown servesim binary {name!r}: expected 'mockserve' or 'loadgen'")
    tried: List[str] = []
    override = os.environ.get(f"SERVESIM_{name.upper()}")
    if override:
        if os.access(override, os.X_OK):
            return override
        tried.append(override)
    schemes = [sysconfig.get_default_scheme()] if hasattr(sysconfig, "get_default_scheme") else []
    schemes.append(f"{os.name}_user")
    for scheme in schemes:
        try:
            scripts = sysconfig.get_path("scripts", scheme)
        except KeyError:
            continue
        candidate = os.path.join(scripts, name)
        if os.access(candidate, os.X_OK):
            return candidate
        tried.append(candidate)
    # The scripts directory next to the running interpreter (a venv not activated).
    candidate = os.path.join(os.path.dirname(sys.executable), name)
    if os.access(candidate, os.X_OK):
        return candidate
    tried.append(candidate)
    found = shutil.which(name)
    if found:
        return found
    tried.append(f"{name} on PATH")
    raise FileNotFoundError(f"no {name} executable; tried: {', '.join(tried)}")


def flag_args(flags: Mapping[str, FlagValue]) -> List[str]:
    """Turn keyword flags into mockserve's command line.

    ``max_waiting=2`` becomes ``--max-waiting 2``, ``no_kv_events=True`` the bare flag
    ``--no-kv-events``; ``False`` and ``None`` leave a flag out; a list or tuple is joined with
    commas (``fault_types=["rate-limit", "unavailable"]``); any other value is passed as
    ``str(value)`` (``speedup_ratio=float("inf")`` gives ``inf``, which mockserve accepts).
    """
    args: List[str] = []
    for key, value in flags.items():
        flag = "--" + key.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            args.append(flag)
        elif isinstance(value, (list, tuple)):
            args += [flag, ",".join(str(v) for v in value)]
        else:
            args += [flag, str(value)]
    return args


class MockServer:
    """A mockserve process on a free port of 127.0.0.1, as a context manager.

    ::

        with MockServer(max_waiting=2, speedup_ratio=10) as server:
            client = openai.OpenAI(base_url=server.base_url, api_key="unused")

    Keyword arguments are mockserve flags (see :func:`flag_args`); ``host`` and ``port``
    default to ``127.0.0.1`` and ``0`` (a free port, read back from the address mockserve
    prints). :meth:`start` returns once ``GET /health`` answers 200 (after any
    ``startup_delay``), within ``startup_timeout`` seconds, or raises :class:`MockServerError`
    with mockserve's stderr. :meth:`stop` sends SIGTERM, waits ``stop_timeout`` seconds (mockserve
    drains open requests for up to its ``--shutdown-timeout``, 5 s by default) and then kills it.

    Attributes once started: ``url`` (``http://127.0.0.1:PORT``: ``/health``, ``/metrics``),
    ``base_url`` (``url + "/v1"``, what OpenAI SDKs take), ``host``, ``port``, ``process``.
    """

    def __init__(
        self,
        *,
        startup_timeout: float = 30.0,
        stop_timeout: float = 10.0,
        executable: Optional[str] = None,
        **flags: FlagValue,
    ) -> None:
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.executable = executable
        self.flags: Dict[str, FlagValue] = {"host": "127.0.0.1", "port": 0, **flags}
        self.process: Optional[subprocess.Popen] = None
        self.host: Optional[str] = None
        self.port: Optional[int] = None
        self._stdout: Optional[IO[bytes]] = None
        self._stderr: Optional[IO[bytes]] = None

    @property
    def url(self) -> str:
        """``http://HOST:PORT``, the server's root (``/health``, ``/metrics``, ``/tokenize``)."""
        if self.port is None:
            raise RuntimeError("MockServer is not running: call start() or use it in a with block")
        host = f"[{self.host}]" if self.host and ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def base_url(self) -> str:
        """``http://HOST:PORT/v1``, the base URL OpenAI clients take."""
        return self.url + "/v1"

    def command(self) -> List[str]:
        """The command line :meth:`start` runs."""
        flags = {"exit_on_stdin_eof": True, **self.flags}
        return [self.executable or binary_path("mockserve"), *flag_args(flags)]

    def start(self) -> "MockServer":
        """Start mockserve and wait until it is healthy; see the class docs."""
        if self.process is not None:
            raise RuntimeError("MockServer already started")
        command = self.command()
        # Files, not pipes: nobody has to keep reading them while the server runs.
        self._stdout = tempfile.TemporaryFile()
        self._stderr = tempfile.TemporaryFile()
        # stdin: a pipe whose write end only this process holds (close_fds keeps it out of
        # other children); it closes when this process ends, however, and mockserve then
        # shuts down (--exit-on-stdin-eof). The parent-death signal fires when the forking
        # *thread* ends, so it is asked for only from the main thread.
        main_thread = threading.current_thread() is threading.main_thread()
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=self._stdout,
            stderr=self._stderr,
            close_fds=True,
            preexec_fn=_parent_death_signal() if main_thread else None,
        )
        deadline = time.monotonic() + self.startup_timeout
        try:
            self._wait_for_address(deadline)
            self._wait_for_health(deadline)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> Optional[int]:
        """Stop mockserve (SIGTERM, then SIGKILL after ``stop_timeout``); returns its exit status.

        Safe to call more than once and on a server that already exited.
        """
        process = self.process
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=self.stop_timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if process.stdin is not None:
            process.stdin.close()
        for stream in (self._stdout, self._stderr):
            if stream is not None:
                stream.close()
        self._stdout = self._stderr = None
        return process.returncode

    def stderr(self) -> str:
        """What mockserve has written on stderr so far."""
        return _read_all(self._stderr)

    def __enter__(self) -> "MockServer":
        return self.start()

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = self.url if self.port is not None else "not started"
        return f"<MockServer {state}>"

    def _fail(self, message: str) -> MockServerError:
        assert self.process is not None
        return MockServerError(message, self.stderr(), self.process.poll())

    def _wait_for_address(self, deadline: float) -> None:
        assert self.process is not None
        while True:
            found = _LISTENING.search(_read_bytes(self._stdout))
            if found:
                self.host = found.group(1).decode().strip("[]")  # [::1] -> ::1
                self.port = int(found.group(2))
                return
            code = self.process.poll()
            if code is not None:
                raise self._fail(f"mockserve exited with status {code} before listening")
            if time.monotonic() >= deadline:
                raise self._fail(
                    f"mockserve printed no address within {self.startup_timeout:g} s"
                )
            time.sleep(_POLL_S)

    def _wait_for_health(self, deadline: float) -> None:
        assert self.process is not None
        last = "no answer"
        while True:
            code = self.process.poll()
            if code is not None:
                raise self._fail(f"mockserve exited with status {code} while starting")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._fail(
                    f"{self.url}/health did not answer 200 within "
                    f"{self.startup_timeout:g} s (last: {last})"
                )
            try:
                with urllib.request.urlopen(
                    self.url + "/health", timeout=min(2.0, remaining)
                ) as answer:
                    if answer.status == 200:
                        return
                    last = f"status {answer.status}"
            except urllib.error.HTTPError as e:
                last = f"status {e.code}"
            except (urllib.error.URLError, OSError) as e:
                last = str(e)
            time.sleep(_POLL_S)


def _read_bytes(stream: Optional[IO[bytes]]) -> bytes:
    # pread: the child shares this file's offset, so the parent must never move it.
    if stream is None:
        return b""
    fd = stream.fileno()
    return os.pread(fd, os.fstat(fd).st_size, 0)


def _read_all(stream: Optional[IO[bytes]]) -> str:
    return _read_bytes(stream).decode("utf-8", errors="replace")

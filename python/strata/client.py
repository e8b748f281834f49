"""Finding and connecting to stratad.

The socket is, in order: the `socket` argument, $STRATA_SOCKET, the daemon's
own default ($XDG_RUNTIME_DIR/strata/stratad.sock, else
/run/strata/stratad.sock: the path stratad listens on without --socket).
"""
import os

from strata.errors import DaemonUnavailableError, StrataError

try:
    from strata import _native
except ImportError as e:  # pragma: no cover - depends on the installation
    raise ImportError(
        "strata's extension strata._native is missing: install the package with "
        "`python -m pip install ./python` from the strata checkout, or put the build's "
        "python/ folder (build/python) on PYTHONPATH") from e


def default_socket_path():
    runtime_dir = os.environ.get("XDG_RUNTIME_DIR", "")
    if runtime_dir:
        return os.path.join(runtime_dir, "strata", "stratad.sock")
    return "/run/strata/stratad.sock"


def resolve_socket(socket=None):
    """Returns (path, where it came from)."""
    if socket:
        return str(socket), "the socket argument"
    env = os.environ.get("STRATA_SOCKET", "")
    if env:
        return env, "$STRATA_SOCKET"
    return default_socket_path(), "the default path"


def connect(socket=None, rpc_timeout_s=30.0, step_timeout_s=300.0):
    """A strata._native.Client connected to stratad; DaemonUnavailableError,
    naming the socket and how to start stratad, when none answers."""
    path, source = resolve_socket(socket)
    if not os.path.exists(path):
        raise DaemonUnavailableError(_unavailable(path, source, "the socket does not exist"), "UNAVAILABLE")
    try:
        return _native.Client(path, rpc_timeout_s, step_timeout_s)
    except StrataError as e:
        if e.code in ("UNAVAILABLE", "DEADLINE_EXCEEDED"):
            raise DaemonUnavailableError(_unavailable(path, source, str(e)), e.code) from e
        raise


def _unavailable(path, source, why):
    return (f"no stratad answers at {path} (from {source}): {why}. Start one with "
            f"`stratad --socket {path} --nvme_path DIR` (build/bin/stratad in a strata build), "
            "or point strata at a running one with socket=... or STRATA_SOCKET.")

"""strata's exception type (the extension raises it for every failed call)."""


class StrataError(RuntimeError):
    """A failed call to stratad or a misuse of strata. `code` is the absl status
    code's name ("NOT_FOUND", "INVALID_ARGUMENT", "UNAVAILABLE", ...)."""

    def __init__(self, message, code="UNKNOWN"):
        super().__init__(message)
        self.code = code


class DaemonUnavailableError(StrataError):
    """No stratad answers at the socket strata was told to use."""

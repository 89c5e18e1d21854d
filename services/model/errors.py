"""Error families shared by every GeoServe core.

Two families, as in the conventions: `UsageError` is the caller's misuse of an API (a bug
in the calling code); `InvalidInput` is bad data from a peer, a file or a user — it carries
the field (or file path and key) at fault, and runtimes map it to INVALID_ARGUMENT or a
non-zero exit. Capacity and lifecycle conditions have their own subclasses so a single
interceptor can map them to gRPC status codes.
"""

from __future__ import annotations


class GeoServeError(Exception):
    """Base class of every domain error."""

    status_code = "INTERNAL"


class UsageError(GeoServeError):
    """The calling code broke an API contract (a bug, not bad data)."""

    status_code = "FAILED_PRECONDITION"


class InvalidInput(GeoServeError):
    """Bad data from a peer, a file or a user; names the field at fault."""

    status_code = "INVALID_ARGUMENT"

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


class ConfigError(InvalidInput):
    """A configuration or data file is malformed; names the file path and key."""

    def __init__(self, path: str, key: str, message: str) -> None:
        self.path = path
        self.key = key
        super().__init__(f"{path}: {key}" if key else path, message)


class AlreadyExists(InvalidInput):
    """An identifier is already in use (a request id still in flight); names the field."""

    status_code = "ALREADY_EXISTS"


class CapacityExceeded(GeoServeError):
    """A queue or admission limit is full."""

    status_code = "RESOURCE_EXHAUSTED"


class Unavailable(GeoServeError):
    """The component is draining, down or not ready."""

    status_code = "UNAVAILABLE"

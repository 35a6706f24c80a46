"""Exceptions raised by the sbx SDK.

Every error the daemon returns becomes an :class:`SbxError` (or one of its
subclasses) carrying the Connect error code (``"not_found"``,
``"invalid_argument"``...) in :attr:`SbxError.code` and the daemon's message in
:attr:`SbxError.message`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Optional, Type

if TYPE_CHECKING:  # pragma: no cover
    from .process import CommandResult

__all__ = [
    "SbxError",
    "CanceledError",
    "UnknownError",
    "InvalidArgumentError",
    "DeadlineExceededError",
    "NotFoundError",
    "AlreadyExistsError",
    "PermissionDeniedError",
    "ResourceExhaustedError",
    "FailedPreconditionError",
    "AbortedError",
    "OutOfRangeError",
    "UnimplementedError",
    "InternalError",
    "UnavailableError",
    "DataLossError",
    "UnauthenticatedError",
    "SbxConnectionError",
    "CommandError",
    "error_from_code",
]


class SbxError(Exception):
    """An error returned by the sbx daemon (or raised talking to it).

    Attributes:
        code: the Connect error code, e.g. ``"not_found"``.
        message: the daemon's message.
        op: what the SDK was doing, e.g. ``"create sandbox"`` (may be empty).
        details: the raw ``details`` list of the Connect error, if any.
    """

    code: str = "unknown"

    def __init__(
        self,
        message: str,
        code: Optional[str] = None,
        *,
        op: str = "",
        details: Optional[List[Dict[str, Any]]] = None,
    ) -> None:
        if code is not None:
            self.code = code
        self.message = message
        self.op = op
        self.details = details or []
        # The daemon's message often names what failed the way op does
        # ("stat /x: no such file"): say it once.
        once = not op or message == op or message.startswith(op + ": ")
        super().__init__(message if once else f"{op}: {message}")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, message={self.message!r}, op={self.op!r})"


class CanceledError(SbxError):
    """The call was canceled."""

    code = "canceled"


class UnknownError(SbxError):
    """An error without a more specific code."""

    code = "unknown"


class InvalidArgumentError(SbxError):
    """The request was malformed (bad name, impossible limit, ...)."""

    code = "invalid_argument"


class DeadlineExceededError(SbxError):
    """The call took longer than its deadline."""

    code = "deadline_exceeded"


class NotFoundError(SbxError):
    """A sandbox, file or image does not exist."""

    code = "not_found"


class AlreadyExistsError(SbxError):
    """A sandbox name, file or image reference is already taken."""

    code = "already_exists"


class PermissionDeniedError(SbxError):
    """The operation is not permitted."""

    code = "permission_denied"


class ResourceExhaustedError(SbxError):
    """A limit (memory, disk, sandbox count...) was reached."""

    code = "resource_exhausted"


class FailedPreconditionError(SbxError):
    """The target is not in a state that allows the operation (e.g. stopped)."""

    code = "failed_precondition"


class AbortedError(SbxError):
    """The operation was aborted."""

    code = "aborted"


class OutOfRangeError(SbxError):
    """A value was out of range."""

    code = "out_of_range"


class UnimplementedError(SbxError):
    """The daemon does not implement this call (or this protocol for it)."""

    code = "unimplemented"


class InternalError(SbxError):
    """The daemon failed internally."""

    code = "internal"


class UnavailableError(SbxError):
    """The daemon (or a sandbox's agent) is unavailable."""

    code = "unavailable"


class DataLossError(SbxError):
    """Data was lost or corrupted."""

    code = "data_loss"


class UnauthenticatedError(SbxError):
    """The caller is not authenticated."""

    code = "unauthenticated"


class SbxConnectionError(UnavailableError):
    """The daemon could not be reached (refused, reset, DNS...)."""


class CommandError(SbxError):
    """A command run with ``raise_on_error=True`` exited non-zero or timed out.

    Attributes:
        result: the :class:`~sbx.CommandResult` of the command.
    """

    code = "command_failed"

    def __init__(self, result: "CommandResult", command: str = "") -> None:
        self.result = result
        self.command = command
        if result.timed_out:
            what = "timed out"
        elif getattr(result, "oom_killed", False):
            what = "was killed: out of memory (the sandbox's memory limit)"
        elif result.error:
            what = f"could not start: {result.error}"
        else:
            what = f"exited with code {result.exit_code}"
        if getattr(result, "pids_limit_hit", False):
            what += " (the sandbox's pids limit refused a fork while it ran)"
        msg = f"command {command!r} {what}" if command else f"command {what}"
        tail = result.stderr.strip()
        if tail:
            if len(tail) > 2000:
                tail = "..." + tail[-2000:]
            msg += f"\nstderr:\n{tail}"
        super().__init__(msg, op="run")

    @property
    def exit_code(self) -> int:
        """The command's exit code."""
        return self.result.exit_code


_BY_CODE: Dict[str, Type[SbxError]] = {
    cls.code: cls
    for cls in (
        CanceledError,
        UnknownError,
        InvalidArgumentError,
        DeadlineExceededError,
        NotFoundError,
        AlreadyExistsError,
        PermissionDeniedError,
        ResourceExhaustedError,
        FailedPreconditionError,
        AbortedError,
        OutOfRangeError,
        UnimplementedError,
        InternalError,
        UnavailableError,
        DataLossError,
        UnauthenticatedError,
    )
}


def error_from_code(
    code: str,
    message: str,
    *,
    op: str = "",
    details: Optional[List[Dict[str, Any]]] = None,
) -> SbxError:
    """Return the :class:`SbxError` subclass instance for a Connect ``code``."""
    cls = _BY_CODE.get(code, SbxError)
    return cls(message, code if cls is SbxError else None, op=op, details=details)

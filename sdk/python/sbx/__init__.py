"""sbx: the Python SDK of sbx, a self-hosted sandbox platform.

Standard library only. It talks to the sbx daemon with Connect's HTTP/JSON
protocol (``$SBX_ADDR``, default ``127.0.0.1:7777``)::

    import sbx

    with sbx.Sandbox.create(memory="256M", timeout=600) as sb:
        r = sb.run("python3 -c 'print(6*7)'")
        print(r.stdout, r.exit_code)

        p = sb.exec("sh", "-c", "for i in 1 2 3; do echo $i; sleep 1; done")
        for line in p.stdout:          # lines as they are printed
            print("got", line, end="")
        print("exit", p.wait())

        sb.files.write("/root/in.txt", "data")
        print(sb.files.read_text("/root/in.txt"))

An asyncio flavour lives in :mod:`sbx.aio`.
"""

from ._tar import IgnoreFileError, ReplacedFileError, UnsafeArchiveError
from ._transport import DEFAULT_ADDR
from .client import Client
from .code import Artifact, CodeContext, CodeResult, Plot, PolicyFinding
from .codebase import Codebase, CodebaseMount, Codebases, SkippedFile, SyncConflict, SyncResult
from .errors import (
    AbortedError,
    AlreadyExistsError,
    CanceledError,
    CommandError,
    DataLossError,
    DeadlineExceededError,
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    OutOfRangeError,
    PermissionDeniedError,
    ResourceExhaustedError,
    SbxConnectionError,
    SbxError,
    UnauthenticatedError,
    UnavailableError,
    UnimplementedError,
    UnknownError,
)
from .files import Files
from .images import Images
from .logs import LogChunk, LogLines, SandboxLogs
from .observe import EVENT_TYPES, Event, EventStream, SandboxUsage, UsageSample
from .ports import Port
from .process import CommandResult, ExitStatus, OutputStream, Process
from .processes import BackgroundProcess, Processes
from .recipe import Recipe
from .sandbox import Sandbox
from .session import Session, SessionResult
from .tenants import Tenant, TenantQuotas, TenantUsage, Tenants
from .volumes import Volume, VolumeMount, Volumes
from .types import (
    DomainSecret,
    FileInfo,
    ImageConfig,
    ImageInfo,
    ImageProgress,
    LayerProgress,
    NetworkPolicy,
    PathPolicy,
    PermissionRule,
    Resources,
    SandboxInfo,
    SandboxStats,
    parse_size,
)

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_ADDR",
    "Client",
    "Sandbox",
    "Process",
    "BackgroundProcess",
    "Processes",
    "OutputStream",
    "CommandResult",
    "ExitStatus",
    "LogChunk",
    "LogLines",
    "SandboxLogs",
    "Files",
    "Images",
    "Recipe",
    "Codebase",
    "CodebaseMount",
    "Codebases",
    "SkippedFile",
    "SyncConflict",
    "SyncResult",
    "Port",
    "Artifact",
    "CodeContext",
    "CodeResult",
    "Plot",
    "PolicyFinding",
    "Session",
    "SessionResult",
    "Volume",
    "VolumeMount",
    "Volumes",
    "Tenant",
    "TenantQuotas",
    "TenantUsage",
    "Tenants",
    "EVENT_TYPES",
    "Event",
    "EventStream",
    "SandboxUsage",
    "UsageSample",
    "FileInfo",
    "ImageConfig",
    "ImageInfo",
    "ImageProgress",
    "LayerProgress",
    "NetworkPolicy",
    "DomainSecret",
    "PathPolicy",
    "PermissionRule",
    "Resources",
    "SandboxInfo",
    "SandboxStats",
    "parse_size",
    "SbxError",
    "SbxConnectionError",
    "CommandError",
    "UnsafeArchiveError",
    "IgnoreFileError",
    "ReplacedFileError",
    "AbortedError",
    "AlreadyExistsError",
    "CanceledError",
    "DataLossError",
    "DeadlineExceededError",
    "FailedPreconditionError",
    "InternalError",
    "InvalidArgumentError",
    "NotFoundError",
    "OutOfRangeError",
    "PermissionDeniedError",
    "ResourceExhaustedError",
    "UnauthenticatedError",
    "UnavailableError",
    "UnimplementedError",
    "UnknownError",
]

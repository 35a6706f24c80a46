"""Sandboxes: create, find, run commands in, stop, resume and destroy."""

from __future__ import annotations

import datetime as _dt
import io
import hashlib
import os
import shlex
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Union

from ._transport import b64encode
from . import code as _code
from . import ports as _ports
from . import processes as _processes
from . import session as _session
from .client import Client, selectors_from_labels
from .codebase import CodebaseMount, SyncResult, mounts_to_json
from .errors import CommandError, NotFoundError
from .fileobj import SandboxFile, open_file
from .files import Files
from .logs import SERVICE as _LOGS_SERVICE, LogLines, SandboxLogs, logs_request
from .ports import Port
from .process import CommandResult, ExitStatus, Process
from .types import DomainSecret, ImageInfo, NetworkPolicy, PathPolicy, SandboxInfo, SandboxStats, parse_size
from .volumes import VolumeMountLike, volume_mounts_to_json

__all__ = ["Sandbox"]

_SERVICE = "sbx.v1.SandboxService"

Seconds = Union[int, float, _dt.timedelta]


def _ms(value: Optional[Seconds], what: str) -> int:
    if value is None:
        return 0
    if isinstance(value, _dt.timedelta):
        value = value.total_seconds()
    if value < 0:
        raise ValueError(f"{what} must not be negative")
    return int(round(value * 1000))


def _client(client: Optional[Client]) -> Client:
    return client if client is not None else Client()


class Sandbox:
    """A handle on one sandbox.

    Create one with :meth:`create` (or :meth:`from_local`), or find existing
    ones with :meth:`from_id`, :meth:`from_name` and :meth:`list`. Used as a
    context manager, a sandbox this handle created is terminated when the
    block exits::

        with sbx.Sandbox.create(memory="256M", timeout=600) as sb:
            print(sb.run("python3 -c 'print(6*7)'").stdout)

    A handle that found an existing sandbox (``from_id``, ``from_name``,
    ``list``, ``Client.get``) does not own it: leaving its ``with`` block
    leaves the sandbox running (call :meth:`terminate` to end it).

    :attr:`info` is a snapshot; :meth:`refresh` reloads it.
    """

    def __init__(self, client: Client, info: SandboxInfo, *, owned: bool = False) -> None:
        self._client = client
        self._info = info
        self._owned = owned
        #: Codebases made for this sandbox by :meth:`from_local`, deleted
        #: after it when the ``with`` block ends.
        self._own_codebases: List[str] = []
        #: Files of the sandbox (read, write, list, upload_dir...).
        self.files = Files(client._transport, info.id)

    # -- finding and creating ------------------------------------------------

    @classmethod
    def create(
        cls,
        image: Optional[str] = None,
        *,
        name: Optional[str] = None,
        labels: Optional[Mapping[str, str]] = None,
        env: Optional[Mapping[str, str]] = None,
        secrets: Optional[Mapping[str, str]] = None,
        domain_secrets: Optional[Sequence[DomainSecret]] = None,
        cpu: Optional[float] = None,
        memory: Union[int, str, None] = None,
        pids: Optional[int] = None,
        disk: Union[int, str, None] = None,
        timeout: Optional[Seconds] = None,
        idle_timeout: Optional[Seconds] = None,
        stop_when_idle: bool = False,
        workdir: Optional[str] = None,
        user: Optional[str] = None,
        command: Optional[Sequence[str]] = None,
        runtime: Optional[str] = None,
        network: Union[str, NetworkPolicy, None] = None,
        volumes: Optional[Sequence[VolumeMountLike]] = None,
        path_policies: Optional[Sequence[PathPolicy]] = None,
        codebases: Optional[Sequence[Any]] = None,
        scoped_token: bool = False,
        entrypoint: bool = True,
        auto_resume: bool = False,
        dockerfile: Union[str, "os.PathLike[str]", None] = None,
        build_args: Optional[Mapping[str, str]] = None,
        client: Optional[Client] = None,
    ) -> "Sandbox":
        """Create a sandbox and return once it is ready for commands.

        Unset arguments take the daemon's defaults (512 MiB memory, 1 CPU, 512
        PIDs, 1 GiB disk, a 5-minute lifetime, the ``host`` image).

        Args:
            image: image reference (default ``"host"``: the host's /usr, read-only).
            name: unique name among live sandboxes (``[a-z0-9][a-z0-9_.-]{0,62}``).
            labels: labels to find it by with :meth:`list`.
            env: environment of every command.
            secrets: environment variables whose values the API never returns.
            domain_secrets: secrets kept out of the sandbox (:class:`~sbx.DomainSecret`):
                it sees a placeholder, and the egress proxy sends the value to the
                listed domains only, over HTTPS, in the headers named (Authorization
                by default). Needs a daemon with networking on.
            cpu: CPU limit in CPUs (0.5 is half a CPU).
            memory: memory limit, bytes or a size like ``"512M"``.
            pids: maximum number of processes and threads.
            disk: size bound of the writable layer, bytes or ``"1G"``.
            timeout: lifetime in seconds (or a timedelta).
            idle_timeout: destroy (or with ``stop_when_idle``, stop) the sandbox
                after this many seconds without exec or file activity.
            workdir: default working directory (created if missing).
            user: default user of commands (``"name"``, ``"uid"``, ``"uid:gid"``).
            command: a long-running process started with the sandbox (after
                the image's ENTRYPOINT, as ``docker run`` has it); without one,
                the image's ENTRYPOINT and CMD run. Read it with :meth:`logs`,
                :attr:`stdout`, :meth:`wait`. One that cannot start (not found,
                not executable) fails the create (``FailedPreconditionError``).
            runtime: runtime driver (default ``"oci"``).
            network: ``"none"``, ``"public"`` or a :class:`~sbx.NetworkPolicy`.
            volumes: named volumes to mount: :class:`~sbx.VolumeMount` or
                ``"NAME:/path[:ro]"`` strings (see :attr:`Client.volumes`).
            path_policies: directories to guard with permission rules
                (:class:`~sbx.PathPolicy`), e.g.
                ``[sbx.PathPolicy("/workspace", preset="agent-safe")]``.
            codebases: codebases to mount, each in a copy-on-write layer of
                its own: ``"name"`` (at /workspace), ``"name:/path"`` or
                ``("name", "/path")``.
            scoped_token: give the sandbox an API token of its own
                (``$SBX_TOKEN``, with ``$SBX_ADDR`` the daemon as the box
                reaches it): code inside may create and manage child
                sandboxes, which die with it, and nothing else. ``sbx.Client()``
                inside the box picks both up. Needs networking.
            entrypoint: ``False`` starts neither the image's ENTRYPOINT nor
                its CMD (a given ``command`` then runs alone).
            auto_resume: start the sandbox again when it is used (a command,
                a file call) while stopped, by :meth:`stop` or by idling with
                ``stop_when_idle``, instead of failing.
            dockerfile: instead of ``image``, the path of a Dockerfile to
                build first (its directory is the build context; see
                :meth:`Images.build`), as llm-sandbox takes it. The image is
                tagged ``localhost/sbx-dockerfile/<hash>`` (of the Dockerfile
                and its build args) and its steps are cached, so creating from
                an unchanged Dockerfile again runs no step.
            build_args: the Dockerfile's ARGs.
            client: the daemon to use (default: ``Client()``).

        An ``image`` the daemon does not have is pulled first (see
        :meth:`Images.ensure` to see the pull's progress).

        Raises:
            AlreadyExistsError: ``name`` is taken.
            InvalidArgumentError: a bad name, limit or option.
        """
        c = _client(client)
        if dockerfile is not None:
            if image:
                raise ValueError("create: give an image or a dockerfile, not both")
            with open(os.fspath(dockerfile), "rb") as f:
                h = hashlib.sha256(f.read())
            for k in sorted(build_args or {}):
                h.update(f"\0{k}={(build_args or {})[k]}".encode())
            image = f"localhost/sbx-dockerfile/{h.hexdigest()[:16]}:latest"
            c.images.build(tag=image, dockerfile=dockerfile, build_args=dict(build_args or {}))
        elif build_args:
            raise ValueError("create: build_args go with a dockerfile")
        req: Dict[str, Any] = {}
        if image:
            req["image"] = image
        if name:
            req["name"] = name
        if labels:
            req["labels"] = dict(labels)
        if env:
            req["env"] = dict(env)
        if secrets:
            req["secrets"] = dict(secrets)
        if domain_secrets:
            req["domainSecrets"] = [d.to_json() for d in domain_secrets]
        if command:
            if isinstance(command, str):
                raise TypeError("command must be a list of strings")
            req["command"] = list(command)
        if workdir:
            req["workdir"] = workdir
        if user:
            req["user"] = user
        if runtime:
            req["runtime"] = runtime
        res: Dict[str, str] = {}
        if memory is not None:
            res["memoryBytes"] = str(parse_size(memory))
        if cpu is not None:
            if cpu < 0:
                raise ValueError("cpu must not be negative")
            res["cpuMillis"] = str(int(round(cpu * 1000)))
        if pids is not None:
            res["pids"] = str(int(pids))
        if disk is not None:
            res["diskBytes"] = str(parse_size(disk))
        if res:
            req["resources"] = res
        if timeout is not None:
            req["timeoutMs"] = str(_ms(timeout, "timeout"))
        if idle_timeout is not None:
            req["idleTimeoutMs"] = str(_ms(idle_timeout, "idle_timeout"))
        if stop_when_idle:
            req["idleAction"] = "IDLE_ACTION_STOP"
        if network is not None:
            policy = NetworkPolicy(mode=network) if isinstance(network, str) else network
            req["network"] = policy.to_json()
        if volumes:
            req["volumes"] = volume_mounts_to_json(volumes)
        if path_policies:
            req["pathPolicies"] = [p.to_json() for p in path_policies]
        if codebases:
            req["codebases"] = mounts_to_json(codebases)
        if scoped_token:
            req["scopedToken"] = True
        if not entrypoint:
            req["noEntrypoint"] = True
        if auto_resume:
            req["autoResume"] = True
        resp = c._transport.unary(_SERVICE, "CreateSandbox", req, op="create sandbox")
        return cls(c, SandboxInfo.from_json(resp.get("sandbox") or {}), owned=True)

    @classmethod
    def from_local(
        cls,
        path: Union[str, "os.PathLike[str]"],
        *,
        preset: str = "view-only",
        mount: str = "/workspace",
        rules: Sequence[Any] = (),
        ignore: Sequence[str] = (),
        include_git: bool = True,
        client: Optional[Client] = None,
        **create_kwargs: Any,
    ) -> "Sandbox":
        """Upload the local directory ``path`` as a codebase and create a
        sandbox with it mounted at ``mount``, guarded by ``preset`` (default
        ``"view-only"``: the agent sees names and metadata, reads nothing;
        ``"read-only"``, ``"agent-safe"``... open more, ``rules`` refine it),
        in one call, like AgentFense's ``Sandbox.from_local``. ``preset=""``
        mounts it unguarded: fully writable (in the sandbox's own
        copy-on-write layer; ``sync_codebase`` writes changes back).

        Used as a context manager, the sandbox is terminated and then the
        codebase deleted. Other keyword arguments are :meth:`create`'s.
        """
        c = _client(client)
        cb = c.codebases.from_local(path, ignore=ignore, include_git=include_git)
        m = CodebaseMount(cb.id, mount, preset=preset, rules=list(rules))
        try:
            extra = list(create_kwargs.pop("codebases", None) or [])
            sb = cls.create(client=c, codebases=[m, *extra], **create_kwargs)
        except BaseException:
            c.codebases.delete(cb.id)
            raise
        sb._own_codebases.append(cb.id)
        return sb

    @classmethod
    def from_id(cls, sandbox_id: str, *, client: Optional[Client] = None) -> "Sandbox":
        """Find a sandbox by id (or name). Cheap: the daemon does not measure
        the sandbox for it (:attr:`info` has no stats; :attr:`stats` and
        :meth:`refresh` fetch them).

        Raises:
            NotFoundError: no such sandbox.
        """
        c = _client(client)
        resp = c._transport.unary(
            _SERVICE, "GetSandbox", {"sandbox": sandbox_id, "noStats": True}, op=f"get sandbox {sandbox_id}"
        )
        return cls(c, SandboxInfo.from_json(resp.get("sandbox") or {}))

    @classmethod
    def from_name(cls, name: str, *, client: Optional[Client] = None) -> "Sandbox":
        """Find a sandbox by name.

        Raises:
            NotFoundError: no such sandbox.
        """
        return cls.from_id(name, client=client)

    @classmethod
    def list(
        cls,
        labels: Optional[Mapping[str, Optional[str]]] = None,
        selectors: Optional[Sequence[str]] = None,
        *,
        client: Optional[Client] = None,
    ) -> List["Sandbox"]:
        """Sandboxes matching every label in ``labels`` (``{"k": "v"}``; a
        ``None`` value means "has the key") and every selector (``"k=v"``,
        ``"k!=v"``, ``"k"``, ``"!k"``). No filter lists all sandboxes."""
        c = _client(client)
        sel = selectors_from_labels(labels, selectors)
        req: Dict[str, Any] = {"selectors": sel} if sel else {}
        resp = c._transport.unary(_SERVICE, "ListSandboxes", req, op="list sandboxes")
        return [cls(c, SandboxInfo.from_json(s)) for s in resp.get("sandboxes") or []]

    # -- properties ----------------------------------------------------------

    @property
    def owned(self) -> bool:
        """Whether this handle created the sandbox (then leaving its ``with``
        block terminates it)."""
        return self._owned

    @property
    def client(self) -> Client:
        """The client this sandbox was found with."""
        return self._client

    @property
    def info(self) -> SandboxInfo:
        """The last snapshot of the sandbox (see :meth:`refresh`)."""
        return self._info

    @property
    def id(self) -> str:
        """The sandbox's id, e.g. ``"sb-3k9x0v2m7abq"``."""
        return self._info.id

    @property
    def name(self) -> str:
        """The sandbox's name (``""`` if it has none)."""
        return self._info.name

    @property
    def state(self) -> str:
        """State at the last snapshot: ``"running"``, ``"stopped"``,
        ``"destroyed"``, ``"failed"``... Call :meth:`refresh` to update it."""
        return self._info.state

    @property
    def labels(self) -> Dict[str, str]:
        """The sandbox's labels."""
        return dict(self._info.labels)

    @property
    def stats(self) -> SandboxStats:
        """Live usage (memory, CPU, PIDs, disk), fetched from the daemon on
        each access (this also refreshes :attr:`info`)."""
        self.refresh()
        return self._info.stats or SandboxStats()

    # -- lifecycle -----------------------------------------------------------

    def refresh(self) -> "Sandbox":
        """Reload :attr:`info` (with live stats). Returns self."""
        resp = self._client._transport.unary(_SERVICE, "GetSandbox", {"sandbox": self.id}, op=f"get sandbox {self.id}")
        self._info = SandboxInfo.from_json(resp.get("sandbox") or {})
        return self

    def stop(self) -> None:
        """Freeze every process of the sandbox; memory and files are kept."""
        resp = self._client._transport.unary(_SERVICE, "StopSandbox", {"sandbox": self.id}, op=f"stop sandbox {self.id}")
        if resp.get("sandbox"):
            self._info = SandboxInfo.from_json(resp["sandbox"])

    def start(self) -> None:
        """Resume a stopped sandbox."""
        resp = self._client._transport.unary(_SERVICE, "StartSandbox", {"sandbox": self.id}, op=f"start sandbox {self.id}")
        if resp.get("sandbox"):
            self._info = SandboxInfo.from_json(resp["sandbox"])

    def terminate(self, *, sync_codebases: bool = False) -> None:
        """Destroy the sandbox: kill everything in it and free what it held.
        With ``sync_codebases``, its codebase changes are synced back first
        (without force).

        Raises:
            NotFoundError: it no longer exists.
            FailedPreconditionError: ``sync_codebases`` met a conflict; the
                sandbox is kept.
        """
        req: Dict[str, Any] = {"sandbox": self.id}
        if sync_codebases:
            req["syncCodebases"] = True
        self._client._transport.unary(_SERVICE, "DestroySandbox", req, op=f"destroy sandbox {self.id}")

    def sync_codebase(self, path: Optional[str] = None, *, dry_run: bool = False, force: bool = False) -> SyncResult:
        """Write this sandbox's changes under its codebase mount at ``path``
        (default: its only one) back into the codebase; see
        :meth:`sbx.codebase.Codebases.sync`."""
        return self._client.codebases.sync(self.id, path, dry_run=dry_run, force=force)

    #: Alias of :meth:`terminate`, like the Go SDK's Destroy.
    destroy = terminate

    def snapshot(self, tag: str = "") -> ImageInfo:
        """Save the sandbox's filesystem (image plus its writable layer) as a
        new image, tagged ``tag`` if given; create sandboxes from it later
        with ``Sandbox.create(image=tag)``. Returns the image."""
        req: Dict[str, Any] = {"sandbox": self.id}
        if tag:
            req["tag"] = tag
        resp = self._client._transport.unary(_SERVICE, "SnapshotSandbox", req, op=f"snapshot sandbox {self.id}")
        return ImageInfo.from_json(resp.get("image") or {})

    def update_network(self, network: Union[str, NetworkPolicy]) -> None:
        """Change the network policy of the running sandbox (``"none"``,
        ``"public"`` or a :class:`~sbx.NetworkPolicy`)."""
        policy = NetworkPolicy(mode=network) if isinstance(network, str) else network
        req = {"sandbox": self.id, "network": policy.to_json()}
        resp = self._client._transport.unary(_SERVICE, "UpdateNetwork", req, op=f"update network of {self.id}")
        if resp.get("sandbox"):
            self._info = SandboxInfo.from_json(resp["sandbox"])

    def update(
        self,
        *,
        timeout: Optional[Seconds] = None,
        idle_timeout: Optional[Seconds] = None,
        stop_when_idle: Optional[bool] = None,
        labels: Optional[Mapping[str, str]] = None,
        remove_labels: Optional[Sequence[str]] = None,
        replace_labels: bool = False,
        memory: Union[int, str, None] = None,
        cpu: Optional[float] = None,
        pids: Optional[int] = None,
        auto_resume: Optional[bool] = None,
    ) -> None:
        """Change the running or stopped sandbox; arguments left ``None``
        keep their value, and nothing changes if any part is refused.

        Args:
            timeout: a new lifetime in seconds counted from now (E2B's
                ``set_timeout``): the sandbox is destroyed this long after the
                call, sooner or later than before. 0 removes the limit where
                the daemon has no maximum.
            idle_timeout: a new idle timeout in seconds (0: none).
            stop_when_idle: whether idling stops (``True``) or destroys it.
            labels: labels to add or replace (with ``replace_labels``, the
                labels become exactly these).
            remove_labels: label keys to remove.
            memory, cpu, pids: new limits (as in :meth:`create`). The runtime
                must be able to change them, and they count against the
                tenant's quotas like a create's.
            auto_resume: whether using the stopped sandbox starts it.

        Raises:
            InvalidArgumentError: a bad value, or one past the host's bounds.
            FailedPreconditionError: the runtime cannot change limits.
            ResourceExhaustedError: past the tenant's memory or CPU quota.
        """
        req: Dict[str, Any] = {"sandbox": self.id}
        if timeout is not None:
            req["timeoutMs"] = str(_ms(timeout, "timeout"))
        if idle_timeout is not None:
            req["idleTimeoutMs"] = str(_ms(idle_timeout, "idle_timeout"))
        if stop_when_idle is not None:
            req["idleAction"] = "IDLE_ACTION_STOP" if stop_when_idle else "IDLE_ACTION_DESTROY"
        if labels:
            req["setLabels"] = dict(labels)
        if remove_labels:
            if isinstance(remove_labels, str):
                raise TypeError("remove_labels must be a list of keys")
            req["removeLabels"] = list(remove_labels)
        if replace_labels:
            req["replaceLabels"] = True
        res: Dict[str, str] = {}
        if memory is not None:
            res["memoryBytes"] = str(parse_size(memory))
        if cpu is not None:
            if cpu <= 0:
                raise ValueError("cpu must be positive")
            res["cpuMillis"] = str(int(round(cpu * 1000)))
        if pids is not None:
            if pids <= 0:
                raise ValueError("pids must be positive")
            res["pids"] = str(int(pids))
        if res:
            req["resources"] = res
        if auto_resume is not None:
            req["autoResume"] = bool(auto_resume)
        resp = self._client._transport.unary(_SERVICE, "UpdateSandbox", req, op=f"update sandbox {self.id}")
        if resp.get("sandbox"):
            self._info = SandboxInfo.from_json(resp["sandbox"])

    def set_timeout(self, timeout: Seconds) -> None:
        """Give the sandbox a new lifetime of ``timeout`` seconds counted from
        now (E2B's ``set_timeout``): it is destroyed that long after this
        call, whether that is sooner or later than before."""
        self.update(timeout=timeout)

    def set_labels(self, labels: Mapping[str, str]) -> None:
        """Make the sandbox's labels exactly ``labels`` (Modal's ``set_tags``);
        :meth:`update` adds and removes single ones."""
        self.update(labels=labels, replace_labels=True)

    #: Modal's name for :meth:`set_labels`.
    set_tags = set_labels

    # -- the sandbox's own command -------------------------------------------

    def logs(
        self,
        *,
        follow: bool = False,
        since: Union[float, _dt.datetime, _dt.timedelta, None] = None,
        tail: Optional[int] = None,
    ) -> SandboxLogs:
        """The output of the sandbox's own command (``command``, else the
        image's ENTRYPOINT/CMD), as :class:`~sbx.LogChunk` pieces::

            for chunk in sb.logs(follow=True):
                print(chunk.stream, chunk.text, end="")

        The sandbox keeps the newest 1 MiB of each stream; what it dropped is
        counted in the result's ``dropped_stdout``/``dropped_stderr``. Any
        number of readers may follow at once; closing one does not affect
        the command.

        Args:
            follow: keep reading new output until the command exits.
            since: only output since this time (epoch seconds or a datetime),
                or this long ago (a timedelta).
            tail: only the last this many lines of what is kept.

        Raises:
            FailedPreconditionError: the sandbox has no command, or is stopped.
        """
        req = logs_request(self.id, follow, since, tail)
        stream = self._client._transport.server_stream(_LOGS_SERVICE, "Logs", req, op=f"logs of {self.id}")
        return SandboxLogs(stream)

    @property
    def stdout(self) -> LogLines:
        """The lines of the command's stdout, from what is kept, followed
        until it exits (each access reads anew)."""
        return LogLines(self.logs(follow=True), "stdout")

    @property
    def stderr(self) -> LogLines:
        """The lines of the command's stderr, as :attr:`stdout`."""
        return LogLines(self.logs(follow=True), "stderr")

    def wait(self, timeout: Optional[float] = None) -> ExitStatus:
        """Wait for the sandbox's own command to exit and return how it
        ended (kept for the sandbox's life: any number of calls get it).

        Raises:
            FailedPreconditionError: the sandbox has no command.
            DeadlineExceededError: ``timeout`` seconds passed first.
        """
        resp = self._client._transport.unary(
            _LOGS_SERVICE, "Wait", {"sandbox": self.id}, op=f"wait for {self.id}", timeout=timeout
        )
        return ExitStatus.from_json(resp.get("exited") or {})

    @property
    def returncode(self) -> Optional[int]:
        """The command's exit code, or ``None`` while it runs."""
        with self.logs(tail=0) as lg:
            for _ in lg:
                pass
            return None if lg.exit is None else lg.exit.exit_code

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._owned:
            return
        try:
            self.terminate()
        except NotFoundError:
            pass
        for cb in self._own_codebases:
            try:
                self._client.codebases.delete(cb)
            except NotFoundError:
                pass

    # -- commands ------------------------------------------------------------

    def _exec_request(
        self,
        argv: Optional[List[str]],
        shell: Optional[str],
        env: Optional[Mapping[str, str]],
        workdir: Optional[str],
        timeout: Optional[Seconds],
        stdin: Union[bytes, str, None],
        user: Optional[str],
    ) -> Dict[str, Any]:
        req: Dict[str, Any] = {"sandbox": self.id}
        if shell is not None:
            req["shell"] = shell
        else:
            req["argv"] = argv
        if env:
            req["env"] = dict(env)
        if workdir:
            req["workdir"] = workdir
        if timeout:
            req["timeoutMs"] = str(_ms(timeout, "timeout"))
        if stdin:
            req["stdin"] = b64encode(stdin.encode("utf-8") if isinstance(stdin, str) else bytes(stdin))
        if user:
            req["user"] = user
        return req

    def exec(
        self,
        *args: str,
        shell: bool = False,
        env: Optional[Mapping[str, str]] = None,
        workdir: Optional[str] = None,
        timeout: Optional[Seconds] = None,
        stdin: Union[bool, bytes, str, None] = None,
        user: Optional[str] = None,
        encoding: str = "utf-8",
        background: bool = False,
        pty: bool = False,
        tag: str = "",
    ) -> Union[Process, "_processes.BackgroundProcess"]:
        """Start a command and return a :class:`~sbx.Process` whose
        ``stdout``/``stderr`` yield lines as they are printed::

            p = sb.exec("python3", "-c", "print('hi')")
            for line in p.stdout:
                print(line, end="")
            p.wait()

        A foreground command is killed when this client goes away (the
        process ends, the connection drops), so nothing runs on unseen.
        With ``background=True`` it runs on instead and a
        :class:`~sbx.BackgroundProcess` is returned: it outlives this
        client and a daemon restart, takes stdin after its start
        (``stdin=True``), runs under a pseudo-terminal with ``pty=True``,
        and any client finds it with ``sb.processes.connect(pid)`` (see
        :meth:`Processes.start`).

        Args:
            args: the argv (``args[0]`` is looked up in PATH); a single list
                is accepted too. With ``shell=True``, one command line run by
                ``/bin/sh -c``.
            env: extra environment on top of the sandbox's.
            workdir: working directory (default: the sandbox's).
            timeout: kill the command's process group after this many seconds.
            stdin: data given to the command on stdin, then EOF; with
                ``background=True``, ``True`` keeps stdin open for
                ``send_stdin`` (a foreground command takes no stdin after
                its start: that needs HTTP/2).
            user: run as this user (``"name"``, ``"uid"``, ``"uid:gid"``).
            background, pty, tag: see above; ``pty`` and ``stdin=True``
                need ``background=True``.

        Raises:
            NotFoundError: the sandbox no longer exists.
            FailedPreconditionError: the sandbox is stopped.
        """
        if not background and (pty or tag or stdin is True):
            raise ValueError("pty, tag and stdin=True need background=True (input after the start goes to background processes)")
        argv: List[str]
        if len(args) == 1 and isinstance(args[0], (list, tuple)):
            argv = [str(a) for a in args[0]]
        else:
            argv = [str(a) for a in args]
        if not argv:
            raise ValueError("exec needs a command")
        shell_line: Optional[str] = None
        if shell:
            if len(argv) != 1:
                raise ValueError("with shell=True, give one command line")
            shell_line = argv[0]
        if background:
            return self.processes.start(
                shell_line if shell_line is not None else argv, env=env, workdir=workdir, timeout=timeout,
                stdin=stdin, user=user, pty=pty, tag=tag, encoding=encoding,
            )
        assert not isinstance(stdin, bool)
        req = self._exec_request(None if shell else argv, shell_line, env, workdir, timeout, stdin, user)
        stream = self._client._transport.server_stream(_SERVICE, "Exec", req, op="exec")
        return Process(stream, argv, encoding=encoding)

    def run(
        self,
        cmd: Union[str, Sequence[str]],
        *,
        timeout: Optional[Seconds] = None,
        raise_on_error: bool = False,
        env: Optional[Mapping[str, str]] = None,
        workdir: Optional[str] = None,
        stdin: Union[bytes, str, None] = None,
        user: Optional[str] = None,
    ) -> CommandResult:
        """Run a command to completion and collect its output.

        ``cmd`` is a shell command line (``str``, run with ``/bin/sh -c``) or an
        argv list. A non-zero exit is not an error unless ``raise_on_error``.

        Returns:
            a :class:`~sbx.CommandResult` with ``stdout``, ``stderr``,
            ``exit_code`` and ``timed_out``.

        Raises:
            CommandError: with ``raise_on_error``, the command exited non-zero,
                timed out or could not start.
        """
        if isinstance(cmd, str):
            proc = self.exec(cmd, shell=True, env=env, workdir=workdir, timeout=timeout, stdin=stdin, user=user)
            shown = cmd
        else:
            argv = [str(a) for a in cmd]
            proc = self.exec(*argv, env=env, workdir=workdir, timeout=timeout, stdin=stdin, user=user)
            shown = shlex.join(argv)
        with proc:
            result = proc.result()
        if raise_on_error and not result.ok:
            raise CommandError(result, shown)
        return result

    # -- code --------------------------------------------------------------

    def run_code(
        self,
        code: Optional[str] = None,
        language: Optional[str] = None,
        *,
        libraries: Sequence[str] = (),
        timeout: Optional[Seconds] = None,
        context: Optional["_code.CodeContext"] = None,
        env: Optional[Mapping[str, str]] = None,
        policy: Optional[Sequence[str]] = None,
        policy_rules: Optional[Sequence[Mapping[str, Any]]] = None,
        enforce: bool = False,
        threshold: Optional[str] = None,
        index_url: Optional[str] = None,
        find_links: Sequence[str] = (),
        on_stdout: Optional[Callable[[str], None]] = None,
        on_stderr: Optional[Callable[[str], None]] = None,
    ) -> "_code.CodeResult":
        """Run a program (python, javascript, typescript, bash, go, java,
        cpp, ruby, r) and return a :class:`~sbx.CodeResult` with its output,
        exit code and artifacts (matplotlib/seaborn figures as PNG, plotly
        figures shown as HTML plus ``application/vnd.plotly.v1+json``, and
        files written under ``$SBX_OUTPUT_DIR``).

        Args:
            libraries: installed first with the language's installer (pip, npm...).
            context: run in this :class:`~sbx.CodeContext` instead (keeps state).
            policy: policy presets to check the code against ("default",
                "no-network", "no-subprocess", "no-filesystem"); findings are
                in ``result.findings``.
            enforce: refuse code with findings at or above ``threshold``
                (default "high") with :class:`~sbx.PermissionDeniedError`.
            index_url, find_links: where installers look (``find_links`` are
                directories in the sandbox, for pip ``--no-index``).
            on_stdout, on_stderr: called with output as it arrives.

        Code comes first and Python is the default (``run_code("print(1)")``);
        the older ``run_code("python", code)`` order is still accepted: two
        positional arguments whose first is a language name and whose second
        is not are read as (language, code). ``result.plots`` holds the image
        artifacts as base64 + format (llm-sandbox's shape).

        Raises:
            FailedPreconditionError: the image lacks the language's toolchain.
            PermissionDeniedError: an enforcing policy refused the code.
        """
        code, language = _code.code_and_language(code, language)
        req: Dict[str, Any] = {"sandbox": self.id, "language": language, "code": code}
        if context is not None:
            req["context"] = context.id
        if libraries:
            req["libraries"] = list(libraries)
        if timeout is not None:
            req["timeoutMs"] = _ms(timeout, "timeout")
        if env:
            req["env"] = dict(env)
        pol = _code.policy_request(policy, enforce, threshold, policy_rules)
        if pol:
            req["policy"] = pol
        if index_url or find_links:
            req["librarySource"] = {"indexUrl": index_url or "", "findLinks": list(find_links)}
        return _code.run(self._client, req, on_stdout, on_stderr)

    def create_context(
        self, language: str = "python", *, cwd: Optional[str] = None, env: Optional[Mapping[str, str]] = None
    ) -> "_code.CodeContext":
        """Start a stateful context (python or javascript): variables, imports
        and the working directory survive between runs, like a notebook kernel."""
        req: Dict[str, Any] = {"sandbox": self.id, "language": language}
        if cwd:
            req["cwd"] = cwd
        if env:
            req["env"] = dict(env)
        resp = self._client._transport.unary(_code.SERVICE, "CreateContext", req, op="create context")
        return _code.CodeContext(self._client, resp.get("context", {}))

    def list_contexts(self) -> List["_code.CodeContext"]:
        """The sandbox's live contexts."""
        resp = self._client._transport.unary(_code.SERVICE, "ListContexts", {"sandbox": self.id}, op="list contexts")
        return [_code.CodeContext(self._client, c) for c in resp.get("contexts", [])]

    def session(
        self, *, shell: str = "/bin/bash", env: Optional[Mapping[str, str]] = None, workdir: Optional[str] = None
    ) -> "_session.Session":
        """Start a stateful shell session: cwd, exported variables, activated
        venvs and background jobs persist between ``session.exec`` calls."""
        req: Dict[str, Any] = {"sandbox": self.id, "shell": shell}
        if env:
            req["env"] = dict(env)
        if workdir:
            req["workdir"] = workdir
        resp = self._client._transport.unary(_session.SERVICE, "CreateSession", req, op="create session")
        return _session.Session(self._client, resp.get("session", {}))

    @property
    def processes(self) -> "_processes.Processes":
        """The sandbox's background processes: ``start``, ``list``, ``connect(pid)``."""
        return _processes.Processes(self)

    def list_sessions(self) -> List["_session.Session"]:
        """The sandbox's live shell sessions."""
        return _session.list_sessions(self._client, self.id)

    # -- files ---------------------------------------------------------------

    def open(
        self,
        path: str,
        mode: str = "r",
        *,
        encoding: Optional[str] = None,
        errors: Optional[str] = None,
        newline: Optional[str] = None,
        perm: int = 0o644,
    ) -> Union[SandboxFile, io.TextIOWrapper]:
        """Open a file of the sandbox as a Python file object (Modal's
        ``Sandbox.open``): modes ``r``, ``w``, ``a``, ``x``, with ``+`` and
        ``b`` as for :func:`open`; text is UTF-8 unless ``encoding``. The file
        is copied in at open and written back whole at ``flush``/``close``
        (appends only send the new bytes)::

            with sb.open("/tmp/data.txt", "w") as f:
                f.write("hello\n")
            with sb.open("/tmp/data.txt") as f:
                assert f.read() == "hello\n"

        Raises:
            NotFoundError: mode ``r`` and no such file.
            FileExistsError: mode ``x`` and the file exists.
        """
        return open_file(self.files, path, mode, encoding=encoding, errors=errors, newline=newline, perm=perm)

    # -- ports -----------------------------------------------------------

    def get_port(self, port: int) -> Port:
        """The addresses of a TCP port of the sandbox on the daemon's proxy
        (whether or not anything listens there yet)."""
        resp = self._client._transport.unary(
            _ports.SERVICE, "GetPort", {"sandbox": self.id, "port": port}, op=f"get port {port} of {self.id}"
        )
        return Port.from_json(resp.get("port") or {})

    def get_host(self, port: int) -> str:
        """The URL at which the daemon proxies ``port`` of the sandbox (HTTP
        and WebSocket), like E2B's ``get_host``: the host-name URL when the
        daemon has a proxy domain, else the path-routed one. Send the
        daemon's token with requests to it (see :class:`Port`)."""
        p = self.get_port(port)
        return p.host_url or p.url

    def ports(self) -> List[Port]:
        """The TCP ports listening inside the (running) sandbox."""
        resp = self._client._transport.unary(_ports.SERVICE, "ListPorts", {"sandbox": self.id}, op=f"list ports of {self.id}")
        return [Port.from_json(p) for p in resp.get("ports") or []]

    def __repr__(self) -> str:
        name = f" name={self.name!r}" if self.name else ""
        return f"<sbx.Sandbox {self.id}{name} {self.state}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sandbox) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

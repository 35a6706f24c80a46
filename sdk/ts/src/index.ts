/**
 * sbx: the TypeScript SDK of sbx, a self-hosted sandbox platform.
 *
 *     import { Sandbox } from "@sbxdev/sbx";
 *     const sb = await Sandbox.create({ timeout: 600 });
 *     const r = await sb.run("echo hello");
 *     await sb.terminate();
 *
 * It talks to the daemon ($SBX_ADDR, token $SBX_TOKEN) with Connect over
 * HTTP/2, through clients generated from api/proto (exported as `rpc` on
 * Client for what this surface does not wrap).
 */
export { Client, DEFAULT_ADDR, getDefaultClient, type ClientOptions } from "./client.js";
export { Sandbox, type CreateOptions, type ExecOptions, type LogChunk, type PathPolicy, type PermissionName, type PermissionRule, type Port, type SandboxInfo, type SandboxStats } from "./sandbox.js";
export { Process, type CommandResult, type ExitStatus, type OutputHandlers } from "./process.js";
export { Files, type FileInfo, type WatchEvent } from "./files.js";
export { CodeContext, type Artifact, type CodeResult, type RunCodeOptions } from "./code.js";
export { Session, type SessionResult } from "./session.js";
export { Volumes, type Volume } from "./volumes.js";
export { Codebases, type Codebase, type SyncResult } from "./codebases.js";
export { compileIgnore, DEFAULT_MAX_FILE_BYTES, walkCodebase, type LocalEntry, type SkippedFile, type WalkOptions } from "./localtree.js";
export { parseMode, SandboxFile, type OpenMode } from "./fileobj.js";
export { Images, MAX_CONTEXT_BYTES, type BuildOptions, type ImageInfo, type ImageProgress } from "./images.js";
export { Recipe } from "./recipe.js";
export { BackgroundProcess, Processes, signalNumber, type ProcessOutput, type StartProcessOptions } from "./processes.js";
export { EVENT_TYPES, type EventsOptions, type EventTypeName, type SandboxUsage, type SbxEvent, type UsageSample } from "./observe.js";
export { Tenants, type Tenant, type TenantQuotas, type TenantUsage } from "./tenants.js";
export { DockerIgnore, IgnoreFileError, MAX_IGNORE_FILE_BYTES, packDir, readIgnoreFile, ReplacedFileError, safeExtract, UnsafeArchiveError } from "./tar.js";
export { parseSize } from "./size.js";
export {
  AlreadyExistsError,
  FailedPreconditionError,
  InvalidArgumentError,
  NotFoundError,
  PermissionDeniedError,
  ResourceExhaustedError,
  SbxError,
  UnauthenticatedError,
} from "./errors.js";

import { Code, ConnectError } from "@connectrpc/connect";

/** An error from the daemon (or from reaching it). `code` is the Connect
 * code in snake case ("not_found", "invalid_argument", ...). */
export class SbxError extends Error {
  readonly code: string;
  constructor(code: string, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "SbxError";
    this.code = code;
  }
}

/** The sandbox, file, image, ... does not exist (or is not the caller's). */
export class NotFoundError extends SbxError {
  override readonly name = "NotFoundError";
}
/** The request was malformed; the message names what was wrong. */
export class InvalidArgumentError extends SbxError {
  override readonly name = "InvalidArgumentError";
}
/** Something of that name already exists. */
export class AlreadyExistsError extends SbxError {
  override readonly name = "AlreadyExistsError";
}
/** The call needs a state it is not in (e.g. a stopped sandbox). */
export class FailedPreconditionError extends SbxError {
  override readonly name = "FailedPreconditionError";
}
/** No token, or a wrong one. */
export class UnauthenticatedError extends SbxError {
  override readonly name = "UnauthenticatedError";
}
/** The token may not do this. */
export class PermissionDeniedError extends SbxError {
  override readonly name = "PermissionDeniedError";
}
/** A quota or limit was reached. */
export class ResourceExhaustedError extends SbxError {
  override readonly name = "ResourceExhaustedError";
}

function snake(code: Code): string {
  return (Code[code] ?? "unknown").replace(/([a-z])([A-Z])/g, "$1_$2").toLowerCase();
}

/** toSbxError turns what a call threw into an SbxError naming `op`. */
export function toSbxError(op: string, err: unknown): SbxError {
  if (err instanceof SbxError) {
    return err;
  }
  const ce = ConnectError.from(err);
  const code = snake(ce.code);
  const msg = `${op}: ${ce.rawMessage}`;
  switch (ce.code) {
    case Code.NotFound:
      return new NotFoundError(code, msg, { cause: err });
    case Code.InvalidArgument:
      return new InvalidArgumentError(code, msg, { cause: err });
    case Code.AlreadyExists:
      return new AlreadyExistsError(code, msg, { cause: err });
    case Code.FailedPrecondition:
      return new FailedPreconditionError(code, msg, { cause: err });
    case Code.Unauthenticated:
      return new UnauthenticatedError(code, msg, { cause: err });
    case Code.PermissionDenied:
      return new PermissionDeniedError(code, msg, { cause: err });
    case Code.ResourceExhausted:
      return new ResourceExhaustedError(code, msg, { cause: err });
    default:
      return new SbxError(code, msg, { cause: err });
  }
}

/** call runs fn and converts what it throws with toSbxError, except a
 * RangeError: a bad argument found before any call, which names itself. */
export async function call<T>(op: string, fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (err) {
    if (err instanceof RangeError) {
      throw err;
    }
    throw toSbxError(op, err);
  }
}

// Tar archives of local directories: packed for uploads and builds,
// extracted safely from what a sandbox sent (its contents are hostile).
import { closeSync, constants, fstatSync, linkSync, lstatSync, mkdirSync, openSync, readdirSync, readFileSync, readlinkSync, readSync, realpathSync, symlinkSync, unlinkSync, writeSync } from "node:fs";
import type { BigIntStats } from "node:fs";
import { dirname, join, posix, resolve } from "node:path";

import { concat } from "./process.js";

/** A tar entry would escape the destination or is of a forbidden kind. */
export class UnsafeArchiveError extends Error {
  override readonly name = "UnsafeArchiveError";
}

/** A file of a directory being packed is no longer the one the walk saw:
 * it, or a directory above it, became a symlink or another file. */
export class ReplacedFileError extends Error {
  override readonly name = "ReplacedFileError";
}

const BLOCK = 512;
/** Regular file ("0", "7": contiguous), hard link, symlink, directory. */
const ENTRY_TYPES = new Set(["0", "7", "1", "2", "5"]);
const enc = new TextEncoder();
const dec = new TextDecoder();

function octal(buf: Uint8Array, off: number, len: number, v: number): void {
  buf.set(enc.encode(v.toString(8).padStart(len - 1, "0") + "\0"), off);
}

/** The largest size the 11 octal digits of a ustar header hold (8 GiB - 1):
 * bigger files carry a pax size record. */
const USTAR_MAX_SIZE = 0o77777777777;

export function header(name: string, type: string, size: number, mode: number, mtime: number, link = ""): Uint8Array[] {
  const out: Uint8Array[] = [];
  const pax: string[] = [];
  if (size > USTAR_MAX_SIZE) {
    pax.push(record("size", String(size)));
  }
  if (enc.encode(name).length > 100) {
    pax.push(record("path", name));
    name = name.slice(0, 99);
  }
  if (enc.encode(link).length > 100) {
    pax.push(record("linkpath", link));
    link = link.slice(0, 99);
  }
  if (pax.length > 0) {
    const body = enc.encode(pax.join(""));
    out.push(rawHeader("PaxHeader", "x", body.length, 0o644, mtime, ""), pad(body));
  }
  out.push(rawHeader(name, type, size, mode, mtime, link));
  return out;
}

function record(key: string, value: string): string {
  const rest = ` ${key}=${value}\n`;
  const rl = enc.encode(rest).length;
  let n = rl + String(rl).length;
  if (String(n).length !== String(rl).length) {
    n = rl + String(n).length;
  }
  return `${n}${rest}`;
}

function rawHeader(name: string, type: string, size: number, mode: number, mtime: number, link: string): Uint8Array {
  const h = new Uint8Array(BLOCK);
  h.set(enc.encode(name).subarray(0, 100), 0);
  octal(h, 100, 8, mode & 0o7777);
  octal(h, 108, 8, 0);
  octal(h, 116, 8, 0);
  octal(h, 124, 12, Math.min(size, USTAR_MAX_SIZE));
  octal(h, 136, 12, Math.floor(mtime));
  h.fill(0x20, 148, 156);
  h[156] = type.charCodeAt(0);
  h.set(enc.encode(link).subarray(0, 100), 157);
  h.set(enc.encode("ustar\x0000"), 257);
  const sum = h.reduce((a, b) => a + b, 0);
  h.set(enc.encode(sum.toString(8).padStart(6, "0") + "\0 "), 148);
  return h;
}

function pad(data: Uint8Array): Uint8Array {
  const n = Math.ceil(data.length / BLOCK) * BLOCK;
  if (n === data.length) {
    return data;
  }
  const out = new Uint8Array(n);
  out.set(data);
  return out;
}

/**
 * packDir returns a tar of the contents of dir (entries named relative to
 * it), in name order. Symlinks are archived as links, never followed (a
 * file swapped for one while packing is refused: readWalked);
 * sockets, devices and FIFOs are left out, and so is what ignore
 * excludes. maxBytes bounds the archive (an Error names the entry past it).
 */
export function packDir(dir: string, ignore?: { excluded(rel: string): boolean; negations?: boolean }, maxBytes = Infinity): Uint8Array {
  const parts: Uint8Array[] = [];
  let size = 0;
  const add = (rel: string, ...bufs: Uint8Array[]) => {
    for (const b of bufs) {
      size += b.length;
      parts.push(b);
    }
    if (size + 2 * BLOCK > maxBytes) {
      throw new RangeError(`packing ${dir}: more than ${maxBytes} bytes (at ${rel}): list what is not needed in .dockerignore`);
    }
  };
  const rootReal = realpathSync(dir);
  const walk = (rel: string, seen?: BigIntStats) => {
    const names = readdirSync(join(dir, rel)).sort();
    if (seen) {
      // Listed by path: the directory must still be the one the parent's
      // listing saw, or the names may be those of what a symlink swapped
      // in for it leads to.
      const now = lstatSync(join(dir, rel), { bigint: true });
      if (!now.isDirectory() || now.dev !== seen.dev || now.ino !== seen.ino) {
        throw new ReplacedFileError(`${rel}: replaced during the walk; not listed`);
      }
    }
    for (const name of names) {
      const r = rel ? `${rel}/${name}` : name;
      const p = join(dir, r);
      const st = lstatSync(p, { bigint: true });
      const mtime = Number(st.mtimeMs) / 1000;
      const excluded = ignore?.excluded(r) ?? false;
      if (st.isDirectory()) {
        if (!excluded) {
          add(r, ...header(`${r}/`, "5", 0, Number(st.mode), mtime));
        }
        if (!excluded || ignore?.negations) {
          walk(r, st);
        }
      } else if (excluded) {
        continue;
      } else if (st.isSymbolicLink()) {
        add(r, ...header(r, "2", 0, 0o777, mtime, readlinkSync(p)));
      } else if (st.isFile()) {
        const data = readWalked(rootReal, p, r, st);
        add(r, ...header(r, "0", data.length, Number(st.mode), mtime), pad(new Uint8Array(data.buffer, data.byteOffset, data.length)));
      }
    }
  };
  walk("");
  parts.push(new Uint8Array(2 * BLOCK));
  return concat(parts);
}

/**
 * openWalked opens the regular file at p (rel inside the directory whose
 * real path is rootReal) for reading, only if it is the very file the walk
 * saw (st: its lstat), and returns the descriptor. A directory packed for
 * upload may be reshaped by someone else (a cloned repository's scripts, a
 * tree a sandbox shares) while it is read: a file swapped for a symlink
 * since the walk is refused by O_NOFOLLOW and the device and inode check
 * (O_NONBLOCK: a FIFO swapped in does not block the open), and where /proc
 * tells where the opened file really is (Linux), a file reached through a
 * directory swapped for a symlink is refused unless it lies under rootReal.
 */
export function openWalked(rootReal: string, p: string, rel: string, st: BigIntStats): number {
  let fd: number;
  try {
    fd = openSync(p, constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK);
  } catch (e) {
    throw new ReplacedFileError(`${rel}: replaced during the walk (${(e as NodeJS.ErrnoException).code ?? e}); not read`);
  }
  try {
    const now = fstatSync(fd, { bigint: true });
    if (!now.isFile() || now.dev !== st.dev || now.ino !== st.ino) {
      throw new ReplacedFileError(`${rel}: replaced by another file during the walk; not read`);
    }
    let real: string | undefined;
    try {
      real = readlinkSync(`/proc/self/fd/${fd}`);
    } catch {
      // no /proc (macOS): the checks above only
    }
    if (real !== undefined && !real.startsWith(rootReal.endsWith("/") ? rootReal : `${rootReal}/`)) {
      throw new ReplacedFileError(`${rel}: is ${real}, outside ${rootReal} (a directory above it was swapped for a symlink); not read`);
    }
    return fd;
  } catch (e) {
    closeSync(fd);
    throw e;
  }
}

/** readWalked reads the file openWalked opens, whole. */
function readWalked(rootReal: string, p: string, rel: string, st: BigIntStats): Buffer {
  const fd = openWalked(rootReal, p, rel, st);
  try {
    const data = readFileSync(fd);
    if (BigInt(data.length) !== st.size) {
      throw new ReplacedFileError(`${rel}: changed size while being packed`);
    }
    return data;
  } finally {
    closeSync(fd);
  }
}

/** The most bytes an ignore file (.gitignore, .sandboxignore, .dockerignore) may hold. */
export const MAX_IGNORE_FILE_BYTES = 1 << 20;

/** An ignore file of a directory being packed is not one the SDK reads:
 * not a regular file (a symlink, a FIFO, a device), or too large. */
export class IgnoreFileError extends Error {
  override readonly name = "IgnoreFileError";
}

/**
 * readIgnoreFile returns the text of the ignore file rel (inside the
 * directory whose real path is rootReal), or undefined when there is none.
 * The walker opens it for its own reasons, and the tree may be hostile (a
 * cloned repository's ".gitignore -> /etc/shadow", "-> /dev/zero", a FIFO):
 * it must be a regular file of the tree, not a symlink (git reads its
 * ignore files with O_NOFOLLOW too), at most MAX_IGNORE_FILE_BYTES, and is
 * opened as openWalked opens files (never following a symlink, never
 * blocking, never outside rootReal). Anything else throws IgnoreFileError:
 * quietly dropping its rules could upload what they were meant to keep out.
 */
export function readIgnoreFile(rootReal: string, rel: string): string | undefined {
  const p = join(rootReal, rel);
  let st: BigIntStats;
  try {
    st = lstatSync(p, { bigint: true });
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    if (code === "ENOENT" || code === "ENOTDIR") {
      return undefined;
    }
    throw e;
  }
  if (!st.isFile()) {
    const kind = st.isSymbolicLink() ? "a symlink" : st.isDirectory() ? "a directory" : st.isFIFO() ? "a FIFO" : "a special file";
    throw new IgnoreFileError(`read ${rel}: is ${kind}; ignore files are read only when they are regular files (replace it with a copy, or turn ignore files off)`);
  }
  if (st.size > BigInt(MAX_IGNORE_FILE_BYTES)) {
    throw new IgnoreFileError(`read ${rel}: ${st.size} bytes, more than the ${MAX_IGNORE_FILE_BYTES} an ignore file may hold`);
  }
  const fd = openWalked(rootReal, p, rel, st);
  try {
    const buf = Buffer.alloc(MAX_IGNORE_FILE_BYTES + 1);
    let n = 0;
    for (let r; n < buf.length && (r = readSync(fd, buf, n, buf.length - n, null)) > 0;) {
      n += r;
    }
    if (n > MAX_IGNORE_FILE_BYTES) {
      throw new IgnoreFileError(`read ${rel}: grew past the ${MAX_IGNORE_FILE_BYTES} bytes an ignore file may hold`);
    }
    return buf.subarray(0, n).toString("utf8");
  } finally {
    closeSync(fd);
  }
}

function patternRegexp(p: string): string {
  let out = "";
  for (let i = 0; i < p.length; i++) {
    const c = p[i];
    if (p.startsWith("**/", i)) {
      out += "(.*/)?";
      i += 2;
    } else if (p.startsWith("**", i)) {
      out += ".*";
      i += 1;
    } else if (c === "*") {
      out += "[^/]*";
    } else if (c === "?") {
      out += "[^/]";
    } else if (c === "[" && p.indexOf("]", i + 1) > 0) {
      const j = p.indexOf("]", i + 1);
      const cls = p.slice(i + 1, j);
      out += "[" + (cls.startsWith("!") ? "^" + cls.slice(1) : cls) + "]";
      i = j;
    } else if (c === "\\" && i + 1 < p.length) {
      i++;
      out += p[i].replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
    } else {
      out += c.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
    }
  }
  return out;
}

/**
 * The rules of a .dockerignore (docker's: patterns relative to the context
 * root, * and ? do not cross /, ** spans directories, ! re-includes, the
 * last matching rule wins, a rule matching a directory matches everything
 * in it), as the Go and Python SDKs read them.
 */
export class DockerIgnore {
  readonly rules: { rx: RegExp; negate: boolean }[] = [];
  negations = false;

  constructor(text = "") {
    text.split(/\r?\n/).forEach((raw, n) => {
      let line = raw.trim();
      if (!line || line.startsWith("#")) {
        return;
      }
      const negate = line.startsWith("!");
      if (negate) {
        this.negations = true;
        line = line.slice(1).trim();
      }
      const p = posix.normalize(line.replace(/^\/+/, ""));
      try {
        this.rules.push({ rx: new RegExp("^" + patternRegexp(p) + "$"), negate });
      } catch (e) {
        throw new SyntaxError(`.dockerignore line ${n + 1}: ${JSON.stringify(line)}: ${(e as Error).message}`);
      }
    });
  }

  /** Whether the context path (slash-separated) is left out. */
  excluded(path: string): boolean {
    let out = false;
    for (const { rx, negate } of this.rules) {
      for (let q = path; q !== "" && q !== "."; q = posix.dirname(q)) {
        if (rx.test(q)) {
          out = !negate;
          break;
        }
      }
    }
    return out;
  }
}

function field(h: Uint8Array, off: number, len: number): string {
  const s = h.subarray(off, off + len);
  const end = s.indexOf(0);
  return dec.decode(end < 0 ? s : s.subarray(0, end));
}

function num(h: Uint8Array, off: number, len: number): number {
  if (h[off] & 0x80) {
    // base-256 (GNU): big sizes
    let v = 0;
    for (let i = off + 1; i < off + len; i++) {
      v = v * 256 + h[i];
    }
    return v;
  }
  const s = field(h, off, len).trim();
  return s ? parseInt(s, 8) : 0;
}

function paxRecords(data: Uint8Array): Record<string, string> {
  const out: Record<string, string> = {};
  let off = 0;
  while (off < data.length) {
    const sp = data.indexOf(0x20, off);
    if (sp < 0) {
      break;
    }
    const n = parseInt(dec.decode(data.subarray(off, sp)), 10);
    if (!(n > 0)) {
      throw new UnsafeArchiveError("malformed pax header");
    }
    const rec = dec.decode(data.subarray(sp + 1, off + n - 1));
    const eq = rec.indexOf("=");
    if (eq > 0) {
      out[rec.slice(0, eq)] = rec.slice(eq + 1);
    }
    off += n;
  }
  return out;
}

/** Whether rel (clean, relative) has a symlink among its existing parents under dest. */
function belowSymlink(dest: string, rel: string): boolean {
  const parts = rel.split("/");
  let p = dest;
  for (const part of parts.slice(0, -1)) {
    p = join(p, part);
    try {
      if (lstatSync(p).isSymbolicLink()) {
        return true;
      }
    } catch {
      return false; // does not exist yet: created as a directory
    }
  }
  return false;
}

/**
 * linkInside reports whether a symlink at rel pointing to target stays
 * inside the tree whatever the tree's other links are: relative, and its
 * ".." only leading (they climb through the link's own parent directories,
 * which are never links). A ".." after a name could climb out of a link
 * made later ("l -> s/x/.." with "s/x -> ..": lexically "s", really the
 * destination's parent).
 */
export function linkInside(rel: string, target: string): boolean {
  if (!target || target.startsWith("/")) {
    return false;
  }
  const parts = target.split("/").filter((p) => p !== "" && p !== ".");
  const firstName = parts.findIndex((p) => p !== "..");
  if (firstName >= 0 && parts.slice(firstName).includes("..")) {
    return false;
  }
  const resolved = posix.normalize(posix.join(posix.dirname(rel), target));
  return resolved !== ".." && !resolved.startsWith("../");
}

function clean(name: string): string {
  if (!name || name.startsWith("/") || /^[A-Za-z]:/.test(name)) {
    throw new UnsafeArchiveError(`${JSON.stringify(name)}: absolute path`);
  }
  const parts = name.replace(/\\/g, "/").split("/").filter((p) => p !== "" && p !== ".");
  if (parts.includes("..")) {
    throw new UnsafeArchiveError(`${JSON.stringify(name)}: contains '..'`);
  }
  return parts.join("/");
}

/**
 * safeExtract writes the entries of tar into dest (created if missing) and
 * returns how many it extracted. Entries with absolute paths or "..",
 * device nodes and FIFOs, entries below a symlink and hard links leaving
 * dest throw UnsafeArchiveError; symlinks whose target leaves dest (read
 * alone, or resolved once every entry is in: dropEscapingLinks) are not
 * kept and their names are pushed on skipped. Files get the owner's
 * uid, no setuid/setgid/sticky bits and no group/other write.
 */
export function safeExtract(tar: Uint8Array, dest: string, skipped: string[] = []): number {
  mkdirSync(dest, { recursive: true });
  const made = new Map<string, string>(); // symlinks created, to their targets
  let off = 0;
  let count = 0;
  let pax: Record<string, string> = {};
  let longName: string | undefined;
  let longLink: string | undefined;
  while (off + BLOCK <= tar.length) {
    const h = tar.subarray(off, off + BLOCK);
    off += BLOCK;
    if (h.every((b) => b === 0)) {
      break;
    }
    const type = String.fromCharCode(h[156] || 0x30);
    const size = pax.size !== undefined ? Number(pax.size) : num(h, 124, 12);
    const data = tar.subarray(off, off + size);
    if (data.length < size) {
      throw new UnsafeArchiveError("the archive ends inside an entry");
    }
    off += Math.ceil(size / BLOCK) * BLOCK;
    if (type === "x") {
      pax = paxRecords(data);
      continue;
    }
    if (type === "g") {
      continue;
    }
    if (type === "L" || type === "K") {
      const v = dec.decode(data).replace(/\0+$/, "");
      if (type === "L") {
        longName = v;
      } else {
        longLink = v;
      }
      continue;
    }
    const prefix = field(h, 345, 155);
    const rawName = pax.path ?? longName ?? (prefix ? `${prefix}/${field(h, 0, 100)}` : field(h, 0, 100));
    const link = pax.linkpath ?? longLink ?? field(h, 157, 100);
    const mode = num(h, 100, 8);
    pax = {};
    longName = longLink = undefined;

    const rel = clean(rawName);
    if (rel === "") {
      continue; // the archive's root itself
    }
    if (!ENTRY_TYPES.has(type)) {
      throw new UnsafeArchiveError(`${JSON.stringify(rawName)}: device nodes, FIFOs and other special files are not allowed`);
    }
    if (belowSymlink(dest, rel)) {
      throw new UnsafeArchiveError(`${JSON.stringify(rawName)}: below a symlink`);
    }
    const target = join(dest, rel);
    mkdirSync(join(target, ".."), { recursive: true });
    if (type === "5") {
      try {
        if (!lstatSync(target).isDirectory()) {
          unlinkSync(target);
          mkdirSync(target, { mode: (mode & 0o755) | 0o700 });
        }
      } catch {
        mkdirSync(target, { mode: (mode & 0o755) | 0o700 });
      }
      count++;
      continue;
    }
    const removeOld = () => {
      try {
        if (lstatSync(target).isDirectory()) {
          throw new UnsafeArchiveError(`${JSON.stringify(rawName)}: a directory of that name exists`);
        }
        unlinkSync(target);
      } catch (e) {
        if (e instanceof UnsafeArchiveError) {
          throw e;
        }
      }
    };
    if (type === "2") {
      if (!linkInside(rel, link)) {
        skipped.push(rel);
        continue;
      }
      removeOld();
      symlinkSync(link, target);
      made.set(rel, link);
    } else if (type === "1") {
      const lrel = clean(link);
      if (belowSymlink(dest, `${lrel}/x`)) {
        throw new UnsafeArchiveError(`${JSON.stringify(rawName)}: hard link target ${JSON.stringify(link)} leaves the destination`);
      }
      removeOld();
      linkSync(join(dest, lrel), target);
    } else {
      removeOld();
      // O_EXCL: never follows a symlink put there meanwhile.
      const fd = openSync(target, constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW, (mode & 0o755) | 0o600);
      try {
        for (let w = 0; w < data.length;) {
          w += writeSync(fd, data, w, data.length - w);
        }
      } finally {
        closeSync(fd);
      }
    }
    count++;
  }
  return count - dropEscapingLinks(dest, made, skipped);
}

/**
 * dropEscapingLinks resolves, once the whole archive is extracted, every
 * symlink it made and removes (pushing its name on skipped) each one whose
 * real path leaves dest, returning how many: linkInside reads one target
 * alone, so a link through a link dest already held (the user's
 * "p -> /home/u" makes "l -> p/.ssh" lead there) passes it. A dangling link
 * stays if what exists of its path is inside dest.
 */
/** existingPrefix is the real path of the longest existing prefix of p. */
function existingPrefix(p: string): string {
  for (let q = p; ; q = dirname(q)) {
    try {
      return realpathSync(q);
    } catch {
      if (q === dirname(q)) {
        return "";
      }
    }
  }
}

function dropEscapingLinks(dest: string, made: Map<string, string>, skipped: string[]): number {
  const root = realpathSync(dest);
  const under = root.endsWith("/") ? root : `${root}/`;
  let dropped = 0;
  for (const rel of [...made.keys()].sort()) {
    const p = join(dest, rel);
    let real: string;
    try {
      if (!lstatSync(p).isSymbolicLink()) {
        continue; // replaced by a later entry
      }
      real = realpathSync(p);
    } catch (e) {
      const code = (e as NodeJS.ErrnoException).code;
      if (code !== "ENOENT" && code !== "ENOTDIR") {
        real = ""; // a loop: refused as well
      } else {
        // Dangling: where its existing part leads (linkInside has refused
        // a ".." after a name, so the rest only descends).
        real = existingPrefix(resolve(dirname(p), made.get(rel) ?? ""));
      }
    }
    if (real !== root && !real.startsWith(under)) {
      unlinkSync(p);
      skipped.push(rel);
      dropped++;
    }
  }
  return dropped;
}

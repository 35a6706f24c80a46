// Codebases from a local directory: the walk that picks the files (the
// gitignore(5) rules, semantics and test vectors of the Go and Python SDKs:
// sdk/testdata/codebase_ignore.json) and the tar it sends. Ignore rules are
// applied here, on the client, so ignored files never leave this machine.
import { closeSync, lstatSync, readdirSync, readlinkSync, readSync, realpathSync, statSync } from "node:fs";
import type { BigIntStats } from "node:fs";
import { join } from "node:path";

import { header, openWalked, readIgnoreFile, ReplacedFileError } from "./tar.js";

/** Files larger than this are skipped unless told otherwise (10 MiB). */
export const DEFAULT_MAX_FILE_BYTES = 10 << 20;

/** A file an upload left out, and why. */
export interface SkippedFile {
  path: string;
  sizeBytes: number;
  reason: string;
}

/** Options of walkCodebase and codebases.fromLocal. */
export interface WalkOptions {
  /** Extra gitignore-style patterns, anchored at the directory and winning
   * over .gitignore and .sandboxignore files. */
  ignore?: string[];
  /** Larger files are skipped and reported (default 10 MiB; 0 or null: no limit). */
  maxFileBytes?: number | null;
  /** Upload .git (default true, so that git works in the sandbox). */
  includeGit?: boolean;
  /** Read .gitignore and .sandboxignore files (default true). */
  useIgnoreFiles?: boolean;
}

/** One entry walkCodebase selected: rel is slash-separated, relative to
 * the directory; st is its lstat. */
export interface LocalEntry {
  rel: string;
  st: BigIntStats;
}

interface Rule {
  base: string;
  rx: RegExp;
  negate: boolean;
  dirOnly: boolean;
}

const escapeRx = (c: string) => c.replace(/[.*+?^${}()|[\]\\/-]/g, "\\$&");

/** compileIgnore compiles one gitignore line (undefined for blanks and comments). */
export function compileIgnore(line: string, base: string): Rule | undefined {
  line = line.replace(/\r$/, "");
  while (line.endsWith(" ") && !line.endsWith("\\ ")) {
    line = line.slice(0, -1);
  }
  if (!line || line.startsWith("#")) {
    return undefined;
  }
  let negate = false;
  if (line.startsWith("!")) {
    negate = true;
    line = line.slice(1);
  } else if (line.startsWith("\\!") || line.startsWith("\\#")) {
    line = line.slice(1);
  }
  const dirOnly = line.endsWith("/");
  line = line.replace(/\/+$/, "");
  if (!line) {
    return undefined;
  }
  const anchored = line.includes("/");
  if (line.startsWith("/")) {
    line = line.slice(1);
  }
  let out = "^";
  if (!anchored) {
    out += "(?:.*/)?";
  }
  const n = line.length;
  for (let i = 0; i < n; i++) {
    const c = line[i];
    if (c === "*") {
      if (i + 1 < n && line[i + 1] === "*" && (i === 0 || line[i - 1] === "/")) {
        if (i + 2 === n) {
          out += ".*"; // trailing "**": everything
          i += 1;
          continue;
        }
        if (line[i + 2] === "/") {
          out += "(?:.*/)?"; // "**/": zero or more directories
          i += 2;
          continue;
        }
      }
      while (i + 1 < n && line[i + 1] === "*") {
        i++;
      }
      out += "[^/]*";
    } else if (c === "?") {
      out += "[^/]";
    } else if (c === "[") {
      let j = i + 1;
      if (j < n && (line[j] === "!" || line[j] === "^")) {
        j++;
      }
      if (j < n && line[j] === "]") {
        j++;
      }
      while (j < n && line[j] !== "]") {
        j++;
      }
      if (j >= n) {
        out += "\\["; // no closing bracket: a literal "["
        continue;
      }
      let cls = line.slice(i + 1, j);
      if (cls.startsWith("!") || cls.startsWith("^")) {
        cls = "^" + cls.slice(1);
      }
      cls = cls.replace(/\\/g, "\\\\").replace(/\[/g, "\\[");
      out += `[${cls}]`;
      i = j;
    } else if (c === "\\") {
      if (i + 1 < n) {
        i++;
        out += escapeRx(line[i]);
      }
    } else {
      out += escapeRx(c);
    }
  }
  out += "$";
  let rx: RegExp;
  try {
    rx = new RegExp(out, "s");
  } catch (e) {
    throw new SyntaxError(`ignore pattern ${JSON.stringify(line)}: ${(e as Error).message}`);
  }
  return { base, rx, negate, dirOnly };
}

class Matcher {
  constructor(readonly rules: Rule[], readonly extra: Rule[]) {}

  /** The matcher of directory rel, with the rules of its ignore files. */
  child(rootReal: string, rel: string): Matcher {
    const add: Rule[] = [];
    for (const name of [".gitignore", ".sandboxignore"]) {
      const text = readIgnoreFile(rootReal, rel ? `${rel}/${name}` : name);
      for (const line of text?.split("\n") ?? []) {
        const r = compileIgnore(line, rel);
        if (r) {
          add.push(r);
        }
      }
    }
    return add.length === 0 ? this : new Matcher([...this.rules, ...add], this.extra);
  }

  ignored(rel: string, isDir: boolean): boolean {
    let ign = false;
    for (const set of [this.rules, this.extra]) {
      for (const r of set) {
        if (r.dirOnly && !isDir) {
          continue;
        }
        let p = rel;
        if (r.base) {
          if (!rel.startsWith(r.base + "/")) {
            continue;
          }
          p = rel.slice(r.base.length + 1);
        }
        if (r.rx.test(p)) {
          ign = !r.negate;
        }
      }
    }
    return ign;
  }
}

const utf8 = new TextDecoder("utf-8", { fatal: true });

/**
 * walkCodebase lists what codebases.fromLocal would upload from dir:
 * entries (parents before children, in name order) and the files skipped
 * (larger than maxFileBytes; sockets, FIFOs and devices; names that are
 * not UTF-8). Symlinks are listed as links and never followed. The tree
 * may be reshaped while it is walked (a cloned repository's scripts, a
 * tree a sandbox shares): a directory must still be the one its parent
 * listed once it has been read (else ReplacedFileError), and ignore files
 * are read only as regular files of the tree (else IgnoreFileError).
 */
export function walkCodebase(dir: string, opts: WalkOptions = {}): { files: LocalEntry[]; skipped: SkippedFile[] } {
  if (!statSync(dir).isDirectory()) {
    throw new RangeError(`codebase directory ${dir}: not a directory`);
  }
  const rootReal = realpathSync(dir);
  const maxFile = opts.maxFileBytes === undefined ? DEFAULT_MAX_FILE_BYTES : opts.maxFileBytes ?? 0;
  const extra = (opts.ignore ?? []).map((p) => compileIgnore(p, "")).filter((r): r is Rule => r !== undefined);
  const files: LocalEntry[] = [];
  const skipped: SkippedFile[] = [];
  const walk = (rel: string, m: Matcher, seen: BigIntStats) => {
    if (opts.useIgnoreFiles ?? true) {
      m = m.child(rootReal, rel);
    }
    const abs = rel ? join(rootReal, rel) : rootReal;
    const raw = readdirSync(abs, { encoding: "buffer" });
    // Listed by path: the directory must still be the one the parent's
    // listing saw, or the names may be those of what a symlink swapped in
    // for it leads to.
    const now = lstatSync(abs, { bigint: true });
    if (!now.isDirectory() || now.dev !== seen.dev || now.ino !== seen.ino) {
      throw new ReplacedFileError(`${rel || "."}: replaced during the walk; not listed`);
    }
    const names: string[] = [];
    for (const b of raw) {
      try {
        names.push(utf8.decode(b));
      } catch {
        skipped.push({ path: `${rel ? rel + "/" : ""}${b.toString("latin1")}`, sizeBytes: 0, reason: "name is not valid UTF-8" });
      }
    }
    names.sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
    for (const name of names) {
      const r = rel ? `${rel}/${name}` : name;
      let st: BigIntStats;
      try {
        st = lstatSync(join(abs, name), { bigint: true });
      } catch (e) {
        if ((e as NodeJS.ErrnoException).code === "ENOENT") {
          continue; // vanished during the walk
        }
        throw e;
      }
      const isDir = st.isDirectory();
      if (r === ".git" && isDir && opts.includeGit === false) {
        continue;
      }
      if (m.ignored(r, isDir)) {
        continue;
      }
      if (isDir) {
        files.push({ rel: r, st });
        walk(r, m, st);
      } else if (st.isFile()) {
        if (maxFile && st.size > BigInt(maxFile)) {
          skipped.push({ path: r, sizeBytes: Number(st.size), reason: `larger than ${maxFile} bytes` });
          continue;
        }
        files.push({ rel: r, st });
      } else if (st.isSymbolicLink()) {
        files.push({ rel: r, st });
      } else {
        skipped.push({ path: r, sizeBytes: 0, reason: "not a regular file, directory or symlink" });
      }
    }
  };
  walk("", new Matcher([], extra), lstatSync(rootReal, { bigint: true }));
  return { files, skipped };
}

const READ_CHUNK = 1 << 20;

/**
 * codebaseTar yields the tar of the entries walkCodebase picked from dir
 * (owned by root, in about 1 MiB pieces, one file in memory at most a
 * piece at a time). Each regular file must still be the very file the walk
 * saw (openWalked) and is sent as walked: one that shrank since fails.
 */
export function* codebaseTar(dir: string, files: LocalEntry[]): Generator<Uint8Array> {
  const rootReal = realpathSync(dir);
  let parts: Uint8Array[] = [];
  let size = 0;
  const add = (b: Uint8Array) => {
    parts.push(b);
    size += b.length;
  };
  const take = (): Uint8Array => {
    const out = Buffer.concat(parts, size);
    parts = [];
    size = 0;
    return out;
  };
  for (const { rel, st } of files) {
    const mode = Number(st.mode) & 0o7777;
    const mtime = Math.floor(Number(st.mtimeMs) / 1000);
    const abs = join(rootReal, rel);
    if (st.isDirectory()) {
      header(`${rel}/`, "5", 0, mode, mtime).forEach(add);
    } else if (st.isSymbolicLink()) {
      header(rel, "2", 0, 0o777, mtime, readlinkSync(abs)).forEach(add);
    } else {
      const fileSize = Number(st.size);
      const fd = openWalked(rootReal, abs, rel, st);
      try {
        header(rel, "0", fileSize, mode, mtime).forEach(add);
        let left = fileSize;
        while (left > 0) {
          const buf = Buffer.allocUnsafe(Math.min(left, READ_CHUNK));
          let n = 0;
          for (let r; n < buf.length && (r = readSync(fd, buf, n, buf.length - n, null)) > 0;) {
            n += r;
          }
          if (n < buf.length) {
            throw new ReplacedFileError(`${rel}: shrank from ${fileSize} bytes during the upload; not sent`);
          }
          add(buf);
          left -= n;
          if (size >= READ_CHUNK) {
            yield take();
          }
        }
        if (fileSize % 512 !== 0) {
          add(new Uint8Array(512 - (fileSize % 512)));
        }
      } finally {
        closeSync(fd);
      }
    }
    if (size >= READ_CHUNK) {
      yield take();
    }
  }
  add(new Uint8Array(1024));
  yield take();
}


// Packing a local directory (uploadDir, recipe copyLocal, Dockerfile
// contexts) while someone else reshapes it: a file or a directory swapped
// for a symlink to a secret outside it just after packDir looked at it.
// The pack must fail with ReplacedFileError and never return the secret.
import assert from "node:assert/strict";
import fs from "node:fs";
import { mkdirSync, mkdtempSync, rmSync, symlinkSync, unlinkSync, writeFileSync } from "node:fs";
import { syncBuiltinESMExports } from "node:module";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, it } from "node:test";

import { packDir, ReplacedFileError } from "@sbxdev/sbx";

const SECRET = "SECRET-OUTSIDE-THE-DIRECTORY";

function tree() {
  const base = mkdtempSync(join(tmpdir(), "sbx-packswap-"));
  const code = join(base, "code");
  const outside = join(base, "outside");
  mkdirSync(join(code, "d"), { recursive: true });
  mkdirSync(outside);
  const pad = "x".repeat(SECRET.length); // as long as the secret: a size check alone passes
  writeFileSync(join(code, "f"), pad);
  writeFileSync(join(code, "d", "secret"), pad);
  writeFileSync(join(outside, "secret"), SECRET);
  return { base, code, outside };
}

const swaps = {
  // [the path whose lstat triggers the swap, the swap]
  "file replaced by a link": ["f", (code, outside) => {
    unlinkSync(join(code, "f"));
    symlinkSync(join(outside, "secret"), join(code, "f"));
  }],
  "directory replaced by a link before it is listed": ["d", (code, outside) => {
    rmSync(join(code, "d"), { recursive: true });
    symlinkSync(outside, join(code, "d"));
  }],
  "directory replaced by a link after its file was seen": ["d/secret", (code, outside) => {
    rmSync(join(code, "d"), { recursive: true });
    symlinkSync(outside, join(code, "d"));
  }],
  "file replaced by a relative link out": ["d/secret", (code) => {
    unlinkSync(join(code, "d", "secret"));
    symlinkSync("../../outside/secret", join(code, "d", "secret"));
  }],
  // A file the walk left out (.dockerignore) read in place of a walked one.
  "file replaced by a link to a file inside": ["f", (code) => {
    writeFileSync(join(code, ".env"), SECRET);
    unlinkSync(join(code, "f"));
    symlinkSync(".env", join(code, "f"));
  }],
};

describe("packDir while the directory is reshaped", () => {
  for (const [name, [rel, swap]] of Object.entries(swaps)) {
    it(name, () => {
      const { base, code, outside } = tree();
      writeFileSync(join(outside, "outside-only-name"), SECRET);
      const orig = fs.lstatSync;
      let done = false;
      const listed = []; // every path packDir looked at
      fs.lstatSync = function (p, ...rest) {
        listed.push(String(p));
        const st = orig.call(this, p, ...rest);
        if (!done && p === join(code, rel)) {
          done = true;
          swap(code, outside);
        }
        return st;
      };
      syncBuiltinESMExports();
      try {
        let got;
        assert.throws(() => {
          got = packDir(code);
        }, ReplacedFileError);
        assert.ok(done, "the swap was never made");
        assert.equal(got, undefined);
        assert.ok(!listed.some((n) => n.includes("outside-only-name")), `listed ${listed}`);
      } finally {
        fs.lstatSync = orig;
        syncBuiltinESMExports();
        rmSync(base, { recursive: true, force: true });
      }
    });
  }
});

// safeExtract into a directory that already holds the user's own links
// (p -> a directory outside it): the archive's l -> p/x reads as inside on
// its own but leads out, so it is not left behind and is listed as
// skipped. A link through an existing link that stays inside, and a
// dangling one, are kept.
import assert from "node:assert/strict";
import { lstatSync, mkdirSync, mkdtempSync, readlinkSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, it } from "node:test";

import { packDir, safeExtract } from "@sbxdev/sbx";

describe("safeExtract through links the destination held", () => {
  for (const existing of ["absolute", "../outside"]) {
    it(`p -> ${existing}`, () => {
      const top = mkdtempSync(join(tmpdir(), "sbx-extractlinks-"));
      try {
        // The archive, as a box would make it.
        const src = join(top, "src");
        mkdirSync(join(src, "in"), { recursive: true });
        writeFileSync(join(src, "in", "y"), "y");
        symlinkSync("p/x", join(src, "l"));
        symlinkSync("q/y", join(src, "m"));
        symlinkSync("nothing/here", join(src, "dangling"));
        const tar = packDir(src);
        // The destination, with the user's own links.
        const dst = join(top, "dst");
        const outside = join(top, "outside");
        mkdirSync(join(dst, "in"), { recursive: true });
        mkdirSync(outside);
        symlinkSync(existing === "absolute" ? outside : "../outside", join(dst, "p"));
        symlinkSync("in", join(dst, "q"));

        const skipped = [];
        safeExtract(tar, dst, skipped);
        assert.deepEqual(skipped, ["l"]);
        assert.throws(() => lstatSync(join(dst, "l")), /ENOENT/);
        assert.equal(readlinkSync(join(dst, "m")), "q/y");
        assert.equal(readlinkSync(join(dst, "dangling")), "nothing/here");
      } finally {
        rmSync(top, { recursive: true, force: true });
      }
    });
  }
});

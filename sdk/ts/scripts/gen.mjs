// Generates src/gen from ../../api/proto/sbx (the public API; not the
// agent's) with protoc and the pinned @bufbuild/protoc-gen-es.
//   node scripts/gen.mjs src/gen          regenerate
//   node scripts/gen.mjs --check src/gen  fail if src/gen is stale
import { execFileSync } from "node:child_process";
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, relative, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const root = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const protoDir = resolve(root, "../../api/proto");
const args = process.argv.slice(2);
const check = args[0] === "--check";
const target = resolve(root, check ? args[1] : args[0] ?? "src/gen");

function files(dir) {
  return readdirSync(dir).flatMap((n) => {
    const p = join(dir, n);
    return statSync(p).isDirectory() ? files(p) : [p];
  });
}

function generate(out) {
  const protos = files(join(protoDir, "sbx")).filter((p) => p.endsWith(".proto")).map((p) => relative(protoDir, p)).sort();
  execFileSync("protoc", [
    "-I", protoDir,
    `--plugin=protoc-gen-es=${join(root, "node_modules/.bin/protoc-gen-es")}`,
    `--es_out=${out}`,
    "--es_opt=target=ts,import_extension=js",
    ...protos,
  ], { stdio: "inherit" });
}

if (!check) {
  rmSync(target, { recursive: true, force: true });
  mkdirSync(target, { recursive: true });
  generate(target);
} else {
  const tmp = mkdtempSync(join(tmpdir(), "sbx-ts-gen-"));
  try {
    generate(tmp);
    const want = files(tmp).map((p) => relative(tmp, p)).sort();
    let have = [];
    try { have = files(target).map((p) => relative(target, p)).sort(); } catch { /* missing */ }
    const stale = want.filter((f) => !have.includes(f) || readFileSync(join(tmp, f), "utf8") !== readFileSync(join(target, f), "utf8"))
      .concat(have.filter((f) => !want.includes(f)));
    if (stale.length > 0) {
      console.error(`check-gen: ${relative(root, target)} is stale (${stale.join(", ")}): run npm run gen in sdk/ts and commit the result`);
      process.exitCode = 1;
    } else {
      console.log("check-gen: sdk/ts/src/gen is up to date");
    }
  } finally {
    rmSync(tmp, { recursive: true, force: true });
  }
}

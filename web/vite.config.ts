import { defineConfig } from "vite";
import { fileURLToPath } from "node:url";

// The generated API code lives in sdk/ts/src/gen; its imports of
// @bufbuild/protobuf must resolve to this package's copy (one runtime).
const here = (p: string) => fileURLToPath(new URL(p, import.meta.url));

export default defineConfig({
  base: "/ui/",
  resolve: {
    dedupe: ["@bufbuild/protobuf"],
    alias: [
      { find: /^@gen\/(.*)$/, replacement: here("../sdk/ts/src/gen/sbx/v1/") + "$1" },
    ],
  },
  build: {
    outDir: here("../internal/ui/dist"),
    emptyOutDir: true,
    // No inline assets: the CSP allows files from the daemon only.
    assetsInlineLimit: 0,
    modulePreload: { polyfill: false },
    reportCompressedSize: true,
    chunkSizeWarningLimit: 1024,
  },
});

import { lstatSync, readFileSync } from "node:fs";
import { basename, dirname, resolve } from "node:path";

import { create, type MessageInitShape } from "@bufbuild/protobuf";

import { RecipeSchema, type Recipe as PbRecipe, type RecipeStepSchema } from "./gen/sbx/v1/images_pb.js";
import { packDir } from "./tar.js";

/** The most a copyLocal step packs (a volume or codebase takes more). */
const MAX_COPY = 64 << 20;

type Step = NonNullable<MessageInitShape<typeof RecipeStepSchema>["step"]>;

/**
 * An image recipe, built step by step like a Dockerfile
 * (client.images.build); every method returns the recipe, so calls chain:
 *
 *     const recipe = new Recipe("debian:bookworm")
 *       .aptInstall("python3", "python3-numpy")
 *       .env({ PYTHONUNBUFFERED: "1" })
 *       .copyLocal("./app", "/app")
 *       .workdir("/app")
 *       .run("python3 -c 'import numpy'");
 *
 * Each step becomes a layer cached by the hash of its parent and the step.
 * `base` is "debian:bookworm" (made locally from Debian's mirror), "host"
 * or any image reference.
 */
export class Recipe {
  private readonly steps: Step[] = [];

  constructor(readonly base = "debian:bookworm") {
    if (!base) {
      throw new RangeError("recipe: base image must not be empty");
    }
  }

  private add(step: Step): this {
    this.steps.push(step);
    return this;
  }

  private static packages(kind: string, packages: string[]): { packages: string[] } {
    if (packages.length === 0 || packages.some((p) => typeof p !== "string" || !p.trim())) {
      throw new RangeError(`${kind}: want one or more package names, got ${JSON.stringify(packages)}`);
    }
    return { packages };
  }

  /** Install Debian packages with apt-get. */
  aptInstall(...packages: string[]): this {
    return this.add({ case: "aptInstall", value: Recipe.packages("aptInstall", packages) });
  }

  /** Install Python packages with pip. */
  pipInstall(...packages: string[]): this {
    return this.add({ case: "pipInstall", value: Recipe.packages("pipInstall", packages) });
  }

  /** Install npm packages globally. */
  npmInstall(...packages: string[]): this {
    return this.add({ case: "npmInstall", value: Recipe.packages("npmInstall", packages) });
  }

  /** Run a shell command line (/bin/sh -c). */
  run(command: string): this {
    if (!command?.trim()) {
      throw new RangeError("run: empty command");
    }
    return this.add({ case: "run", value: command });
  }

  /** Add variables to the image's environment. */
  env(values: Record<string, string>): this {
    if (Object.keys(values).length === 0) {
      throw new RangeError("env: no variables");
    }
    return this.add({ case: "env", value: { env: { ...values } } });
  }

  /** Set the working directory of later steps and of the image. */
  workdir(path: string): this {
    return this.add({ case: "workdir", value: path });
  }

  /** Set the user of later steps and of the image. */
  user(user: string): this {
    return this.add({ case: "user", value: user });
  }

  /** Install Python `version` ("3.11") from the image's apt sources. */
  python(version: string): this {
    if (!/^3\./.test(version)) {
      throw new RangeError(`python: want a version like "3.11", got ${JSON.stringify(version)}`);
    }
    return this.add({ case: "python", value: version });
  }

  entrypoint(...argv: string[]): this {
    return this.add({ case: "entrypoint", value: { values: argv } });
  }

  cmd(...argv: string[]): this {
    return this.add({ case: "cmd", value: { values: argv } });
  }

  /** Copy a local file or directory (its contents) into the image at dest.
   * The files are packed now: later changes do not affect this recipe. */
  copyLocal(localPath: string, dest: string): this {
    let st;
    try {
      st = lstatSync(localPath);
    } catch {
      throw new RangeError(`copyLocal: ${localPath}: no such file or directory`);
    }
    let tar: Uint8Array;
    if (st.isDirectory()) {
      tar = packDir(localPath, undefined, MAX_COPY);
    } else if (st.isFile()) {
      // A one-file tree: pack the file's directory with only it kept.
      const name = basename(localPath);
      const data = readFileSync(localPath);
      if (data.length > MAX_COPY) {
        throw new RangeError(`copyLocal: ${localPath} is ${data.length} bytes, more than ${MAX_COPY}; use a volume or codebase`);
      }
      tar = packDir(dirname(resolve(localPath)), { excluded: (p: string) => p !== name }, MAX_COPY);
    } else {
      throw new RangeError(`copyLocal: ${localPath}: not a file or directory`);
    }
    return this.add({ case: "copy", value: { dest, tar } });
  }

  /** The recipe as the API's message. */
  toProto(): PbRecipe {
    return create(RecipeSchema, { from: this.base, steps: this.steps.map((step) => ({ step })) });
  }
}

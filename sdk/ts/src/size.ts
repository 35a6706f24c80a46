/** parseSize turns 512M, 1G, 1.5g, 64Mi or a number of bytes into bytes
 * (undefined: 0, the daemon's default). */
export function parseSize(size: number | string | undefined): number {
  if (size === undefined || size === "") {
    return 0;
  }
  if (typeof size === "number") {
    if (!Number.isFinite(size) || size < 0) {
      throw new RangeError(`bad size ${size}: want a byte count of 0 or more`);
    }
    return Math.floor(size);
  }
  const m = /^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$/i.exec(size);
  if (!m) {
    throw new RangeError(`bad size ${JSON.stringify(size)}: want e.g. 512M or 1G`);
  }
  const mult = { "": 1, k: 2 ** 10, m: 2 ** 20, g: 2 ** 30, t: 2 ** 40 }[m[2].toLowerCase() as "" | "k" | "m" | "g" | "t"];
  return Math.floor(Number(m[1]) * mult);
}

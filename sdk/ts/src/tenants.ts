import type { Tenant as PbTenant } from "./gen/sbx/v1/tenants_pb.js";
import type { Client } from "./client.js";
import { call } from "./errors.js";

/** A tenant's quotas (0: unbounded). */
export interface TenantQuotas {
  maxSandboxes: number;
  memoryBytes: number;
  cpuMillis: number;
  diskBytes: number;
  storageBytes: number;
}

/** What a tenant uses against its quotas. */
export interface TenantUsage {
  sandboxes: number;
  memoryBytes: number;
  cpuMillis: number;
  diskBytes: number;
  storageBytes: number;
  imagesBytes: number;
  volumesBytes: number;
  codebasesBytes: number;
}

/** A tenant ("" for the owner of a single-user daemon). */
export interface Tenant {
  name: string;
  quotas: TenantQuotas;
  usage: TenantUsage;
  /** For a scoped sandbox token: the sandbox whose children it manages. */
  scopeSandbox: string;
  /** How many API tokens the tenant has (admin views only). */
  tokens: number;
}

function tenantOf(t: PbTenant | undefined): Tenant {
  const q = t?.quotas;
  const u = t?.usage;
  return {
    name: t?.name ?? "",
    quotas: {
      maxSandboxes: q?.maxSandboxes ?? 0, memoryBytes: Number(q?.memoryBytes ?? 0), cpuMillis: Number(q?.cpuMillis ?? 0),
      diskBytes: Number(q?.diskBytes ?? 0), storageBytes: Number(q?.storageBytes ?? 0),
    },
    usage: {
      sandboxes: u?.sandboxes ?? 0, memoryBytes: Number(u?.memoryBytes ?? 0), cpuMillis: Number(u?.cpuMillis ?? 0),
      diskBytes: Number(u?.diskBytes ?? 0), storageBytes: Number(u?.storageBytes ?? 0), imagesBytes: Number(u?.imagesBytes ?? 0),
      volumesBytes: Number(u?.volumesBytes ?? 0), codebasesBytes: Number(u?.codebasesBytes ?? 0),
    },
    scopeSandbox: t?.scopeSandbox ?? "", tokens: t?.tokens ?? 0,
  };
}

/** The daemon's tenants (client.tenants). */
export class Tenants {
  /** @internal */
  constructor(private readonly c: Client) {}

  /** The token's own tenant: its quotas and usage. */
  async current(): Promise<Tenant> {
    const r = await call("get tenant", () => this.c.rpc.tenants.getTenant({}));
    return tenantOf(r.tenant);
  }

  /** A tenant by name (the admin token, or a tenant's own name). */
  async get(name: string): Promise<Tenant> {
    const r = await call(`get tenant ${name}`, () => this.c.rpc.tenants.getTenant({ name }));
    return tenantOf(r.tenant);
  }

  /** Every tenant (the admin token only). */
  async list(): Promise<Tenant[]> {
    const r = await call("list tenants", () => this.c.rpc.tenants.listTenants({}));
    return r.tenants.map(tenantOf);
  }
}

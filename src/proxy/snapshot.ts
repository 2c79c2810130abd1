/**
 * The config a request is decided and forwarded under (DESIGN section 12, live reload):
 * one immutable snapshot of the settings, captured when the request arrives and kept for
 * its whole life. A reload swaps the snapshot in force in one assignment, so a request
 * sees the old config or the new one, never a mix, and requests in flight finish under
 * the config they started with. Settings are read from `config` itself (`config.limits.*`,
 * `config.server.*`), so a key added to the schema reaches the pipeline with no change
 * here; what is derived from the config is derived once per reload, not per request.
 */
import type { Config } from '../config/schema.js';
import { parseRange, type Cidr } from '../policy/network.js';
import { shadowSet, type ShadowSet } from '../policy/shadow.js';
import { buildRules, type RouteRule } from '../routes.js';
import type { TargetSet } from './upstream/targets.js';

export interface Capacity {
  concurrency: number;
  rpm: number;
}

export interface Snapshot {
  /** the config in force when the request arrived */
  readonly config: Config;
  /** route table: the built-in routes, then the operator's (routes.ts) */
  readonly rules: readonly RouteRule[];
  /** capacity of each upstream, by routing mode */
  readonly capacity: ReadonlyMap<string, Capacity>;
  /** `server.trustedProxies`, parsed */
  readonly trustedProxies: readonly Cidr[];
  /** `<messages.vendor>-version`, logged as api_version */
  readonly versionHeader: string;
  /** `limits.shadow`: checks evaluated but not enforced for every key (DESIGN section 12) */
  readonly shadow: ShadowSet;
  /** where each routing mode forwards */
  readonly targets: TargetSet;
  /** `logging.level` writes access lines (info or finer): a request arrived under it keeps it until it ends */
  readonly accessLines: boolean;
}

/** A snapshot and the number of requests holding it: a plain field, no Map churn per request. */
class HeldSnapshot implements Snapshot {
  readonly rules: readonly RouteRule[];
  readonly capacity: ReadonlyMap<string, Capacity>;
  readonly trustedProxies: readonly Cidr[];
  readonly versionHeader: string;
  readonly shadow: ShadowSet;
  readonly accessLines: boolean;
  /** requests that took this snapshot and have not ended */
  requests = 0;

  constructor(
    readonly config: Config,
    readonly targets: TargetSet,
  ) {
    this.rules = buildRules(config.routes);
    this.capacity = new Map(Object.entries(config.upstreams).map(([name, u]) => [name, u.capacity]));
    this.trustedProxies = config.server.trustedProxies.map((c) => parseRange(c)!);
    this.versionHeader = `${config.messages.vendor}-version`;
    this.shadow = shadowSet(config.limits.shadow);
    this.accessLines = ['trace', 'debug', 'info'].includes(config.logging.level);
  }
}

export function snapshotOf(config: Config, targets: TargetSet): Snapshot {
  return new HeldSnapshot(config, targets);
}

/**
 * The snapshot in force and those still in use. Each request takes the snapshot in force
 * when it arrives and gives it back when it ends; a replaced snapshot releases its
 * forwarding targets once the last request that took it has ended.
 */
export class Snapshots {
  private current: HeldSnapshot;

  constructor(first: Snapshot) {
    this.current = first as HeldSnapshot;
  }

  /** what a request arriving now is decided under */
  get inForce(): Snapshot {
    return this.current;
  }

  /** The snapshot in force, held until `release` is given it. */
  take(): Snapshot {
    const s = this.current;
    s.requests++;
    return s;
  }

  release(snapshot: Snapshot): void {
    const s = snapshot as HeldSnapshot;
    if (--s.requests === 0 && s !== this.current) s.targets.release();
  }

  /** Puts `next` (made by snapshotOf) in force for every request that arrives from now on. */
  swap(next: Snapshot): void {
    const previous = this.current;
    this.current = next as HeldSnapshot;
    if (previous !== next && previous.requests === 0) previous.targets.release();
  }
}

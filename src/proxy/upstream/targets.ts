/**
 * Forwarding targets: each upstream's URL and its keep-alive agent, as one config names
 * them. A reload builds a new set; an upstream whose URL and timeout did not change keeps
 * its target, agent and warm sockets. A target the new set dropped stays usable by the
 * requests that started under an older set, and its agent is destroyed only once no set
 * that holds it is in use any more: its sockets are idle by then, so nothing in flight is
 * cut.
 */
import type http from 'node:http';
import { createUpstreamAgent } from './agent.js';

export interface UpstreamTarget {
  url: string;
  timeoutMs: number;
}

export interface Target {
  readonly url: URL;
  readonly agent: http.Agent;
  /** false for a target at the root: the request's path alone, without a URL join per request */
  readonly prependPath: boolean;
}

/** A target and the number of sets that hold it. */
class HeldTarget implements Target {
  readonly url: URL;
  readonly agent: http.Agent;
  readonly prependPath: boolean;
  /** live sets holding this target: at 0 its agent is destroyed */
  sets = 0;

  constructor(
    readonly spec: string,
    up: UpstreamTarget,
  ) {
    this.url = new URL(up.url);
    this.agent = createUpstreamAgent({ tls: this.url.protocol === 'https:', timeoutMs: up.timeoutMs });
    this.prependPath = !(this.url.pathname === '/' && this.url.search === '');
  }
}

/** What makes two targets interchangeable: the same URL and the same socket timeout. */
const specOf = (up: UpstreamTarget): string => `${up.timeoutMs} ${up.url}`;

/** One config's targets by routing mode. */
export class TargetSet {
  private released = false;

  private constructor(
    private readonly byName: ReadonlyMap<string, HeldTarget>,
    private readonly onDestroyed: (t: HeldTarget) => void,
  ) {
    for (const t of new Set(byName.values())) t.sets++;
  }

  /**
   * The targets of `upstreams`, taking over from `previous` those whose URL and timeout
   * are unchanged. `created` and `destroyed` tell the owner which agents exist.
   */
  static build(o: {
    upstreams: Record<string, UpstreamTarget>;
    previous: TargetSet | null;
    created: (t: Target) => void;
    destroyed: (t: Target) => void;
  }): TargetSet {
    const reusable = new Map<string, HeldTarget>();
    if (o.previous) for (const t of o.previous.byName.values()) reusable.set(t.spec, t);
    const byName = new Map<string, HeldTarget>();
    for (const [name, up] of Object.entries(o.upstreams)) {
      const spec = specOf(up);
      let t = reusable.get(spec);
      if (!t) {
        t = new HeldTarget(spec, up);
        reusable.set(spec, t);
        o.created(t);
      }
      byName.set(name, t);
    }
    return new TargetSet(byName, o.destroyed);
  }

  /** The routing mode's target; a mode the config does not name goes to `default`. */
  get(name: string): Target {
    return this.byName.get(name) ?? this.byName.get('default')!;
  }

  /** No request uses this set any more: targets no other set holds lose their agent. */
  release(): void {
    if (this.released) return;
    this.released = true;
    for (const t of new Set(this.byName.values())) {
      if (--t.sets > 0) continue;
      t.agent.destroy();
      this.onDestroyed(t);
    }
  }
}

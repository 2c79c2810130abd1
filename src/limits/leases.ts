import { randomBytes } from 'node:crypto';
import { DenseSet } from '../dense-set.js';
import type { LeaseTerm } from './lease-term.js';

/**
 * Keeps the concurrency leases this instance holds alive. Each lease sits in one or two
 * lease sets (the key's, the route's); while it is live, its expiry is pushed forward every
 * period of the lease term, batched per set, so one call refreshes all of a key's in-flight
 * requests. The timer is unref'd and runs only while leases are held, so it never keeps a
 * process up.
 */
export interface LeaseKeeperOptions {
  /** The lifetime each refresh gives and the refresh period; a period of 0 disables the timer (tests call refreshNow themselves). */
  term: LeaseTerm;
  refresh: (setKey: string, leaseIds: string[]) => Promise<void>;
  onError: (err: unknown) => void;
}

/** What a ledger shows of the keeper of its holds: refresh now, count, stop. */
export type KeptHolds = Pick<LeaseKeeper, 'refreshNow' | 'count' | 'stop'>;

/** What `add` hands back and `remove` takes (-1: nothing was kept). */
export type LeaseTicket = number;

export interface LeaseKeeper {
  /** Keeps `leaseId` alive in each of `setKeys` until `remove` is given the ticket. */
  add(leaseId: string, setKeys: string[]): LeaseTicket;
  remove(ticket: LeaseTicket): void;
  /** Live leases that hold at least one slot. */
  count(): number;
  refreshNow(): Promise<void>;
  /** whether the refresh timer is running (it runs only while leases are held) */
  timerRunning(): boolean;
  stop(): void;
}

// Random, not derived from the request id: nothing a client sends ends up in Redis. The
// randomness is drawn once per process (96 bits, which other instances and workers cannot
// guess or collide with) and a counter makes each id unique within the process, so taking a
// lease id is a string concatenation, not a call into the random source per request.
const leasePrefix = randomBytes(12).toString('base64url');
let leaseCount = 0;

export function newLeaseId(): string {
  return leasePrefix + (++leaseCount).toString(36);
}

export function createLeaseKeeper(opts: LeaseKeeperOptions): LeaseKeeper {
  return new Keeper(opts);
}

interface KeptLease {
  id: string;
  setKeys: string[];
}

class Keeper implements LeaseKeeper {
  // One add and one remove per request: array cells, not Maps keyed by lease id (a Map with
  // that churn keeps replacing its hash table: src/dense-set.ts). Grouped by set only to refresh.
  private readonly leases = new DenseSet<KeptLease>();
  private timer: NodeJS.Timeout | null = null;
  private running: Promise<void> | null = null;
  private stopped = false;
  private readonly tick = (): void => {
    this.timer = null;
    void this.refreshNow();
    this.arm(this.opts.term.refreshEveryMs);
  };

  constructor(private readonly opts: LeaseKeeperOptions) {
    opts.term.onChange((previous) => this.termChanged(previous));
  }

  add(leaseId: string, setKeys: string[]): LeaseTicket {
    if (setKeys.length === 0) return -1;
    const ticket = this.leases.add({ id: leaseId, setKeys });
    this.syncTimer();
    return ticket;
  }

  remove(ticket: LeaseTicket): void {
    if (ticket < 0) return;
    this.leases.delete(ticket);
    this.syncTimer();
  }

  count(): number {
    return this.leases.size;
  }

  refreshNow(): Promise<void> {
    // A slow Redis must not stack refresh rounds on top of each other.
    if (this.running) return this.running;
    const rounds = [...this.idsBySet()].map(([setKey, ids]) => this.opts.refresh(setKey, ids).catch((err: unknown) => this.opts.onError(err)));
    this.running = Promise.all(rounds)
      .then(
        () => undefined,
        () => undefined,
      )
      .finally(() => {
        this.running = null;
      });
    return this.running;
  }

  timerRunning(): boolean {
    return this.timer !== null;
  }

  stop(): void {
    this.stopped = true;
    this.disarm();
  }

  /** The ids of the live leases, per set. */
  private idsBySet(): Map<string, string[]> {
    const bySet = new Map<string, string[]>();
    this.leases.forEach((l) => {
      for (const k of l.setKeys) {
        const ids = bySet.get(k);
        if (ids) ids.push(l.id);
        else bySet.set(k, [l.id]);
      }
    });
    return bySet;
  }

  private syncTimer(): void {
    if (this.leases.size > 0 && !this.timer) this.arm(this.opts.term.refreshEveryMs);
    else if (this.leases.size === 0 && this.timer) this.disarm();
  }

  /** The next refresh in `ms` (none when the keeper is stopped, holds nothing, or the period is 0). */
  private arm(ms: number): void {
    if (this.stopped || this.leases.size === 0 || ms <= 0) return;
    this.timer = setTimeout(this.tick, ms);
    this.timer.unref();
  }

  private disarm(): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
  }

  /**
   * A shorter period moves the next refresh to one new period from now, so leases granted
   * under the new term are refreshed within it. A longer one leaves the refresh already
   * planned, which leases refreshed under the previous term count on; the ones after it
   * come at the new period.
   */
  private termChanged(previous: { refreshEveryMs: number }): void {
    const period = this.opts.term.refreshEveryMs;
    if (!this.timer || period >= previous.refreshEveryMs) return;
    this.disarm();
    this.arm(period);
  }
}

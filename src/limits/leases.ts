import { randomBytes } from 'node:crypto';
import { DenseSet } from '../dense-set.js';

/**
 * Keeps the concurrency leases this instance holds alive. Each lease sits in one or two
 * lease sets (the key's, the route's); while it is live, its expiry is pushed forward every
 * `everyMs`, batched per set, so one call refreshes all of a key's in-flight requests.
 * The timer is unref'd and runs only while leases are held, so it never keeps a process up.
 */
export interface LeaseKeeperOptions {
  /** Refresh period; 0 disables the timer (tests call refreshNow themselves). */
  everyMs: number;
  refresh: (setKey: string, leaseIds: string[]) => Promise<void>;
  onError: (err: unknown) => void;
}

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

// Random, not derived from the request id: nothing a client sends ends up in Redis. A
// fresh random id per lease cost more CPU than any other step of an admission, so the
// randomness is drawn once per process (96 bits, which other instances and workers
// cannot guess or collide with) and a counter makes each id unique within the process.
const leasePrefix = randomBytes(12).toString('base64url');
let leaseCount = 0;

export function newLeaseId(): string {
  return leasePrefix + (++leaseCount).toString(36);
}

export function createLeaseKeeper(opts: LeaseKeeperOptions): LeaseKeeper {
  // One add and one remove per request: array cells, not Maps keyed by lease id (a Map with
  // that churn keeps replacing its hash table: src/dense-set.ts). Grouped by set only to refresh.
  const leases = new DenseSet<{ id: string; setKeys: string[] }>();
  let timer: NodeJS.Timeout | null = null;
  let running: Promise<void> | null = null;
  let stopped = false;

  const refreshNow = (): Promise<void> => {
    // A slow Redis must not stack refresh rounds on top of each other.
    if (running) return running;
    const bySet = new Map<string, string[]>();
    leases.forEach((l) => {
      for (const k of l.setKeys) {
        const ids = bySet.get(k);
        if (ids) ids.push(l.id);
        else bySet.set(k, [l.id]);
      }
    });
    running = Promise.all(
      [...bySet].map(([setKey, ids]) => opts.refresh(setKey, ids).catch((err: unknown) => opts.onError(err))),
    ).then(
      () => undefined,
      () => undefined,
    ).finally(() => {
      running = null;
    });
    return running;
  };

  const syncTimer = (): void => {
    if (leases.size > 0 && !timer && !stopped && opts.everyMs > 0) {
      timer = setInterval(() => void refreshNow(), opts.everyMs);
      timer.unref();
    } else if (leases.size === 0 && timer) {
      clearInterval(timer);
      timer = null;
    }
  };

  return {
    add(leaseId, setKeys) {
      if (setKeys.length === 0) return -1;
      const ticket = leases.add({ id: leaseId, setKeys });
      syncTimer();
      return ticket;
    },
    remove(ticket) {
      if (ticket < 0) return;
      leases.delete(ticket);
      syncTimer();
    },
    count: () => leases.size,
    refreshNow,
    timerRunning: () => timer !== null,
    stop() {
      stopped = true;
      if (timer) clearInterval(timer);
      timer = null;
    },
  };
}

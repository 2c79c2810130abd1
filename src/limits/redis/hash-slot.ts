/**
 * Redis Cluster hash slots (CRC16 of the hash tag, mod 16384, computed by cluster-key-slot,
 * the module ioredis itself uses), so the limiter can tell which shard an admission depends
 * on before it sends anything.
 */
import calculateSlot from 'cluster-key-slot';

/** The hash slot of a key: only the part inside the first non-empty {...} is hashed, as Redis does. */
export function hashSlot(key: string): number {
  return calculateSlot(key);
}

/**
 * Items grouped by the hash slot of the tag `tagOf` names (one group in all when `cluster` is false),
 * each group cut into calls of at most `max`: one script call may only touch one hash slot,
 * and Redis serves nothing else while a script runs.
 */
export function callsByHashSlot<T>(items: T[], o: { cluster: boolean; tagOf: (item: T) => string; max: number }): T[][] {
  const groups = new Map<number, T[]>();
  for (const item of items) {
    const n = o.cluster ? hashSlot(o.tagOf(item)) : 0;
    let list = groups.get(n);
    if (!list) groups.set(n, (list = []));
    list.push(item);
  }
  const calls: T[][] = [];
  for (const list of groups.values()) for (let i = 0; i < list.length; i += o.max) calls.push(list.slice(i, i + o.max));
  return calls;
}

/**
 * News of ledgers whose spend slices must end, from whichever instance found it (DESIGN
 * section 6, "Money"), and of buckets whose slices must. settle.lua publishes a ledger
 * hash's key on LEDGER_NEWS_CHANNEL when a cost past its hold leaves that ledger's holds
 * and slices no longer backed (a budget spent by settled usage refuses the next request at
 * once); hold.lua publishes it when a hold there fits but for the slices recorded (live
 * spend counts requests in flight, not what an idle instance kept for later); lease.lua
 * publishes a key's bucket when a request there is refused only for what other instances'
 * slices of it hold. Every instance listens, and ends its own slice of that holder or
 * bucket, giving back what is left at once. Without the news another instance would go on
 * using its slice until its own settlement's answer or the slice's time told it.
 *
 * Pub/sub is at most once: a message lost while the listener reconnects, or never sent
 * or heard because the Redis user's ACL allows no channels, leaves the slower paths above,
 * which were always there.
 */
import type { Cluster, Redis } from 'ioredis';
import { disconnectRedisClient } from './client.js';

/**
 * One channel for every prefix: a message names a ledger hash or a key's bucket, which only
 * its own instances hold slices of.
 */
export const LEDGER_NEWS_CHANNEL = 'keyward:ledger-over';

/**
 * Waits before asking again after a refusal that other instances' slices caused (the script
 * told them to give theirs back): the news reaches them in about a millisecond, and their
 * give-back leaves at once. A request still refused after the last is refused.
 */
export const SLICE_RETRY_MS: readonly number[] = [5, 15, 40];

export interface LedgerNews {
  /** resolves once the subscription is in place (news published before then is not heard) */
  readonly listening: Promise<void>;
  close(): void;
}

export interface ListenOptions {
  /** after each SUBSCRIBE keyward sends: null when it took, else why not */
  subscribed?: (err: Error | null) => void;
}

/**
 * Listens on a connection of its own (a subscribed connection can send nothing else).
 * A single node's connection subscribes again on each `ready` itself, with the refusal
 * handled, instead of through ioredis' `autoResubscribe`: that one leaves the promise of
 * its SUBSCRIBE unhandled, so a connection closed before the reply, or a user whose ACL
 * lost the channel (Redis drops such a subscriber, and refuses it again with NOPERM),
 * would end the process with an unhandled rejection. A cluster's subscriber connection
 * subscribes again itself and handles its refusals.
 */
export function listenForLedgerNews(client: Redis | Cluster, heard: (ledgerKey: string) => void, opts: ListenOptions = {}): LedgerNews {
  // Unlike the limiter's calls, the subscription waits for its connection.
  const sub: Redis | Cluster = client.isCluster
    ? (client as Cluster).duplicate(undefined, { enableOfflineQueue: true })
    : (client as Redis).duplicate({ enableOfflineQueue: true, autoResubscribe: false });
  // The main connection reports Redis failures; this one only reconnects and subscribes again.
  sub.on('error', () => {});
  sub.on('message', (channel: string, message: string) => {
    if (channel === LEDGER_NEWS_CHANNEL) heard(message);
  });
  const subscribe = (): Promise<void> =>
    sub.subscribe(LEDGER_NEWS_CHANNEL).then(
      () => opts.subscribed?.(null),
      (err: Error) => opts.subscribed?.(err),
    );
  let closed = (): void => {};
  const listening = client.isCluster
    ? subscribe()
    : new Promise<void>((resolve) => {
        closed = resolve;
        sub.on('ready', () => void subscribe().then(resolve));
      });
  return {
    listening,
    close() {
      disconnectRedisClient(sub);
      closed();
    },
  };
}

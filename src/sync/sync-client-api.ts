/**
 * What the sync client takes and tells (client.ts runs it): its options, its status as
 * metrics and readiness read it, and its handle.
 */
import type { BackoffOptions } from './backoff.js';
import type { ReplicaWriter } from '../protocol/writer.js';
import type { LogSink } from '../log.js';

export interface SyncClientOptions {
  /** console base URL, e.g. http://127.0.0.1:7000 */
  url: string;
  token: string;
  /** long-poll wait the console is asked for (0..60000) */
  waitMs: number;
  /** where snapshots and batches go; the composition root hands in the replica's sync target */
  target: ReplicaWriter;
  log?: LogSink;
  now?: () => number;
  fetch?: typeof fetch;
  backoff?: BackoffOptions;
  /** a snapshot that sends no byte for this long is abandoned (and retried) */
  idleTimeoutMs?: number;
  /** called when the console answers after it was away (and at the first success) */
  onConnected?: () => void;
}

export interface SyncStatus {
  /** replica version (null before the first snapshot or import) */
  version: number | null;
  /** when the console last answered successfully (ms since epoch), empty long polls included */
  lastSyncAt: number | null;
  /**
   * Up to when the replica is known to hold what the console holds: now while a connected
   * console holds a long poll open (it answers at once with any change), no longer than
   * waitMs and a margin past its start; else lastSyncAt.
   */
  currentAsOf: number | null;
  lastError: string | null;
  /** the last exchange with the console succeeded */
  connected: boolean;
  /** consecutive failures since the last success */
  failures: number;
  snapshots: number;
  lastSnapshot: { version: number; keys: number; totalMs: number } | null;
}

export interface SyncClient {
  /** Starts syncing; resolves after the first successful sync, or when stopped first. Never rejects. */
  start(): Promise<void>;
  /** Ends the loop, abandoning a long poll or a snapshot in progress (the replica keeps its last good state). */
  stop(): Promise<void>;
  status(): SyncStatus;
  /** Ends a long poll under way and takes a snapshot next: the replica lost its data (a damaged file set aside). */
  snapshotNow(): void;
}

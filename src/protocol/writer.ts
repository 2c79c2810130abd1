/**
 * What the sync client (and `keyward import`) writes to: the replica, seen only through
 * this interface, so sync and replica share the protocol and never import each other.
 * Applying is the replica's business (threads, transactions); the client only reads the
 * console and hands the bytes over.
 */

export interface SnapshotApplied {
  version: number;
  keys: number;
  projects: number;
  wallets: number;
  /** price records (optional so writers that predate prices still fit the interface) */
  prices?: number;
  /** time from the first byte handed over to the commit */
  totalMs: number;
  /** applied on a worker thread (optional, as prices) */
  offThread?: boolean;
}

export interface ChangesApplied {
  version: number;
  changes: number;
  /** false when the batch was not newer than the replica */
  applied: boolean;
  offThread: boolean;
}

export interface ReplicaWriter {
  /** the replica's version, null before the first snapshot or import */
  version(): number | null;
  /**
   * The console history that version belongs to, as the last snapshot or batch named it;
   * null when the console named none. Optional: writers that keep no tag still fit.
   */
  tag?(): string | null;
  /** the replica cannot take change batches as it is now, only a whole snapshot (optional) */
  needsSnapshot?(): boolean;
  /** applies a whole snapshot atomically; a bad one is rejected whole and the old data stays */
  applySnapshot(opts: { body: AsyncIterable<Uint8Array>; signal?: AbortSignal; source: string }): Promise<SnapshotApplied>;
  /** applies one `/changes` answer, given as received; throws InvalidBatchError when it can never apply */
  applyChangeText(text: string, source: string): Promise<ChangesApplied>;
}

/**
 * What the console sent cannot be applied as sent (bad JSON, a bad record, a broken
 * constraint): asking again at once would get the same, so the client waits longer.
 */
export class UnusableDataError extends Error {}

/** A change batch that can never be applied as sent: the client takes a snapshot instead. */
export class InvalidBatchError extends UnusableDataError {
  constructor(message: string) {
    super(message);
    this.name = 'InvalidBatchError';
  }
}

/**
 * The replica as a sync client writes to it. The sync client knows the protocol and the
 * console; this side knows threads and transactions. Large snapshots and large change
 * batches are applied off the event loop (snapshot-apply.ts), small ones here.
 */
import { parseChangeBatch } from '../sync/protocol.js';
import { applyChangeTextOffThread, applySnapshotStream, ChangeBatchError, type SnapshotApplied } from './snapshot-apply.js';
import type { ReplicaStore } from './store.js';

/** A change batch larger than this is parsed and applied on a worker thread. */
const OFF_THREAD_CHARS = 96 * 1024;

/** A batch that can never be applied as sent (bad JSON, bad record, broken constraint): take a snapshot. */
export class InvalidBatchError extends Error {
  readonly invalidBatch = true;
}

export interface ReplicaSyncTarget {
  version(): number | null;
  applySnapshot(opts: { body: AsyncIterable<Uint8Array>; signal?: AbortSignal; source: string }): Promise<SnapshotApplied>;
  applyChangeText(text: string, source: string): Promise<{ version: number; changes: number; applied: boolean; offThread: boolean }>;
}

export function replicaSyncTarget(replica: ReplicaStore): ReplicaSyncTarget {
  return {
    version: () => replica.status().version,
    applySnapshot: ({ body, signal, source }) => applySnapshotStream({ replica, body, source, transferChunks: true, ...(signal ? { signal } : {}) }),
    async applyChangeText(text, source) {
      if (text.length > OFF_THREAD_CHARS && !replica.db.memory) {
        try {
          return { ...(await applyChangeTextOffThread({ replica, text, source })), offThread: true };
        } catch (err) {
          throw err instanceof ChangeBatchError ? new InvalidBatchError(err.message) : err;
        }
      }
      let value: unknown;
      try {
        value = JSON.parse(text);
      } catch {
        throw new InvalidBatchError('the change batch is not JSON');
      }
      const parsed = parseChangeBatch(value);
      if (!parsed.ok) throw new InvalidBatchError(`invalid change batch: ${parsed.error}`);
      const batch = parsed.value;
      try {
        const applied = replica.applyChanges(batch, source);
        return { version: batch.version, changes: batch.changes.length, applied, offThread: false };
      } catch (err) {
        throw new InvalidBatchError(`change batch ${batch.version} not applied: ${(err as Error).message}`);
      }
    },
  };
}

/**
 * The replica as a ReplicaWriter (the protocol's interface): what the sync client and
 * `keyward import` write through. This side knows threads and transactions: large
 * snapshots and large change batches are applied off the event loop (snapshot-apply.ts),
 * small ones here.
 */
import { parseChangeBatch } from '../protocol/records.js';
import { InvalidBatchError, type ReplicaWriter } from '../protocol/writer.js';
import { applyChangeTextOffThread, applySnapshotStream, foldSoon } from './snapshot-apply.js';
import { isBusy, isDamage } from './replica-file.js';
import type { ReplicaStore } from './store.js';

/** A change batch larger than this is parsed and applied on a worker thread. */
const OFF_THREAD_CHARS = 96 * 1024;
/** ...and one with more changes than this: thousands of short deletes fit in fewer characters and take longer than 50 ms. */
const OFF_THREAD_CHANGES = 200;

export function replicaWriter(replica: ReplicaStore): ReplicaWriter {
  return {
    version: () => replica.status().version,
    tag: () => replica.status().tag,
    // The file open was deleted or replaced: only a whole snapshot, written to the path, puts it right.
    needsSnapshot: () => replica.detached(),
    async applySnapshot({ body, signal, source }) {
      try {
        return await applySnapshotStream({ replica, body, source, transferChunks: true, ...(signal ? { signal } : {}) });
      } catch (err) {
        // Damaged pages fail every snapshot the same way: the next one goes to a new file.
        if (isDamage(err)) replica.quarantine();
        throw err;
      }
    },
    async applyChangeText(text, source) {
      // Worker threads open the path, which no longer names the file served: apply here.
      const offThread = !replica.db.memory && !replica.detached();
      if (text.length > OFF_THREAD_CHARS && offThread) {
        return { ...(await applyChangeTextOffThread({ replica, text, source })), offThread: true };
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
      if (batch.changes.length > OFF_THREAD_CHANGES && offThread) {
        return { ...(await applyChangeTextOffThread({ replica, text, source })), offThread: true };
      }
      try {
        const applied = replica.applyChanges(batch, source);
        void foldSoon(replica);
        return { version: batch.version, changes: batch.changes.length, applied, offThread: false };
      } catch (err) {
        // Another connection holds the lock: a worker waits for it, not the event loop; and
        // the batch is not bad data (no snapshot, no long backoff) when it cannot.
        if (!isBusy(err)) throw new InvalidBatchError(`change batch ${batch.version} not applied: ${(err as Error).message}`);
        if (offThread) return { ...(await applyChangeTextOffThread({ replica, text, source })), offThread: true };
        throw new Error(`change batch ${batch.version} not applied: the replica file is locked by another connection`, { cause: err });
      }
    },
  };
}

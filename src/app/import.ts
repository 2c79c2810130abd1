/**
 * `keyward import FILE`: a snapshot file applied through the same ReplicaWriter the sync
 * client writes through, so a file and a console snapshot are read by one reader and
 * committed by one path (large files on the worker thread). Composition, like server.ts:
 * the command line never opens the replica itself.
 */
import { createReadStream } from 'node:fs';
import type { SnapshotApplied } from '../protocol/writer.js';
import { ReplicaStore } from '../replica/store.js';
import { replicaWriter } from '../replica/writer.js';

export { SnapshotApplyError as ImportError } from '../replica/snapshot-apply.js';

export async function importSnapshotFile(opts: { replicaPath: string; file: string }): Promise<SnapshotApplied> {
  const replica = new ReplicaStore({ path: opts.replicaPath });
  try {
    return await replicaWriter(replica).applySnapshot({ body: createReadStream(opts.file), source: `import:${opts.file}` });
  } finally {
    replica.close();
  }
}

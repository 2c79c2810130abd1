/**
 * `keyward import FILE`: a snapshot file applied through the same ReplicaWriter the sync
 * client writes through, so a file and a console snapshot are read by one reader and
 * committed by one path (large files on the worker thread). Composition, like server.ts:
 * the command line never opens the replica itself.
 */
import { createReadStream, existsSync, rmSync } from 'node:fs';
import type { SnapshotApplied } from '../protocol/writer.js';
import { ReplicaStore } from '../replica/store.js';
import { replicaWriter } from '../replica/writer.js';
import { isDamage } from '../replica/replica-file.js';
import { SnapshotApplyError as ImportError } from '../replica/snapshot-apply.js';

export { ImportError };

/** Applies the file; a replica the import created is removed again when the file is refused. */
export async function importSnapshotFile(opts: { replicaPath: string; file: string }): Promise<SnapshotApplied> {
  const created = !existsSync(opts.replicaPath);
  const replica = new ReplicaStore({ path: opts.replicaPath });
  let applied = false;
  try {
    const result = await replicaWriter(replica).applySnapshot({ body: createReadStream(opts.file), source: `import:${opts.file}` });
    applied = true;
    return result;
  } catch (err) {
    // Left where it is (only the syncing sidecar moves a damaged file): say what to do with it.
    if (isDamage(err)) throw new ImportError(`the replica file ${opts.replicaPath} is damaged (${(err as Error).message}): move it and its -wal and -shm files away, then import again`);
    throw err;
  } finally {
    await replica.close();
    // An empty replica left behind would look like one to serve from, to a later `serve`.
    if (created && !applied) for (const p of [opts.replicaPath, `${opts.replicaPath}-wal`, `${opts.replicaPath}-shm`]) rmSync(p, { force: true });
  }
}

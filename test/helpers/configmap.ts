/**
 * A directory laid out and updated as the kubelet lays out and updates a ConfigMap volume
 * (its AtomicWriter): each revision's files in a `..<timestamp>` directory, `..data` a
 * symlink to the revision in force, and each key a symlink through it
 * (`keyward.yaml -> ..data/keyward.yaml`). An update writes the new revision beside the old,
 * points a `..data_tmp` symlink at it, renames that over `..data` (the one atomic step) and
 * removes the old revision. Nothing is ever written to the key's own name.
 */
import { mkdirSync, renameSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

export class ConfigMapVolume {
  /** the path a container reads: `<dir>/<key>` */
  readonly file: string;
  private revision: string | null = null;
  private count = 0;

  constructor(
    readonly dir: string,
    private readonly key = 'keyward.yaml',
  ) {
    mkdirSync(dir, { recursive: true });
    this.file = join(dir, key);
  }

  /** Publishes `text` as the key's new content, as the kubelet does after `kubectl apply`. */
  publish(text: string): void {
    const revision = `..${new Date().toISOString().replace(/[-:.]/g, '_')}.${++this.count}`;
    mkdirSync(join(this.dir, revision), { mode: 0o755 });
    writeFileSync(join(this.dir, revision, this.key), text);
    symlinkSync(revision, join(this.dir, '..data_tmp'));
    renameSync(join(this.dir, '..data_tmp'), join(this.dir, '..data'));
    if (this.revision === null) symlinkSync(join('..data', this.key), this.file);
    else rmSync(join(this.dir, this.revision), { recursive: true, force: true });
    this.revision = revision;
  }
}

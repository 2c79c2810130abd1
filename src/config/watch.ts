/**
 * Notices when the config file's content changes on disk (DESIGN section 12): a write in
 * place, a new file renamed over it, or a symlink swap such as a Kubernetes ConfigMap
 * volume makes (`keyward.yaml -> ..data/keyward.yaml`, where `..data` is a symlink swapped
 * for one to a new `..<timestamp>` directory). A watch on the file itself would follow the
 * old inode and miss the last two, so the directories are watched: the file's own, the one
 * its symlinks resolve to when that is elsewhere, and the parent of every directory on its
 * path that is a symlink (`conf/current/keyward.yaml` with `current` swapped for a link to
 * a new release: the swap changes only `conf`). Events come in bursts and name
 * whatever entry changed (`..data`, a temporary file), so each burst ends in one read of
 * the file through its symlinks, and only a content hash that differs from the last one
 * seen is reported.
 */
import { lstatSync, watch, readFileSync, realpathSync, type FSWatcher } from 'node:fs';
import { dirname, resolve } from 'node:path';
import type { LogSink } from '../log.js';
import { configHash } from './file.js';

/** A burst is over after this long without an event... */
const QUIET_MS = 100;
/** ...or this long after it began, however busy the directory is. */
const LONGEST_BURST_MS = 500;

export interface ConfigWatchOptions {
  file: string;
  /** the hash of the content in force when the watch starts */
  hash: string;
  /** the content differs from the last content seen */
  onChange: () => void;
  log: LogSink;
}

/** The parent of each directory on `file`'s path that is a symlink: where swapping that link shows. */
function symlinkParents(file: string): string[] {
  const out: string[] = [];
  for (let dir = dirname(file); dir !== dirname(dir); dir = dirname(dir)) {
    try {
      if (lstatSync(dir).isSymbolicLink()) out.push(dirname(dir));
    } catch {
      // gone for now: the next burst looks again
    }
  }
  return out;
}

export class ConfigWatch {
  private readonly file: string;
  private readonly watchers = new Map<string, FSWatcher>();
  private lastSeen: string;
  private quiet: NodeJS.Timeout | null = null;
  private longest: NodeJS.Timeout | null = null;
  private closed = false;

  constructor(private readonly o: ConfigWatchOptions) {
    this.file = resolve(o.file);
    this.lastSeen = o.hash;
    this.arm();
  }

  /** Watches the directories the file lives in now; a symlink swap can move the second. */
  private arm(): void {
    const wanted = new Set([dirname(this.file), ...symlinkParents(this.file)]);
    try {
      wanted.add(dirname(realpathSync(this.file)));
    } catch {
      // unreadable for now: the next event reads it again
    }
    for (const [dir, w] of this.watchers) {
      if (wanted.has(dir)) continue;
      w.close();
      this.watchers.delete(dir);
    }
    for (const dir of wanted) if (!this.watchers.has(dir)) this.watchDir(dir);
  }

  private watchDir(dir: string): void {
    try {
      // not persistent: the watch never keeps the process alive
      const w = watch(dir, { persistent: false }, () => this.event());
      // The directory went away (an old ConfigMap revision): the next burst re-arms.
      w.on('error', () => {
        w.close();
        if (this.watchers.get(dir) === w) this.watchers.delete(dir);
      });
      this.watchers.set(dir, w);
    } catch (err) {
      if (dir === dirname(this.file)) this.o.log.warn({ dir, err: (err as Error).message }, 'cannot watch the config directory; reload with SIGHUP');
    }
  }

  private event(): void {
    if (this.closed) return;
    if (this.quiet) clearTimeout(this.quiet);
    this.quiet = setTimeout(() => this.burstOver(), QUIET_MS);
    this.longest ??= setTimeout(() => this.burstOver(), LONGEST_BURST_MS);
  }

  private burstOver(): void {
    if (this.quiet) clearTimeout(this.quiet);
    if (this.longest) clearTimeout(this.longest);
    this.quiet = this.longest = null;
    if (this.closed) return;
    this.arm();
    const hash = this.currentHash();
    if (hash === this.lastSeen) return;
    this.lastSeen = hash;
    this.o.onChange();
  }

  /** The content's hash, or what made it unreadable (so a file that comes back is a change). */
  private currentHash(): string {
    try {
      return configHash(readFileSync(this.file));
    } catch (err) {
      return `unreadable: ${(err as NodeJS.ErrnoException).code ?? ''}`;
    }
  }

  close(): void {
    this.closed = true;
    if (this.quiet) clearTimeout(this.quiet);
    if (this.longest) clearTimeout(this.longest);
    for (const w of this.watchers.values()) w.close();
    this.watchers.clear();
  }
}

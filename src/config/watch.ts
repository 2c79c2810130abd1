/**
 * Notices when the config file's content changes on disk (DESIGN section 12): a write in
 * place, a new file renamed over it, or a symlink swap such as a Kubernetes ConfigMap
 * volume makes (`keyward.yaml -> ..data/keyward.yaml`, where `..data` is a symlink swapped
 * for one to a new `..<timestamp>` directory). A watch on the file itself would follow the
 * old inode and miss the last two, so the directories are watched: the file's own, the one
 * its symlinks resolve to when that is elsewhere, and the directory of every symlink met on
 * the way there (`conf/current/keyward.yaml` with `current` swapped for a link to a new
 * release: the swap changes only `conf`; a link a link points to, likewise). A watch
 * follows the directory it was set on, so one whose path names another directory by now
 * (`mv conf.new conf`) is set again at the end of the burst that move starts; while nothing
 * stands at the file's own directory (between two renames), it is tried every second. Events come
 * in bursts and name whatever entry changed (`..data`, a temporary file), so each burst
 * ends in one read of the file through its symlinks, and only a content hash that differs
 * from the last one seen is reported.
 */
import { lstatSync, statSync, watch, readFileSync, readlinkSync, realpathSync, type FSWatcher } from 'node:fs';
import { dirname, isAbsolute, join, resolve } from 'node:path';
import type { LogSink } from '../log.js';
import { configHash } from './file.js';

/** A burst is over after this long without an event... */
const QUIET_MS = 100;
/** ...or this long after it began, however busy the directory is. */
const LONGEST_BURST_MS = 500;
/** How often a config directory that cannot be watched (gone between two renames) is tried again. */
const RETRY_MS = 1000;

export interface ConfigWatchOptions {
  file: string;
  /** the hash of the content in force when the watch starts */
  hash: string;
  /** the content differs from the last content seen */
  onChange: () => void;
  log: LogSink;
  /** how often an unwatchable config directory is tried again (RETRY_MS) */
  retryMs?: number;
}

/** Most symlinks followed in one resolution, as the kernel's own limit (ELOOP). */
const MAX_LINKS = 40;

/**
 * The directory of every symlink met while resolving `file` (an absolute path), one link
 * at a time: swapping any of them, a directory on the path or a link a link points to,
 * shows only there.
 */
function linkParents(file: string): string[] {
  const out: string[] = [];
  let pending = file.split('/');
  let current = '/';
  for (let links = 0; pending.length > 0; ) {
    const part = pending.shift()!;
    if (part === '' || part === '.') continue;
    if (part === '..') {
      current = dirname(current);
      continue;
    }
    const next = join(current, part);
    try {
      if (!lstatSync(next).isSymbolicLink()) {
        current = next;
        continue;
      }
      if (++links > MAX_LINKS) return out;
      out.push(current);
      const target = readlinkSync(next);
      if (isAbsolute(target)) current = '/';
      pending = [...target.split('/'), ...pending];
    } catch {
      return out; // gone for now: the next burst looks again
    }
  }
  return out;
}

/**
 * Which directory a path names now (device and inode, through symlinks), or null when it
 * names none. A watch follows the directory it was set on, not the path: once another
 * directory is renamed into its place, the watch must be set again.
 */
function identity(dir: string): string | null {
  try {
    const s = statSync(dir);
    return `${s.dev}:${s.ino}`;
  } catch {
    return null;
  }
}

interface DirWatch {
  watcher: FSWatcher;
  /** the directory the watch was set on (identity above) */
  identity: string | null;
}

export class ConfigWatch {
  private readonly file: string;
  private readonly watchers = new Map<string, DirWatch>();
  private lastSeen: string;
  private quiet: NodeJS.Timeout | null = null;
  private longest: NodeJS.Timeout | null = null;
  /** set while the file's own directory cannot be watched */
  private retry: NodeJS.Timeout | null = null;
  /** the loss of the own directory's watch has been warned of */
  private lost = false;
  private closed = false;

  constructor(private readonly o: ConfigWatchOptions) {
    this.file = resolve(o.file);
    this.lastSeen = o.hash;
    this.arm();
    // Changed since it was read (while the process started): read once more, as after a burst.
    if (this.currentHash() !== this.lastSeen) this.event();
  }

  /** Watches the directories the file lives in now; a symlink swap can move the second. */
  private arm(): void {
    const wanted = new Set([dirname(this.file), ...linkParents(this.file)]);
    try {
      wanted.add(dirname(realpathSync(this.file)));
    } catch {
      // unreadable for now: the next event reads it again
    }
    for (const [dir, w] of this.watchers) {
      // Kept only while the path still names the directory watched (`mv conf.new conf` replaces it).
      if (wanted.has(dir) && w.identity === identity(dir)) continue;
      w.watcher.close();
      this.watchers.delete(dir);
    }
    for (const dir of wanted) if (!this.watchers.has(dir)) this.watchDir(dir);
    if (!this.watchers.has(dirname(this.file))) this.retryLater();
  }

  /**
   * Without a watch on its own directory the file's changes would go unseen until SIGHUP,
   * so the directory is tried again until it can be watched; what changed meanwhile is
   * read then, as after a burst.
   */
  private retryLater(): void {
    if (this.retry !== null || this.closed) return;
    this.retry = setTimeout(() => {
      this.retry = null;
      if (this.closed) return;
      const dir = dirname(this.file);
      this.arm();
      if (!this.watchers.has(dir)) return;
      this.lost = false;
      this.o.log.info({ dir }, 'config directory watched again');
      this.burstOver();
    }, this.o.retryMs ?? RETRY_MS);
    this.retry.unref();
  }

  private watchDir(dir: string): void {
    try {
      const id = identity(dir);
      // not persistent: the watch never keeps the process alive
      const w = watch(dir, { persistent: false }, () => this.event());
      // The directory went away (an old ConfigMap revision): a burst re-arms, and tries again later when nothing stands there yet.
      w.on('error', () => {
        w.close();
        if (this.watchers.get(dir)?.watcher === w) this.watchers.delete(dir);
        this.event();
      });
      this.watchers.set(dir, { watcher: w, identity: id });
    } catch (err) {
      // Warned once a loss: retryLater tries again every second meanwhile.
      if (dir !== dirname(this.file) || this.lost) return;
      this.lost = true;
      this.o.log.warn({ dir, err: (err as Error).message }, 'cannot watch the config directory; trying again every second (SIGHUP reloads meanwhile)');
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
    if (this.retry) clearTimeout(this.retry);
    for (const w of this.watchers.values()) w.watcher.close();
    this.watchers.clear();
  }
}

/**
 * What a reload may change (DESIGN section 12). Settings that need new listeners or
 * stores keep their running values until a restart; a reload names each one it finds
 * changed. Pure: two configs in, the config to put in force and those names out.
 */
import type { Config } from './schema.js';

/** Settings a reload does not take up: a path names every key under it. */
export const RESTART_ONLY: readonly string[] = ['server.host', 'server.port', 'admin', 'replica', 'redis', 'console', 'keys'];

export interface ReloadPlan {
  /** `next` with every restart-only setting at its running value: what to put in force */
  config: Config;
  /** the restart-only settings `next` changes: each key that differs, or a whole block added or removed */
  needsRestart: string[];
}

type Tree = Record<string, unknown>;

const isTree = (v: unknown): v is Tree => typeof v === 'object' && v !== null && !Array.isArray(v);

function valueAt(root: unknown, path: readonly string[]): unknown {
  let v = root;
  for (const part of path) v = isTree(v) ? v[part] : undefined;
  return v;
}

/** A copy of `root` with `value` at `path` (the objects along the path are copied, the rest shared). */
function withValueAt(root: Tree, path: readonly string[], value: unknown): Tree {
  const [head, ...rest] = path as [string, ...string[]];
  const out: Tree = { ...root };
  if (rest.length === 0) {
    if (value === undefined) delete out[head];
    else out[head] = value;
  } else {
    out[head] = withValueAt(isTree(root[head]) ? root[head] : {}, rest, value);
  }
  return out;
}

/** Dotted paths under `path` where `a` and `b` differ; a block on one side only is named whole. */
function differences(a: unknown, b: unknown, path: string): string[] {
  if (isTree(a) && isTree(b)) {
    const keys = [...new Set([...Object.keys(a), ...Object.keys(b)])].sort();
    return keys.flatMap((k) => differences(a[k], b[k], `${path}.${k}`));
  }
  return JSON.stringify(a) === JSON.stringify(b) ? [] : [path];
}

export function planReload(running: Config, next: Config): ReloadPlan {
  let config = next as unknown as Tree;
  const needsRestart: string[] = [];
  for (const dotted of RESTART_ONLY) {
    const path = dotted.split('.');
    const kept = valueAt(running, path);
    needsRestart.push(...differences(kept, valueAt(next, path), dotted));
    config = withValueAt(config, path, kept);
  }
  return { config: config as unknown as Config, needsRestart };
}

/** Every setting that differs between two configs, by dotted path (for the log: names, never values). */
export function changedSettings(a: Config, b: Config): string[] {
  const x = a as unknown as Tree;
  const y = b as unknown as Tree;
  const keys = [...new Set([...Object.keys(x), ...Object.keys(y)])].sort();
  return keys.flatMap((k) => differences(x[k], y[k], k));
}

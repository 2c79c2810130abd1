/**
 * The one loader of the Lua scripts in lua/. A script may paste a shared prelude with a
 * line `-- #include <file>.lua` (bucket.lua: the token-bucket, slice and admission rules).
 * Each script is defined once per client as a command: ioredis sends EVALSHA and falls back
 * to EVAL on NOSCRIPT (e.g. after a Redis restart).
 */
import { readFileSync } from 'node:fs';
import type { Cluster, Redis } from 'ioredis';

export const SCRIPTS = {
  keywardAdmit: 'admit.lua',
  keywardLease: 'lease.lua',
  keywardSettle: 'settle.lua',
  keywardRefresh: 'refresh.lua',
  keywardPeek: 'peek.lua',
  keywardHold: 'hold.lua',
  keywardLedger: 'ledger.lua',
} as const;
export type ScriptName = keyof typeof SCRIPTS;
export type RunScript = (name: ScriptName, keys: string[], args: (string | number)[]) => Promise<unknown>;
type ScriptFn = (numKeys: number, ...args: (string | number)[]) => Promise<unknown>;

const read = (file: string): string => readFileSync(new URL(`./lua/${file}`, import.meta.url), 'utf8');

/** A script's source with its includes pasted in. */
export function scriptSource(file: string): string {
  return read(file).replace(/^-- #include (\S+\.lua)$/gm, (_, inc: string) => read(inc));
}

let sources: Record<ScriptName, string> | null = null;
const defined = new WeakSet<object>();

/** Defines every script on the client (once) and returns a runner. */
export function scriptRunner(client: Redis | Cluster): RunScript {
  sources ??= Object.fromEntries(Object.entries(SCRIPTS).map(([name, file]) => [name, scriptSource(file)])) as Record<ScriptName, string>;
  if (!defined.has(client)) {
    for (const name of Object.keys(SCRIPTS) as ScriptName[]) client.defineCommand(name, { lua: sources[name] });
    defined.add(client);
  }
  const fns = client as unknown as Record<ScriptName, ScriptFn>;
  const coalesce = coalescerOf(client);
  return (name, keys, args) => {
    coalesce();
    return fns[name].call(client, keys.length, ...keys, ...args);
  };
}

type Corkable = { cork(): void; uncork(): void };
/** One per client: every limiter on a connection corks it once per turn. */
const coalescers = new WeakMap<object, () => void>();
const coalescerOf = (client: Redis | Cluster): (() => void) => {
  let c = coalescers.get(client);
  if (!c) coalescers.set(client, (c = coalescer(client)));
  return c;
};

/**
 * The calls of one event-loop turn leave in one write: the first corks the connection's
 * socket (every master's on a Cluster) and the socket is uncorked once the turn's I/O
 * callbacks have run (setImmediate), so many admissions share one syscall. This is what
 * ioredis' enableAutoPipelining is for, without its Pipeline object per turn and its
 * extra promise per command, which cost more client CPU than the syscalls they save.
 * Order on the connection is unchanged.
 */
function coalescer(client: Redis | Cluster): () => void {
  let corked: Corkable[] | null = null;
  const uncork = (): void => {
    const streams = corked!;
    corked = null;
    for (const s of streams) s.uncork();
  };
  // A Cluster's connections change with failovers and resharding: asked for at each turn.
  const streams = (): Corkable[] =>
    (client.isCluster ? (client as Cluster).nodes('master') : [client as Redis]).flatMap((n) => (n.stream ? [n.stream as Corkable] : []));
  return () => {
    if (corked) return;
    corked = streams();
    for (const s of corked) s.cork();
    setImmediate(uncork);
  };
}

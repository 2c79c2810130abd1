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
  const turn = turnOf(client);
  return (name, keys, args) => {
    turn.cork();
    return fns[name].call(client, keys.length, ...keys, ...args);
  };
}

/**
 * Runs `fn` at the end of this event-loop turn, before the turn's calls are written: what
 * it sends (a batch of what the turn's requests asked for) leaves in the same write.
 */
export function atTurnEnd(client: Redis | Cluster, fn: () => void): void {
  turnOf(client).atEnd(fn);
}

type Corkable = { cork(): void; uncork(): void };
interface Turn {
  cork(): void;
  atEnd(fn: () => void): void;
}
/** One per client: every limiter on a connection shares its turn. */
const turns = new WeakMap<object, Turn>();
const turnOf = (client: Redis | Cluster): Turn => {
  let t = turns.get(client);
  if (!t) turns.set(client, (t = coalescer(client)));
  return t;
};

/**
 * The calls of one event-loop turn leave in one write: the first corks the connection's
 * socket (every master's on a Cluster) and the socket is uncorked once the turn's I/O
 * callbacks have run (setImmediate), so many admissions share one syscall. This is what
 * ioredis' enableAutoPipelining is for, without its Pipeline object per turn and its
 * extra promise per command, which cost more client CPU than the syscalls they save.
 * Order on the connection is unchanged.
 */
function coalescer(client: Redis | Cluster): Turn {
  let corked: Corkable[] | null = null;
  let due: (() => void)[] = [];
  let scheduled = false;
  // A Cluster's connections change with failovers and resharding: asked for at each turn.
  const streams = (): Corkable[] =>
    (client.isCluster ? (client as Cluster).nodes('master') : [client as Redis]).flatMap((n) => (n.stream ? [n.stream as Corkable] : []));
  const end = (): void => {
    try {
      // Still `scheduled`: what these send joins this turn's write instead of the next.
      while (due.length > 0) {
        const fns = due;
        due = [];
        for (const fn of fns) fn();
      }
    } finally {
      scheduled = false;
      const s = corked;
      corked = null;
      if (s) for (const x of s) x.uncork();
    }
  };
  const schedule = (): void => {
    if (scheduled) return;
    scheduled = true;
    setImmediate(end);
  };
  return {
    cork() {
      if (corked) return;
      corked = streams();
      for (const x of corked) x.cork();
      schedule();
    },
    atEnd(fn) {
      due.push(fn);
      schedule();
    },
  };
}

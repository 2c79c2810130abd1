/**
 * The one loader of the Lua scripts in lua/. A script may paste a shared prelude with a
 * line `-- #include <file>.lua` (bucket.lua: the token-bucket, slice and admission rules).
 *
 * Each script is sent as an ioredis custom command (`defineCommand`): EVAL on a connection
 * that has not had it yet, EVALSHA after that, and again after a NOSCRIPT. Sending EVAL
 * first keeps the calls of one connection in the order they were made, which the
 * settlement batch relies on (a NOSCRIPT answered and resent later would let the next
 * admission overtake a settlement).
 *
 * Each call is written when it is made (no `enableAutoPipelining`, client.ts). What many
 * requests ask for together is already one call: a turn's holds per hash slot
 * (`atTurnEnd`), a tick's settlements per slot (settle-batch.ts).
 */
import { readFileSync } from 'node:fs';
import type { Cluster, Redis } from 'ioredis';
import type { LeaseTerm } from '../lease-term.js';
import type { Deadlines } from './deadlines.js';

export const SCRIPTS = {
  keywardAdmit: 'admit.lua',
  keywardLease: 'lease.lua',
  keywardSettle: 'settle.lua',
  keywardRefresh: 'refresh.lua',
  keywardPeek: 'peek.lua',
  keywardHold: 'hold.lua',
  keywardLedger: 'ledger.lua',
  keywardClaim: 'claim.lua',
} as const;
export type ScriptName = keyof typeof SCRIPTS;
/**
 * Runs a script. `late`: the answer of a call its deadline already failed (an admission or a
 * hold Redis granted in time whose reply came back too late), so the caller can undo it.
 */
export type RunScript = (name: ScriptName, keys: string[], args: (string | number)[], late?: (answer: unknown) => void) => Promise<unknown>;

const read = (file: string): string => readFileSync(new URL(`./lua/${file}`, import.meta.url), 'utf8');

/** A script's source with its includes pasted in. */
export function scriptSource(file: string): string {
  return read(file).replace(/^-- #include (\S+\.lua)$/gm, (_, inc: string) => read(inc));
}

/** Sources, read once per process. */
let sources: Record<ScriptName, string> | null = null;

type Commands = Record<ScriptName, (numberOfKeys: number, ...keysAndArgs: (string | number)[]) => Promise<unknown>>;

/** A runner of the scripts on `client`, defining them on it the first time; `deadlines` bound each call. */
export function scriptRunner(client: Redis | Cluster, deadlines?: Deadlines): RunScript {
  sources ??= Object.fromEntries(Object.entries(SCRIPTS).map(([name, file]) => [name, scriptSource(file)])) as Record<ScriptName, string>;
  const commands = client as unknown as Commands;
  for (const name of Object.keys(SCRIPTS) as ScriptName[]) {
    if (typeof commands[name] !== 'function') client.defineCommand(name, { lua: sources[name] });
  }
  if (deadlines) return (name, keys, args, late) => deadlines.bound(commands[name](keys.length, ...keys, ...args), late);
  return (name, keys, args) => commands[name](keys.length, ...keys, ...args);
}

/** What is due at the end of the current event-loop turn, per client. */
const due = new WeakMap<object, (() => void)[]>();

/**
 * Runs `fn` at the end of this event-loop turn, once the turn's I/O callbacks have run:
 * what it sends is one call for what all of the turn's requests asked for.
 */
export function atTurnEnd(client: Redis | Cluster, fn: () => void): void {
  const queued = due.get(client);
  if (queued) {
    queued.push(fn);
    return;
  }
  const fns = [fn];
  due.set(client, fns);
  setImmediate(() => {
    due.delete(client);
    for (const f of fns) f();
  });
}

/** Lua's unpack is bounded by the C stack: long lists of lease ids are refreshed in chunks. */
const REFRESH_CHUNK = 1000;

export interface RefreshOptions {
  run: RunScript;
  /** refresh.lua's KEYS: the lease set */
  keys: string[];
  /** read as each chunk is sent, with its `sentAt`: a reload may change it between chunks */
  term: LeaseTerm;
  ids: string[];
  /** Hears each chunk: when it was sent (performance.now()) and the ids Redis no longer recorded. */
  refreshed?: (chunk: string[], sentAt: number, missing: readonly string[]) => void;
}

/** Pushes the expiry of the leases `ids` in one lease set forward (refresh.lua), chunk by chunk. */
export async function refreshInChunks(o: RefreshOptions): Promise<void> {
  for (let i = 0; i < o.ids.length; i += REFRESH_CHUNK) {
    const chunk = o.ids.slice(i, i + REFRESH_CHUNK);
    const sentAt = performance.now();
    const missing = (await o.run('keywardRefresh', o.keys, [o.term.ms, ...chunk])) as string[];
    o.refreshed?.(chunk, sentAt, missing);
  }
}

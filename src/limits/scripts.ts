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
  return (name, keys, args) => fns[name].call(client, keys.length, ...keys, ...args);
}

/**
 * The client's CPU per Redis command, three ways of sending the commands issued in one
 * event-loop turn (what the sidecar does when several requests arrive together):
 *   auto   ioredis' enableAutoPipelining: a Pipeline object per turn, a promise per command
 *   plain  one write per command
 *   corked the limiter's own runner (src/limits/scripts.ts): the turn's calls in one write
 * The command is the limiter's peek.lua as EVALSHA, on a client with every limiter script
 * defined (auto mode copies each onto every Pipeline). Redis must be running
 * (BENCH_REDIS_URL, redis://127.0.0.1:6379).
 *   npx tsx bench/redis-client.ts [commands per turn, comma list: 1,4,16]
 */
import { Redis } from 'ioredis';
import { scriptRunner } from '../src/limits/redis/scripts.js';
import { REDIS_URL, log } from './lib/settings.js';

const N = 40_000;
const perTurn = (process.argv[2] ?? '1,4,16').split(',').map(Number);
type Mode = 'auto' | 'plain' | 'corked';
const KEYS = ['{bench-client}:rpm', '{bench-client}:tpm'];

async function measure(mode: Mode, per: number): Promise<number> {
  const r = new Redis(REDIS_URL, { enableAutoPipelining: mode === 'auto', commandTimeout: 1000, maxRetriesPerRequest: 0 });
  await new Promise((resolve) => r.once('ready', resolve));
  const run = scriptRunner(r);
  // The defined command itself, without the runner's corking.
  const peek = (r as unknown as Record<string, (...a: unknown[]) => Promise<unknown>>).keywardPeek!.bind(r);
  const call = mode === 'corked' ? () => run('keywardPeek', KEYS, [10, 0]) : () => peek(2, ...KEYS, 10, 0);
  let us = 0;
  // The first pass warms up (and loads the script); the second is measured.
  for (let pass = 0; pass < 2; pass++) {
    const c0 = process.cpuUsage();
    for (let i = 0; i < N / per; i++) {
      const turn: Promise<unknown>[] = [];
      for (let j = 0; j < per; j++) turn.push(call());
      await Promise.all(turn);
    }
    const c = process.cpuUsage(c0);
    us = (c.user + c.system) / N;
  }
  r.disconnect();
  return us;
}

log(`client CPU µs per command (user + system of this process), ${N} commands per figure`);
log(`${'per turn'.padStart(8)} ${'auto'.padStart(8)} ${'plain'.padStart(8)} ${'corked'.padStart(8)}   corked/auto`);
for (const per of perTurn) {
  const f: Record<Mode, number> = { auto: 0, plain: 0, corked: 0 };
  for (const mode of ['auto', 'plain', 'corked'] as const) f[mode] = await measure(mode, per);
  log(`${String(per).padStart(8)} ${f.auto.toFixed(2).padStart(8)} ${f.plain.toFixed(2).padStart(8)} ${f.corked.toFixed(2).padStart(8)}   ${(f.corked / f.auto).toFixed(3)}`);
}

/**
 * The client's CPU per Redis command, three ways of sending the commands issued in one
 * event-loop turn (what the sidecar does when several requests arrive together):
 *   auto   ioredis' enableAutoPipelining: a Pipeline object per turn, a promise per command
 *   plain  one write per command
 *   corked the connection's socket corked for the turn (src/limits/scripts.ts): one write
 * The command is EVALSHA of a trivial script defined with defineCommand, as the limiter's
 * are, with seven scripts defined (the limiter's count; auto mode copies each onto every
 * Pipeline). Redis must be running (BENCH_REDIS_URL, redis://127.0.0.1:6379).
 *   npx tsx bench/redis-client.ts [commands per turn, comma list: 1,4,16]
 */
import { Redis } from 'ioredis';
import { REDIS_URL, log } from './lib/settings.js';

const N = 40_000;
const perTurn = (process.argv[2] ?? '1,4,16').split(',').map(Number);
type Mode = 'auto' | 'plain' | 'corked';

async function measure(mode: Mode, per: number): Promise<number> {
  const r = new Redis(REDIS_URL, { enableAutoPipelining: mode === 'auto', commandTimeout: 1000, maxRetriesPerRequest: 0 });
  await new Promise((resolve) => r.once('ready', resolve));
  for (let i = 0; i < 7; i++) r.defineCommand(`script${i}`, { lua: `return {1, 2, "${i}"}` });
  const call = (r as unknown as Record<string, (...a: unknown[]) => Promise<unknown>>).script0!.bind(r);
  let corked = false;
  const cork = (): void => {
    if (corked) return;
    corked = true;
    r.stream.cork();
    setImmediate(() => {
      corked = false;
      r.stream.uncork();
    });
  };
  let us = 0;
  // The first pass warms up (and loads the script); the second is measured.
  for (let pass = 0; pass < 2; pass++) {
    const c0 = process.cpuUsage();
    for (let i = 0; i < N / per; i++) {
      const turn: Promise<unknown>[] = [];
      for (let j = 0; j < per; j++) {
        if (mode === 'corked') cork();
        turn.push(call(1, '{bench}:a', 'x', '1', '2'));
      }
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

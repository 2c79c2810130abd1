/**
 * What one batched access-log write costs the event loop, by how it is written: the
 * sidecar's destination (`logDestination`, sonic-boom asynchronous: each write is handed
 * to libuv's thread pool and its completion comes back through the loop), sonic-boom
 * synchronous (one write(2) on the main thread), and no write at all.
 *   npx tsx bench/log-writes.ts [rounds (3)] [destination (/dev/null)]
 * The loop is kept busy as under load: each turn spins 2 ms (the time a batch gathers
 * lines), writes one batch of 20 access-line-sized lines, and yields with setImmediate.
 * Reported per write, over the spin: the process's CPU (all threads) and the wall time the
 * loop lost. Modes alternate within each round.
 */
import pino from 'pino';
import { logDestination } from '../src/obs/logger.js';

const rounds = Number(process.argv[2]) > 0 ? Number(process.argv[2]) : 3;
const dest = process.argv[3] ?? '/dev/null';
const WRITES = 600;
const SPIN_MS = 2;
const line = `${JSON.stringify({ level: 'info', time: new Date().toISOString(), service: 'keyward', msg: 'request', pad: 'x'.repeat(380) })}\n`;
const batch = (): string => Array.from({ length: 20 }, () => line).join('');

type Mode = 'async (logDestination)' | 'sync' | 'no write';
const MODES: Mode[] = ['async (logDestination)', 'sync', 'no write'];

async function destination(mode: Mode): Promise<pino.DestinationStream | null> {
  if (mode === 'no write') return null;
  const stream = mode === 'sync' ? pino.destination({ dest, sync: true }) : logDestination(dest);
  await new Promise((resolve) => (stream as unknown as NodeJS.EventEmitter).once('ready', resolve));
  return stream;
}

async function measure(mode: Mode): Promise<{ cpuUs: number; wallUs: number }> {
  const stream = await destination(mode);
  let spun = 0;
  const cpu0 = process.cpuUsage();
  const t0 = performance.now();
  await new Promise<void>((done) => {
    let i = 0;
    const turn = (): void => {
      const start = performance.now();
      while (performance.now() - start < SPIN_MS);
      spun += performance.now() - start;
      stream?.write(batch());
      if (++i < WRITES) setImmediate(turn);
      else done();
    };
    turn();
  });
  const cpu = process.cpuUsage(cpu0);
  const wall = performance.now() - t0;
  // Outside the measured time: every byte written and the file closed before the next mode.
  if (stream) await new Promise((resolve) => (stream as unknown as NodeJS.WritableStream & NodeJS.EventEmitter).once('close', resolve).end());
  return { cpuUs: (cpu.user + cpu.system) / WRITES - (spun * 1000) / WRITES, wallUs: ((wall - spun) * 1000) / WRITES };
}

const results = new Map<Mode, { cpuUs: number; wallUs: number }[]>(MODES.map((m) => [m, []]));
for (let r = 0; r < rounds; r++) {
  for (const mode of r % 2 ? [...MODES].reverse() : MODES) results.get(mode)!.push(await measure(mode));
}
const median = (xs: number[]): number => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
process.stdout.write(`log writes to ${dest}: ${rounds} rounds x ${WRITES} writes of 20 lines (${Buffer.byteLength(batch())} B), medians per write\n`);
for (const [mode, rs] of results) {
  process.stdout.write(`  ${mode.padEnd(24)} CPU over the spin ${median(rs.map((x) => x.cpuUs)).toFixed(1).padStart(6)} µs   loop time lost ${median(rs.map((x) => x.wallUs)).toFixed(1).padStart(6)} µs\n`);
}

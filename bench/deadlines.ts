/**
 * What bounding one Redis call costs the main thread, in isolation: a timer armed and
 * cleared per call (`setTimeout` + `clearTimeout`, as ioredis' commandTimeout and the
 * failover guard used to), against a deadline of src/limits/redis/deadlines.ts (a cell of
 * one array, one sweep). Both with one call in flight at a time and with 8 overlapping.
 *   npx tsx bench/deadlines.ts [rounds (5)]
 */
import { Deadlines } from '../src/limits/redis/deadlines.js';
import { log } from './lib/settings.js';

const N = 200_000;
const ROUNDS = Number(process.argv[2] ?? 5);
const noop = (): void => undefined;
const deadlines = new Deadlines({ timeoutMs: 1000 });

/** µs per call of `arm` then `disarm`, with `inFlight` calls open at once. */
function perCall<T>(inFlight: number, arm: () => T, disarm: (t: T) => void): number {
  const open: T[] = [];
  const t0 = performance.now();
  for (let i = 0; i < N; i++) {
    open.push(arm());
    if (open.length >= inFlight) disarm(open.shift()!);
  }
  for (const t of open) disarm(t);
  return ((performance.now() - t0) * 1000) / N;
}

const timer = (): NodeJS.Timeout => setTimeout(noop, 1000);
const deadline = (): ReturnType<Deadlines['start']> => deadlines.start(noop);
log('µs per call: timer (setTimeout + clearTimeout) / deadline (start + clear)');
for (let r = 1; r <= ROUNDS; r++) {
  const one = [perCall(1, timer, clearTimeout), perCall(1, deadline, (d) => deadlines.clear(d))];
  const eight = [perCall(8, timer, clearTimeout), perCall(8, deadline, (d) => deadlines.clear(d))];
  log(`round ${r}: 1 in flight ${one[0]!.toFixed(3)} / ${one[1]!.toFixed(3)}, 8 in flight ${eight[0]!.toFixed(3)} / ${eight[1]!.toFixed(3)}`);
}
process.exit(0);

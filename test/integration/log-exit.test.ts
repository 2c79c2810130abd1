/**
 * The last log lines at exit (src/obs/logger.ts, flushed): a process that logs and exits as
 * keyward's shutdown does, with stdout's reader behind, so that writes are still pending
 * when it asks to exit. Every line must arrive, whole and once. And the wait itself: it
 * ends when the stream has written everything, or after its timeout.
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { closeSync, openSync } from 'node:fs';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { test } from 'node:test';
import type pino from 'pino';
import { createLogger, flushed, logDestination } from '../../src/obs/logger.js';

const MAIN = join(import.meta.dirname, '../helpers/log-exit-main.ts');

test('lines still pending at exit reach a slow stdout reader, every one', { timeout: 60_000 }, async () => {
  const n = 20_000; // about 7 MB of lines: far more than a pipe holds
  const child = spawn(process.execPath, ['--import', 'tsx', MAIN, String(n)], { stdio: ['ignore', 'pipe', 'pipe'] });
  const lines: string[] = [];
  const stdout = createInterface({ input: child.stdout });
  stdout.on('line', (l) => lines.push(l));
  // The reader falls behind: nothing is read until the process is about to exit. (After
  // createInterface, which resumes its input.)
  child.stdout.pause();
  for await (const l of createInterface({ input: child.stderr })) {
    if (l === 'flushing') break;
  }
  assert.equal(lines.length, 0, 'nothing was read before the process said it is flushing');
  child.stdout.resume();
  const [code] = (await once(child, 'close')) as [number | null];
  assert.equal(code, 0);
  const parsed = lines.map((l) => JSON.parse(l) as { msg: string; req_id?: string });
  const ids = parsed.filter((l) => l.msg === 'request').map((l) => l.req_id);
  assert.equal(ids.length, n, 'every access line');
  // Once each and in order: a line lost and another written twice would keep the count.
  assert.deepEqual(ids, Array.from({ length: n }, (_, i) => `req-${i}`));
  assert.equal(parsed.at(-1)?.msg, 'last line');
});

test('flushed: with nothing pending it resolves once the stream says so; a stream that never does is given up after the timeout', { timeout: 30_000 }, async () => {
  const devNull = openSync('/dev/null', 'w');
  try {
    // Far longer than the test's own timeout: only the stream's answer can end this wait.
    await flushed(createLogger({ level: 'info', destination: logDestination(devNull) }), 3_600_000);
  } finally {
    closeSync(devNull);
  }
  const stuck = createLogger({ level: 'info', destination: { write: () => undefined, flush: () => undefined } as unknown as pino.DestinationStream });
  await flushed(stuck, 20);
});

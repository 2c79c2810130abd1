/** Feeding response bodies to the usage tap as the relay does: whole, and split at every size. */
import assert from 'node:assert/strict';
import { type Tapped, type Usage, createUsageTap } from '../../src/proxy/usage/tap.js';

export const JSON_CT = 'application/json';
export const SSE_CT = 'text/event-stream; charset=utf-8';

/** Feeds `body` to a fresh tap in pieces of `size` bytes (1 = every byte boundary; by default a socket read's). */
export function tapIn(body: Buffer | string, opts: { contentType: string; contentEncoding?: string }, size = 16 * 1024): Tapped {
  const tap = createUsageTap(opts);
  assert.ok(tap, 'a tap for this content type');
  const buf = Buffer.isBuffer(body) ? body : Buffer.from(body);
  for (let i = 0; i < buf.length; i += size) tap.push(buf.subarray(i, i + size));
  return tap.end();
}

/** Same answer whole, byte by byte and in odd-sized pieces. */
export function tapped(body: Buffer | string, opts: { contentType: string; contentEncoding?: string }): Tapped {
  const whole = tapIn(body, opts, Number.MAX_SAFE_INTEGER);
  for (const size of [1, 2, 3, 7, 64, 1000]) assert.deepEqual(tapIn(body, opts, size), whole, `split every ${size} bytes`);
  return whole;
}

export function read(body: Buffer | string, opts: { contentType: string; contentEncoding?: string }): Usage | null {
  return tapped(body, opts).usage;
}

export const sse = (events: { event?: string; data: unknown }[], eol = '\n'): string =>
  events
    .map((e) => `${e.event ? `event: ${e.event}${eol}` : ''}data: ${typeof e.data === 'string' ? e.data : JSON.stringify(e.data)}${eol}${eol}`)
    .join('');

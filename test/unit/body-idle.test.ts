import assert from 'node:assert/strict';
import { EventEmitter, once } from 'node:events';
import type { IncomingMessage } from 'node:http';
import { test } from 'node:test';
import { watchBodyIdle } from '../../src/proxy/body/idle.js';

/** What the watch reads of a request: its socket's byte count, its state and its 'end'. */
function fakeRequest(): IncomingMessage & { socket: { bytesRead: number } } {
  const req = new EventEmitter() as unknown as IncomingMessage & { socket: { bytesRead: number } };
  Object.assign(req, { socket: { bytesRead: 0 }, complete: false, destroyed: false, isPaused: () => false, headers: { 'content-length': '10' } });
  return req;
}

test('one sweep for many watches: the stalled body is cut, the one that moves and the one that ended are not', async () => {
  let t = 0;
  const now = () => t;
  const idle = new EventEmitter();
  const stalled = fakeRequest();
  const moving = fakeRequest();
  const ending = fakeRequest();
  const watches = [stalled, moving, ending].map((req) => watchBodyIdle(req, { idleMs: 40, now, subject: req, onIdle: (r) => idle.emit('idle', r) }));
  ending.emit('end');
  const cut = once(idle, 'idle');
  // each sweep sees the moving body advance, and time pass
  const advance = setInterval(() => {
    t += 10;
    moving.socket.bytesRead += 1;
  }, 5);
  const [which] = await cut;
  clearInterval(advance);
  assert.equal(which, stalled, 'the stalled body is cut first: the ended one is not watched, the moving one keeps moving');
  assert.ok(t >= 40, 'not before idleMs');
  for (const w of watches) w.stop();
});

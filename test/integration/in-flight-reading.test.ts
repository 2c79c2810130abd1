/**
 * The in-flight bound's hold on a connection's reading (src/proxy/in-flight.ts), on a real
 * HTTP server whose handler the test drives: each request is started as the module says
 * and answered when the test says, so which responses close, and when, is exact.
 */
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import net from 'node:net';
import { after, before, test } from 'node:test';
import { answered, MAX_IN_FLIGHT, mayStart } from '../../src/proxy/in-flight.js';

/** Requests started, in order: answer one with `answer(i)`. */
const started: { req: IncomingMessage; res: ServerResponse }[] = [];
let onStart: (() => void) | null = null;
const server = createServer((req, res) => {
  res.on('close', () => {
    const next = answered<null>(res);
    if (next) start(next.res.req, next.res);
  });
  if (mayStart(req, res, null)) start(req, res);
});

function start(req: IncomingMessage, res: ServerResponse): void {
  started.push({ req, res });
  onStart?.();
}

/** Answers a started request with what its body was, once the whole body is in. */
function answer(i: number): void {
  const { req, res } = started[i]!;
  const chunks: Buffer[] = [];
  req.on('data', (c: Buffer) => chunks.push(c));
  req.on('end', () => res.end(Buffer.concat(chunks).toString() || 'empty'));
}

const untilStarted = (n: number): Promise<void> =>
  started.length >= n ? Promise.resolve() : new Promise((resolve) => (onStart = () => started.length >= n && resolve()));

let port = 0;
before(async () => {
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  port = (server.address() as net.AddressInfo).port;
});
after(() => {
  server.closeAllConnections();
  server.close();
});

test('a request whose body is still to come when reading stopped gets it read when its turn comes, with others still in flight', { timeout: 15_000 }, async () => {
  const ahead = 2 * MAX_IN_FLIGHT;
  const body = 'the upload';
  const socket = net.connect(port, '127.0.0.1');
  const received: Buffer[] = [];
  socket.on('data', (c: Buffer) => received.push(c));
  // Its arrival is the one that stops the reading (more than MAX_IN_FLIGHT wait), its body cut in two.
  socket.write(`GET /a HTTP/1.1\r\nHost: x\r\n\r\n`.repeat(ahead) + `POST /b HTTP/1.1\r\nHost: x\r\nContent-Length: ${body.length}\r\n\r\n${body.slice(0, 4)}`);
  await untilStarted(MAX_IN_FLIGHT);
  // The rest of the body is sent while reading is stopped: it waits in the kernel.
  socket.write(body.slice(4));
  // Answering the first ones in order starts those waiting; the POST's turn comes with
  // MAX_IN_FLIGHT - 1 requests still in flight, none of which closes meanwhile.
  for (let i = 0; i <= ahead - MAX_IN_FLIGHT; i++) {
    answer(i);
    await untilStarted(MAX_IN_FLIGHT + i + 1);
  }
  const post = started.length - 1;
  assert.equal(started[post]!.req.method, 'POST');
  const whole = new Promise<string>((resolve) => {
    const chunks: Buffer[] = [];
    started[post]!.req.on('data', (c: Buffer) => chunks.push(c));
    started[post]!.req.on('end', () => resolve(Buffer.concat(chunks).toString()));
  });
  assert.equal(await whole, body);
  socket.destroy();
});

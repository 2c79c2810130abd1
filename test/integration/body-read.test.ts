import assert from 'node:assert/strict';
import { once } from 'node:events';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import { connect, type AddressInfo, type Socket } from 'node:net';
import { after, test } from 'node:test';
import { readModelBody, type BodyResult } from '../../src/proxy/body/read.js';

const OPTS = { limit: 1 << 20, uploadLimit: 0, modelRequired: true };

/** Each request's read as the server saw it: its request, and what the read gave or threw. */
interface Read {
  req: IncomingMessage;
  result: BodyResult | null;
  error: Error | null;
}
const arrived: ((r: Read) => void)[] = [];
const server = createServer((req: IncomingMessage, res: ServerResponse) => {
  readModelBody(req, OPTS).then(
    (result) => {
      arrived.shift()?.({ req, result, error: null });
      res.end(result.ok ? `model=${result.body.model}` : `refused ${result.denial.status}`);
    },
    (error: Error) => arrived.shift()?.({ req, result: null, error }),
  );
});
server.listen(0, '127.0.0.1');
await once(server, 'listening');
const port = (server.address() as AddressInfo).port;
after(() => {
  server.closeAllConnections();
  server.close();
});

const nextRead = () => new Promise<Read>((resolve) => arrived.push(resolve));
const head = (len: number) => `POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\nContent-Length: ${len}\r\n\r\n`;

/** A connection whose bytes are all kept, and waited on until a pattern shows. */
async function connection(): Promise<{ socket: Socket; until: (re: RegExp) => Promise<string> }> {
  const socket = connect(port, '127.0.0.1');
  await once(socket, 'connect');
  let text = '';
  socket.on('data', (chunk: Buffer) => {
    text += chunk.toString();
    socket.emit('kept');
  });
  const until = async (re: RegExp): Promise<string> => {
    while (!re.test(text)) await once(socket, 'kept');
    return text;
  };
  return { socket, until };
}

test('a JSON body read in pieces on one keep-alive connection, request after request; a read request closes quietly', async () => {
  const { socket, until } = await connection();
  const bodies = ['{"model":"gpt-4o","messages":[]}', '{"model":"claude-x","max_tokens":5}'];
  for (const [n, body] of bodies.entries()) {
    const read = nextRead();
    socket.write(head(body.length));
    socket.write(body.slice(0, 10));
    await new Promise((r) => setImmediate(r));
    socket.write(body.slice(10));
    const { req, result } = await read;
    assert.ok(result?.ok, 'read');
    assert.equal(result.body.model, n === 0 ? 'gpt-4o' : 'claude-x');
    assert.equal(result.body.estimateBytes, body.length);
    assert.ok(req.complete);
    await until(n === 0 ? /model=gpt-4o$/ : /model=claude-x$/);
    // the request closes after its response; nothing of its read is left to answer it
    if (!req.destroyed) await once(req, 'close');
  }
  socket.destroy();
});

test('a client that goes away mid-body: the read fails with the abort, once', async () => {
  const { socket } = await connection();
  const read = nextRead();
  socket.write(head(100));
  socket.write('{"model":"gpt-4o",');
  await new Promise((r) => setImmediate(r));
  socket.destroy();
  const { req, result, error } = await read;
  assert.equal(result, null);
  assert.equal((error as NodeJS.ErrnoException | null)?.code, 'ECONNRESET');
  if (!req.destroyed) await once(req, 'close');
  assert.equal(arrived.length, 0);
});

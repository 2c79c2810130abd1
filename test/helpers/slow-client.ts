/**
 * A raw HTTP/1.1 connection the test writes a request into piece by piece, reading back
 * what the server answers as it comes: for bodies that must be held back, stalled or sent
 * past a limit while the answer is watched.
 */
import net from 'node:net';
import { once } from 'node:events';
import { parseResponses, type ParsedResponse } from './raw.js';

export interface SlowClient {
  socket: net.Socket;
  /** writes bytes; resolves once they were handed to the kernel (or the socket failed) */
  write(bytes: Buffer | string): Promise<void>;
  /** one chunk of a chunked body */
  chunk(bytes: Buffer | string): Promise<void>;
  /** the first complete response */
  response(): Promise<ParsedResponse>;
  /** the response's status line and headers, before its body is complete */
  head(): Promise<{ status: number; text: string }>;
  /** everything received so far */
  received(): Buffer;
  /** resolves when the server has closed the connection */
  closed: Promise<void>;
}

export async function openSlowClient(port: number): Promise<SlowClient> {
  const socket = net.connect(port, '127.0.0.1');
  await once(socket, 'connect');
  const chunks: Buffer[] = [];
  const waiters: (() => void)[] = [];
  socket.on('data', (c: Buffer) => {
    chunks.push(c);
    for (const w of waiters.splice(0)) w();
  });
  // A server that answered and closed may reset the rest of a body still being written.
  socket.on('error', () => {});
  const closed = new Promise<void>((resolve) => socket.once('close', () => {
    for (const w of waiters.splice(0)) w();
    resolve();
  }));
  const until = <T>(probe: () => T | null): Promise<T> =>
    new Promise((resolve, reject) => {
      const check = () => {
        const v = probe();
        if (v !== null) return resolve(v);
        if (socket.destroyed) return reject(new Error(`connection closed; got: ${Buffer.concat(chunks).toString('latin1').slice(0, 300)}`));
        waiters.push(check);
      };
      check();
    });
  const write = (bytes: Buffer | string) =>
    new Promise<void>((resolve) => {
      if (socket.destroyed) return resolve();
      socket.write(bytes, () => resolve());
    });
  return {
    socket,
    write,
    chunk: (bytes) => write(Buffer.concat([Buffer.from(`${Buffer.byteLength(bytes).toString(16)}\r\n`), Buffer.from(bytes), Buffer.from('\r\n')])),
    response: () => until(() => parseResponses(Buffer.concat(chunks)).responses[0] ?? null),
    head: () =>
      until(() => {
        const text = Buffer.concat(chunks).toString('latin1');
        const end = text.indexOf('\r\n\r\n');
        return end === -1 ? null : { status: Number(text.split(' ')[1]), text: text.slice(0, end) };
      }),
    received: () => Buffer.concat(chunks),
    closed,
  };
}

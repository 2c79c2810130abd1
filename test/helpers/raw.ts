/**
 * Raw-socket HTTP/1.1 client for tests that must control every byte on the wire
 * (framing, pipelining, malformed requests) and read every byte that comes back.
 */
import net from 'node:net';

export interface ParsedResponse {
  status: number;
  headers: Record<string, string>;
  body: Buffer;
}

/** Splits `buf` into complete responses (content-length or chunked bodies); `head` lists HEAD requests in order. */
export function parseResponses(buf: Buffer, opts: { headRequests?: number[] } = {}): { responses: ParsedResponse[]; rest: Buffer } {
  const responses: ParsedResponse[] = [];
  let pos = 0;
  for (;;) {
    const end = buf.indexOf('\r\n\r\n', pos);
    if (end === -1) break;
    const lines = buf.toString('latin1', pos, end).split('\r\n');
    const status = Number(lines[0]!.split(' ')[1]);
    const headers: Record<string, string> = {};
    for (const l of lines.slice(1)) {
      const i = l.indexOf(':');
      headers[l.slice(0, i).trim().toLowerCase()] = l.slice(i + 1).trim();
    }
    let at = end + 4;
    let body: Buffer = Buffer.alloc(0);
    const noBody = status === 100 || status === 204 || status === 304 || (opts.headRequests ?? []).includes(responses.length);
    if (status === 100) {
      pos = at;
      continue;
    }
    if (!noBody && headers['transfer-encoding']?.toLowerCase() === 'chunked') {
      const parts: Buffer[] = [];
      let done = false;
      for (;;) {
        const lineEnd = buf.indexOf('\r\n', at);
        if (lineEnd === -1) break;
        const size = parseInt(buf.toString('latin1', at, lineEnd), 16);
        if (size === 0) {
          const trailerEnd = buf.indexOf('\r\n\r\n', lineEnd);
          if (trailerEnd === -1 && buf.length < lineEnd + 4) break;
          at = lineEnd + 4;
          done = true;
          break;
        }
        if (buf.length < lineEnd + 2 + size + 2) break;
        parts.push(buf.subarray(lineEnd + 2, lineEnd + 2 + size));
        at = lineEnd + 2 + size + 2;
      }
      if (!done) break;
      body = Buffer.concat(parts);
    } else if (!noBody && headers['content-length'] !== undefined) {
      const len = Number(headers['content-length']);
      if (buf.length < at + len) break;
      body = buf.subarray(at, at + len);
      at += len;
    } else if (!noBody && headers['connection'] === 'close') {
      body = buf.subarray(at);
      at = buf.length;
    }
    responses.push({ status, headers, body });
    pos = at;
  }
  return { responses, rest: buf.subarray(pos) };
}

export interface RawExchange {
  /** everything the server sent, once it closed the connection or `responses` arrived */
  bytes: Buffer;
  responses: ParsedResponse[];
  closed: boolean;
}

/**
 * Writes `parts` in order (each as its own write), half-closes when asked, and collects
 * what comes back until the server closes the connection or `expect` complete responses
 * have arrived.
 */
export function rawExchange(port: number, parts: (Buffer | string)[], opts: { expect?: number; headRequests?: number[]; timeoutMs?: number; halfClose?: boolean } = {}): Promise<RawExchange> {
  return new Promise((resolve, reject) => {
    const socket = net.connect(port, '127.0.0.1');
    const chunks: Buffer[] = [];
    let settled = false;
    const finish = (closed: boolean) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      const bytes = Buffer.concat(chunks);
      socket.destroy();
      resolve({ bytes, responses: parseResponses(bytes, opts).responses, closed });
    };
    const timer = setTimeout(() => {
      settled = true;
      socket.destroy();
      reject(new Error(`raw exchange timed out; got: ${Buffer.concat(chunks).toString('latin1').slice(0, 500)}`));
    }, opts.timeoutMs ?? 10_000);
    socket.on('data', (c: Buffer) => {
      chunks.push(c);
      if (opts.expect !== undefined && parseResponses(Buffer.concat(chunks), opts).responses.length >= opts.expect) finish(false);
    });
    socket.on('end', () => finish(true));
    socket.on('close', () => finish(true));
    socket.on('error', (err) => (settled ? undefined : reject(err)));
    socket.on('connect', () => {
      for (const p of parts) socket.write(p);
      // the client sends nothing more, and keeps reading
      if (opts.halfClose) socket.end();
    });
  });
}

/** A chunked encoding of `body` in one chunk, with the terminating zero chunk. */
export function chunked(body: Buffer | string): Buffer {
  const b = Buffer.from(body);
  return Buffer.concat([Buffer.from(`${b.length.toString(16)}\r\n`), b, Buffer.from('\r\n0\r\n\r\n')]);
}

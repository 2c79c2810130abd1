/** A raw HTTP client for tests that need exact control of headers, targets and bodies. */
import http, { type IncomingHttpHeaders, type OutgoingHttpHeaders } from 'node:http';
import type { Readable } from 'node:stream';

export interface RawResponse {
  status: number;
  headers: IncomingHttpHeaders;
  body: Buffer;
  json<T = Record<string, unknown>>(): T;
}

export interface RawRequest {
  method?: string;
  path: string;
  headers?: OutgoingHttpHeaders;
  body?: Buffer | string | Readable;
  agent?: http.Agent | false;
}

const agent = new http.Agent({ keepAlive: false });

export function send(base: string, r: RawRequest): Promise<RawResponse> {
  const u = new URL(base);
  return new Promise((resolve, reject) => {
    const req = http.request(
      { host: u.hostname, port: u.port, method: r.method ?? 'GET', path: r.path, headers: r.headers ?? {}, agent: r.agent ?? agent },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => {
          const body = Buffer.concat(chunks);
          resolve({ status: res.statusCode ?? 0, headers: res.headers, body, json: <T>() => JSON.parse(body.toString('utf8')) as T });
        });
        res.on('error', reject);
      },
    );
    req.on('error', reject);
    const body = r.body;
    if (body === undefined) req.end();
    else if (typeof body === 'string' || Buffer.isBuffer(body)) req.end(body);
    else body.pipe(req);
  });
}

export const bearer = (key: string) => ({ authorization: `Bearer ${key}` });

/** POSTs `body` as JSON to /v1/chat/completions, with `key` as the bearer token. */
export const postChat = (base: string, key: string, body: unknown): Promise<RawResponse> =>
  send(base, { method: 'POST', path: '/v1/chat/completions', headers: { ...bearer(key), 'content-type': 'application/json' }, body: JSON.stringify(body) });

export function jsonBody(value: unknown, headers: OutgoingHttpHeaders = {}) {
  return { headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify(value) };
}

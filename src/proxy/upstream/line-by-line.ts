/**
 * A request whose header object holds a list of Cookie values (the client sent more than
 * one Cookie line), sent upstream by keyward itself. http-proxy-3's `stream` pass hands
 * Node's client a header object, and Node's client sends a list as one line per value
 * except for Cookie, whose values it joins into one line with "; ". DESIGN section 5 keeps
 * repeated lines apart, Cookie by name. Node's client sends a header array (its documented
 * raw form, as `message.rawHeaders`) line by line, so such a request is made here with one,
 * and handled as the `stream` pass handles every other: its response goes to the
 * forwarder's response handler, an error to its error callback, and it is destroyed when
 * the client goes away before its answer has been written.
 */
import http from 'node:http';
import https from 'node:https';
import type { IncomingHttpHeaders, IncomingMessage, ServerResponse } from 'node:http';
import type { BodySource } from '../body/read.js';
import { failWithoutAnswer } from './no-answer.js';

/** Whether the request's outgoing headers need their lines sent one by one. */
export const needsLines = (headers: IncomingHttpHeaders): boolean => Array.isArray(headers.cookie);

/**
 * The header object as lines: each name once per value, in the object's order. Node's
 * client adds no Host to an array, so the target's stands first when the client sent none.
 */
export function headerLines(headers: IncomingHttpHeaders, target: URL): string[] {
  const lines: string[] = headers.host === undefined ? ['host', target.host] : [];
  for (const [name, value] of Object.entries(headers)) {
    if (value === undefined) continue;
    if (typeof value === 'string') lines.push(name, value);
    else for (const v of value) lines.push(name, v);
  }
  return lines;
}

/**
 * The path sent upstream, as http-proxy-3 builds it: the request target's path and query
 * (as the URL parser gives them), after the target's own path when it has one; the
 * segments joined by one slash and the queries by `&`.
 */
export function upstreamPath(target: URL, prependPath: boolean, url: string): string {
  const own = url === '' || url.startsWith('?') ? url : pathAndQuery(new URL(url, 'http://base.invalid'));
  return join(prependPath ? [pathAndQuery(target), own] : ['/', own]);
}

const pathAndQuery = (u: URL): string => `${u.pathname}${u.search}`;

function join(parts: string[]): string {
  const queries: string[] = [];
  let path = '';
  for (const part of parts) {
    const q = part.indexOf('?');
    if (q !== -1 && q + 1 < part.length) queries.push(part.slice(q + 1));
    const seg = q === -1 ? part : part.slice(0, q);
    if (!seg) continue;
    if (path.endsWith('/')) path += seg.startsWith('/') ? seg.slice(1) : seg;
    else path += seg.startsWith('/') ? seg : `/${seg}`;
  }
  return queries.length > 0 ? `${path}?${queries.join('&')}` : path;
}

export interface LineByLineCall {
  req: IncomingMessage;
  res: ServerResponse;
  target: URL;
  prependPath: boolean;
  agent: http.Agent;
  /** what is piped into the upstream request */
  body: BodySource;
  onResponse(proxyRes: IncomingMessage, req: IncomingMessage, res: ServerResponse): void;
  onError(err: Error, req: IncomingMessage, res: ServerResponse): void;
  /** the upstream request closed unanswered (no-answer.ts); a piped body watches for that itself */
  onNoAnswer(err: Error, req: IncomingMessage, res: ServerResponse): void;
}

/** Methods whose request Node's client frames as chunked when it is given no length. */
const BODY_BY_DEFAULT = (method: string): boolean => !['GET', 'HEAD', 'DELETE', 'OPTIONS', 'TRACE', 'CONNECT'].includes(method);

export function sendLineByLine(c: LineByLineCall): void {
  const { req, res, target } = c;
  // Received without framing, the request has no body. The stream pass ends such a request
  // before its head is written, and Node's client frames it `content-length: 0`; a header
  // array is written at once, so here that line is given, or Node would send chunked.
  const unframed = req.headers['content-length'] === undefined && req.headers['transfer-encoding'] === undefined;
  const lines = headerLines(req.headers, target);
  if (unframed && BODY_BY_DEFAULT(req.method ?? 'GET')) lines.push('content-length', '0');
  const request = target.protocol === 'https:' ? https.request : http.request;
  const proxyReq = request({
    protocol: target.protocol,
    hostname: target.hostname.startsWith('[') ? target.hostname.slice(1, -1) : target.hostname,
    port: target.port || (target.protocol === 'https:' ? 443 : 80),
    method: req.method,
    path: upstreamPath(target, c.prependPath, req.url ?? ''),
    headers: lines,
    agent: c.agent,
  });
  // The client gone first: nothing waits for the answer (a read error of the client's
  // socket after it closed is no failure of the upstream either).
  res.on('close', () => {
    if (!res.writableFinished) proxyReq.destroy();
  });
  const failed = (err: Error & { code?: string }): void => {
    if (req.socket.destroyed && err.code === 'ECONNRESET') return void proxyReq.destroy();
    c.onError(err, req, res);
  };
  req.on('error', failed);
  proxyReq.on('error', failed);
  if (unframed) {
    failWithoutAnswer(proxyReq, res, (err) => c.onNoAnswer(err, req, res));
    proxyReq.end();
  }
  else c.body.pipe(proxyReq);
  proxyReq.on('response', (proxyRes) => c.onResponse(proxyRes, req, res));
}

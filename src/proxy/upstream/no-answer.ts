/**
 * An upstream request that closes with neither a response nor an error. Node's client
 * closes the connection without a word when the upstream answers 101 to a request that
 * asked for no upgrade (the request has no 'upgrade' listener): the upstream request then
 * only closes, its socket leaves the pool, and nothing would ever answer the client or end
 * its admission. Such a request is failed like an unreachable upstream.
 */
import type { ClientRequest } from 'node:http';

export class NoAnswer extends Error {
  readonly code = 'KW_NO_ANSWER';
}

/** Calls `fail` when `proxyReq` closes before its response and without an error of its own. */
export function failWithoutAnswer(proxyReq: ClientRequest, fail: (err: Error) => void): void {
  let settled = false;
  const done = (): void => void (settled = true);
  proxyReq.once('response', done);
  proxyReq.once('error', done);
  proxyReq.once('close', () => {
    if (!settled) fail(new NoAnswer('the upstream closed the connection without a response (an upgrade no one asked for?)'));
  });
}

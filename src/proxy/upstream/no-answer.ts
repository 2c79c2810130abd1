/**
 * An upstream request that closes with neither a response nor an error. Node's client
 * closes the connection without a word when the upstream answers 101 to a request that
 * asked for no upgrade (the request has no 'upgrade' listener): the upstream request then
 * only closes, its socket leaves the pool, and nothing would ever answer the client or end
 * its admission. Such a request is failed like an unreachable upstream.
 *
 * One 'close' listener a request, and a mark on the client's response where the forwarder
 * already learns of a response or an error, rather than a listener for each of the three.
 */
import type { ClientRequest, ServerResponse } from 'node:http';

export class NoAnswer extends Error {
  readonly code = 'KW_NO_ANSWER';
}

const SETTLED = Symbol('keyward.upstreamSettled');
type Marked = ServerResponse & { [SETTLED]?: true };

/** The upstream answered the request on `res`, or failed it: its close is no news. */
export function settled(res: ServerResponse): void {
  (res as Marked)[SETTLED] = true;
}

/** Calls `fail` when `proxyReq` closes before `settled(res)`. */
export function failWithoutAnswer(proxyReq: ClientRequest, res: ServerResponse, fail: (err: Error) => void): void {
  proxyReq.once('close', () => {
    if ((res as Marked)[SETTLED] !== true) fail(new NoAnswer('the upstream closed the connection without a response (an upgrade no one asked for?)'));
  });
}

/**
 * The status an access line gives a response, and the warning that names a response keyward
 * or its upstream ended: a status alone reads as an answer, which a cut response was not.
 */
import type { ServerResponse } from 'node:http';
import type { LogSink } from '../log.js';
import type { RequestContext } from './context.js';
import { wasCutByUpstream } from './upstream/relay.js';

/**
 * The status logged for a response: the one it was sent with when it ended whole, else its
 * head's when the upstream stopped short (with a warning, as nginx logs it), or the shutdown
 * grace or a stalled body cut it (with a warning naming the request), what was written on
 * the socket for a body the parser refused, else 499 (nginx's "client left").
 */
export function loggedStatus(res: ServerResponse, ctx: RequestContext, o: { cutting: boolean; log: LogSink }): number {
  const at = { req_id: ctx.reqId, upstream: ctx.upstream };
  if (res.writableFinished) {
    // Whole, though the upstream's connection failed after it (bytes past its end): as nginx, a warning.
    if (ctx.upstreamError !== null) o.log.warn({ ...at, err: ctx.upstreamError }, 'upstream failure after a whole response; it went out whole');
    return res.statusCode;
  }
  if (o.cutting) o.log.warn(at, 'request cut at shutdown: the grace period ran out');
  if (wasCutByUpstream(res)) {
    if (!o.cutting) o.log.warn({ ...at, err: ctx.upstreamError ?? 'the upstream response stopped before its end' }, 'upstream failure');
    return res.statusCode;
  }
  if (o.cutting && res.headersSent) return res.statusCode;
  if (ctx.stalled && res.headersSent) {
    o.log.warn(at, 'request cut: its body stalled after the response began');
    return res.statusCode;
  }
  return ctx.answeredOnSocket ?? 499;
}

/**
 * Writes a denial: the error body in the route's style, the request id, the key's
 * figures with a 429 for its own RPM or TPM, the shadow header, and `Connection: close`
 * when a large body is left unread. Every denial keyward answers is written here, those
 * for a failed upstream call and a stalled body included.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import { deny, renderError, type Denial, type ErrorStyle } from '../errors.js';
import type { Quota } from '../limits/limiter.js';
import { hasBody } from './body/read.js';
import { adoptSeen, producedNoOutput, type RequestContext } from './context.js';
import { addQuotaHeaders } from './quota-headers.js';
import { settle } from './settle.js';
import { closesAfter } from './last-response.js';
import type { ForwardFailure } from './upstream/forward.js';

/**
 * A denied request's unread body: Node discards a small one and keeps the connection;
 * a large or unsized one is not worth reading, so that connection is closed instead.
 */
function leavesLargeBodyUnread(req: IncomingMessage): boolean {
  if (req.complete || !hasBody(req)) return false;
  return !(Number(req.headers['content-length']) <= 65_536);
}

/** The header naming the codes shadowed checks would have answered with (DESIGN section 12). */
export const SHADOW_HEADER = 'x-keyward-shadow';

/**
 * `style`: the body's (default: the route's, openai before a route is known); `quota`: a
 * 429 for the key's own RPM or TPM sends the key's figures too (DESIGN section 11).
 */
export function sendDenial(res: ServerResponse, ctx: RequestContext, denial: Denial, opts: { style?: ErrorStyle; quota?: Quota | null } = {}): void {
  const req = res.req;
  const quota = opts.quota ?? null;
  ctx.code = denial.code;
  if (res.headersSent) {
    res.destroy();
    return;
  }
  const out = renderError(denial, opts.style ?? ctx.route?.style ?? 'openai');
  // Copied, then added to: a spread followed by a new property would build a hidden class per call.
  const headers: Record<string, string> = Object.assign({}, out.headers);
  headers['x-request-id'] = ctx.reqId;
  if (quota) addQuotaHeaders({ add: (name, value) => void (headers[name] = value) }, quota);
  if (ctx.shadow.length > 0) headers[SHADOW_HEADER] = ctx.shadow.join(',');
  // (an HTTP/1.0 client's answer closes already: the exchange marked it as it arrived)
  if (leavesLargeBodyUnread(req)) {
    headers.connection = 'close';
    closesAfter(res);
  } else if (!req.complete && hasBody(req)) {
    dropIfBodyLingers(req);
  }
  res.writeHead(out.status, headers);
  res.end(out.body);
}

/**
 * How long the rest of a denied request's small body may take: Node reads and discards it
 * to keep the connection, and a byte now and then would keep an unauthenticated
 * connection open for days (nginx bounds the same with `lingering_time`).
 */
export const DISCARD_MS = 10_000;

function dropIfBodyLingers(req: IncomingMessage): void {
  const socket = req.socket;
  const timer = setTimeout(() => socket.destroy(), DISCARD_MS).unref();
  // Off again either way: a keep-alive connection may see many such denials.
  const done = (): void => {
    clearTimeout(timer);
    req.off('end', done);
    socket.off('close', done);
  };
  req.once('end', done);
  socket.once('close', done);
}

const FAILURES: Record<ForwardFailure, (err: Error) => Denial> = {
  // the body stream's own answer (an upload over its limit), else its description of what it refused
  rejected: (err) => (err as Error & { denial?: Denial }).denial ?? deny('invalid_request', { detail: err.message }),
  timeout: () => deny('upstream_timeout'),
  unavailable: () => deny('upstream_unavailable'),
};

/** What a failed upstream call answers (see ForwardFailure). */
export const failureDenial = (kind: ForwardFailure, err: Error): Denial => FAILURES[kind](err);

/**
 * A body that stalls is cut with 408: the upstream request (if any) is destroyed before it
 * is complete, everything the request holds is given back, and the connection is closed.
 */
export function cutStalledBody(req: IncomingMessage, res: ServerResponse, ctx: RequestContext): void {
  adoptSeen(ctx);
  // Output already relayed is billed as any response cut short is; none, and nothing is.
  if (producedNoOutput(ctx)) ctx.upstreamFailed = true;
  ctx.stalled = true;
  ctx.forwarding?.abort();
  settle(ctx);
  // Read nothing more: a body completed after the 408 must not go on to admission.
  // Kept: a request destroyed before the timer below runs has no socket to reach it by.
  const socket = req.socket;
  socket.pause();
  closesAfter(res);
  if (res.headersSent) return void res.destroy();
  sendDenial(res, ctx, deny('invalid_request', { variant: 'stalled', params: { ms: ctx.snapshot.config.server.bodyIdleTimeoutMs }, status: 408 }));
  // Half-close so the client reads the answer, then let go of the socket.
  res.once('finish', () => setTimeout(() => socket.destroy(), 1000).unref());
}

/**
 * Bytes Node's parser refused on a connection, answered beside the requests' pipeline,
 * and the marks on a socket that say which request is current there (exchange.ts sets
 * them). Each answer names the request id its access line logs.
 */
import type { ServerResponse } from 'node:http';
import type { Duplex } from 'node:stream';
import { Socket } from 'node:net';
import { randomUUID } from 'node:crypto';
import { answerParserRefusal } from './upstream/framing.js';
import { styleOf, type RequestContext } from './context.js';

/** The request a connection is on, so a parser refusal mid-body knows whose answer has begun. */
export const CURRENT = Symbol('keyward.currentRequest');
/** The socket's bytesRead when its last complete request's response closed. */
export const ANSWERED_AT = Symbol('keyward.answeredAt');
/** A parser refusal waits for the answer before it (refuseAfter). */
const REFUSAL_WAITS = Symbol('keyward.refusalWaits');
export type MarkedSocket = Duplex & { [CURRENT]?: ServerResponse; [ANSWERED_AT]?: number; [REFUSAL_WAITS]?: boolean; bytesRead?: number };

export interface RefusalDeps {
  contextOf(res: ServerResponse): RequestContext;
  /** counts and logs a refusal that belongs to no request */
  unparsed(o: { reqId: string; status: number; code: string; clientIp: string | null }): void;
}

/** Answers what the parser refused on `socket` (Node's 'clientError'). */
export function refuseUnparsed(err: NodeJS.ErrnoException, socket: MarkedSocket, deps: RefusalDeps): void {
  const res = socket[CURRENT];
  // A request that is whole, whose answer is still to come or still streaming.
  if (res?.req.complete && !res.writableFinished && !res.destroyed) return refuseAfter(res, err, socket, deps);
  const current = res && !res.req.complete ? res : undefined;
  const reqId = current ? deps.contextOf(current).reqId : randomUUID(); // the access line's, sent back as on every answer
  const answer = answerParserRefusal(err, socket, {
    current: res ? { req: res.req, res, style: () => styleOf(deps.contextOf(res), res.req.url ?? '/') } : undefined,
    answeredAt: socket[ANSWERED_AT] ?? 0,
    reqId,
  });
  if (answer === null) return;
  if (current) {
    // Refused inside its body: the answer is that request's, logged when its response closes.
    const ctx = deps.contextOf(current);
    ctx.code = answer.code;
    ctx.answeredOnSocket = answer.status;
    return;
  }
  deps.unparsed({ reqId, status: answer.status, code: answer.code, clientIp: socket instanceof Socket ? (socket.remoteAddress ?? null) : null });
}

/**
 * Bytes the parser refused after a whole request whose answer is still to come or still
 * streaming: written now, the refusal would stand in for that answer or land inside it.
 * Nothing more is read; the refusal follows the answer, or nothing does when the
 * connection closes after it anyway (the client asked to close, or left).
 */
function refuseAfter(res: ServerResponse, err: NodeJS.ErrnoException & { rawPacket?: unknown }, socket: MarkedSocket, deps: RefusalDeps): void {
  if (socket[REFUSAL_WAITS]) return; // the parser refuses each later packet again
  socket[REFUSAL_WAITS] = true;
  socket.pause();
  res.once('close', () => {
    if (!res.writableFinished || !res.shouldKeepAlive) return; // Node ends or has destroyed the connection
    // The refused bytes came right after this answer's request: what they start is known.
    socket[ANSWERED_AT] = (socket.bytesRead ?? 0) - (Buffer.isBuffer(err.rawPacket) ? err.rawPacket.length : 0);
    socket[CURRENT] = undefined;
    refuseUnparsed(err, socket, deps);
  });
}

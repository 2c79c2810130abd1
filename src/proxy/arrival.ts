/**
 * What the exchange learns of a request as it arrives: the client's address (DESIGN
 * section 4) and the pipeline's view of the request (its head, and its body on demand).
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import { clientAddress, type Cidr } from '../policy/network.js';
import { readModelBody, type BodyResult, type ReadOptions } from './body/read.js';
import { openUpload, type UploadResult } from './body/upload.js';
import type { KeyMemo } from '../auth/hash.js';
import type { RequestInput } from './pipeline.js';

/** Every X-Forwarded-For line, in order (Node joins them, but only for headers it knows to join). */
function forwardedFor(rawHeaders: readonly string[]): string[] {
  const out: string[] = [];
  for (let i = 0; i < rawHeaders.length; i += 2) {
    const name = rawHeaders[i]!;
    if (name.length === 15 && name.toLowerCase() === 'x-forwarded-for') out.push(rawHeaders[i + 1]!);
  }
  return out;
}

/** A socket's client address, when it depends on the peer alone (no trusted proxies). */
const PEER_CLIENT = Symbol('keyward.peerClient');
type PeerSocket = Socket & { [PEER_CLIENT]?: string | null };

/**
 * The client's address (DESIGN section 4). Without trusted proxies it is the socket's
 * peer, the same for every request on a connection, so it is read and checked once per
 * connection rather than once per request.
 */
export function clientIpOf(req: IncomingMessage, trustedProxies: readonly Cidr[]): string | null {
  if (trustedProxies.length > 0) return clientAddress({ peer: req.socket.remoteAddress, forwardedFor: forwardedFor(req.rawHeaders), trusted: trustedProxies });
  const socket = req.socket as PeerSocket;
  let ip = socket[PEER_CLIENT];
  if (ip === undefined) {
    ip = clientAddress({ peer: socket.remoteAddress, forwardedFor: [], trusted: trustedProxies });
    // Not known before the socket is connected; asked again next time.
    if (socket.remoteAddress !== undefined) socket[PEER_CLIENT] = ip;
  }
  return ip;
}

/**
 * What the pipeline reads of an arriving request (its head, and its body on demand).
 *
 * It also holds the connection's reading while a complete request waits for a decision
 * that takes a round trip (DESIGN section 5: a client that half-closes after sending its
 * request still gets the whole answer). Node ends a connection as soon as it reads the
 * client's FIN, so an answer decided after a call to Redis would find it ended; with
 * reading held, the FIN is read after the answer. The check runs once the event loop's
 * turn has run every promise step of the decision, so a request decided in that turn (most
 * are) pauses nothing. The exchange lets go when it forwards (from then on a FIN means the
 * client has gone, as before) or when the response closes.
 */
export class Arrival implements RequestInput {
  readonly method: string;
  readonly url: string;
  readonly rawHeaders: readonly string[];
  readonly clientIp: string | null;
  readonly keyMemo: KeyMemo;
  readonly expectContinue: boolean;
  private readonly req: IncomingMessage;
  private readonly res: ServerResponse;
  /** neither forwarded nor answered yet */
  private pending = true;
  /** this request paused its connection's reading */
  private holding = false;
  /** the decision reads the body (a model route's): reading must go on until it has all of it */
  private bodyWanted = false;
  /** pauses the connection again while reading is held */
  private repause: (() => void) | null = null;

  constructor(o: { req: IncomingMessage; res: ServerResponse; expectContinue: boolean; clientIp: string | null; method: string; keyMemo: KeyMemo }) {
    this.req = o.req;
    this.res = o.res;
    this.expectContinue = o.expectContinue;
    this.clientIp = o.clientIp;
    this.keyMemo = o.keyMemo;
    this.method = o.method;
    this.url = o.req.url ?? '/';
    this.rawHeaders = o.req.rawHeaders;
  }

  readBody(opts: ReadOptions): Promise<BodyResult> {
    this.bodyWanted = true;
    // Expect: 100-continue is answered only once the credentials and the body's head have been checked.
    return readModelBody(this.req, opts, this.expectContinue ? () => this.res.writeContinue() : undefined);
  }

  openUpload(opts: { limit: number }): UploadResult {
    return openUpload(this.req, opts);
  }

  /**
   * Holds reading if the request is still neither forwarded nor answered once this turn's
   * promise steps have all run: a tick queued from a microtask runs after the whole
   * microtask queue, and before Node reads the connection again. Called when the request
   * arrives; a body still on its way is waited for.
   */
  holdIfStillPending(): void {
    queueMicrotask(() => process.nextTick(holdPending, this));
  }

  /** Pauses the connection's reading until letGo, unless the answer is out or something else paused it. */
  holdReading(): void {
    const socket = this.req.socket;
    if (!this.pending || this.holding || this.res.writableEnded || socket.isPaused()) return;
    // Reading is what brings the rest of a body the decision reads: held only once it is
    // all here. A body the decision does not read (a files upload, a body on GET /v1/key)
    // waits unread, and reading is held at once: Node reads the FIN right after the body,
    // even before it reports the body complete.
    if (this.bodyWanted && !this.req.complete) return void this.req.once('end', () => this.holdIfStillPending());
    this.holding = true;
    // An unread body's stream resumes its socket whenever it wants more: paused again at once.
    socket.on('resume', (this.repause ??= () => socket.pause()));
    socket.pause();
  }

  /** Whether reading is held for this request now (its decision waited on a round trip). */
  get heldReading(): boolean {
    return this.holding;
  }

  /**
   * Lets go of held reading, then calls `next` once what came meanwhile has been read (the
   * loop's next read turn has run): whether the client left while the decision waited (a
   * FIN, a reset), seen before anything is forwarded.
   */
  letGoThen(next: (gone: boolean) => void): void {
    this.letGo();
    const socket = this.req.socket;
    setImmediate(() => setImmediate(() => next(socket.destroyed || socket.readableEnded)));
  }

  /** Forwarded, or answered: nothing more is held for this request. */
  letGo(): void {
    this.pending = false;
    if (!this.holding) return;
    this.holding = false;
    const socket = this.req.socket;
    socket.off('resume', this.repause!);
    socket.resume();
  }
}

function holdPending(arrival: Arrival): void {
  arrival.holdReading();
}

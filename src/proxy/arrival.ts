/**
 * What the exchange learns of a request as it arrives: the client's address (DESIGN
 * section 4) and the pipeline's view of the request (its head, and its body on demand).
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import { clientAddress, type Cidr } from '../policy/network.js';
import { readModelBody, type BodyResult, type ReadOptions } from './body/read.js';
import { openUpload, type UploadResult } from './body/upload.js';
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

/** What the pipeline reads of an arriving request: a small object, with no closure per request. */
export class Arrival implements RequestInput {
  readonly method: string;
  readonly url: string;
  readonly rawHeaders: readonly string[];
  readonly clientIp: string | null;
  readonly expectContinue: boolean;
  private readonly req: IncomingMessage;
  private readonly res: ServerResponse;

  constructor(o: { req: IncomingMessage; res: ServerResponse; expectContinue: boolean; clientIp: string | null; method: string }) {
    this.req = o.req;
    this.res = o.res;
    this.expectContinue = o.expectContinue;
    this.clientIp = o.clientIp;
    this.method = o.method;
    this.url = o.req.url ?? '/';
    this.rawHeaders = o.req.rawHeaders;
  }

  readBody(opts: ReadOptions): Promise<BodyResult> {
    // Expect: 100-continue is answered only once the credentials and the body's head have been checked.
    return readModelBody(this.req, opts, this.expectContinue ? () => this.res.writeContinue() : undefined);
  }

  openUpload(opts: { limit: number }): UploadResult {
    return openUpload(this.req, opts);
  }
}

/**
 * The upstream's response on its way to the client: its head written once, its body
 * relayed chunk by chunk. http-proxy-3's own response passes copy the upstream's headers
 * into the client's response one setHeader call at a time (each validated, then walked
 * again when the head is written), after Node has built a header object from the raw
 * lines for them, and then pipe the body, which adds and later removes a set of listeners
 * on every response. Here the raw lines are read once into the list that writeHead takes,
 * and one 'data' listener shared by every response feeds the client and the usage tap.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import { connectionTokens, HOP_BY_HOP_NAMES, NameSet } from './header-lines.js';

/** Fed the response body as it passes (the usage tap). */
export interface BodyWatcher {
  push(chunk: Buffer): void;
}

/**
 * The response header names never relayed: the hop-by-hop ones; Transfer-Encoding, since
 * the client's framing is Node's to choose for its own connection; and `replaced`, those
 * the sidecar always writes itself on a forwarded response (the key's own rate-limit
 * figures), so the upstream's are dropped.
 */
export const responseDrops = (replaced: readonly string[]): NameSet => new NameSet([...HOP_BY_HOP_NAMES, 'transfer-encoding', ...replaced]);

/** The response head to send: the upstream's lines less what is dropped, then the sidecar's own. */
export class ResponseHead {
  /** name, value, name, value, ... as the upstream wrote them: what writeHead takes */
  readonly lines: string[] = [];
  /** each line's name in lower case, for lookups */
  private readonly names: string[] = [];
  /** the upstream's first Keep-Alive line (hop-by-hop, so not relayed), for its agent */
  readonly keepAlive: string | null = null;
  /**
   * The upstream's Transfer-Encoding names a coding besides chunked (gzip, say): its body
   * cannot be relayed as it is, since the client's framing is Node's and would drop the
   * coding, leaving coded bytes no header names.
   */
  readonly foreignCoding: boolean = false;

  /** `drops`: the names not relayed (responseDrops) */
  constructor(proxyRes: IncomingMessage, drops: NameSet) {
    const raw = proxyRes.rawHeaders;
    let named: string[] | null = null;
    for (let i = 0; i < raw.length; i += 2) {
      const name = raw[i]!.toLowerCase();
      if (name === 'connection') {
        const tokens = connectionTokens(raw[i + 1]!);
        if (tokens.length > 0) (named ??= []).push(...tokens);
      }
      if (name === 'keep-alive') this.keepAlive ??= raw[i + 1]!;
      else if (name === 'transfer-encoding' && raw[i + 1]!.trim().toLowerCase() !== 'chunked') this.foreignCoding = true;
      if (drops.has(name)) continue;
      this.lines.push(raw[i]!, raw[i + 1]!);
      this.names.push(name);
    }
    if (named !== null) this.drop(named);
  }

  /** The upstream's first value of a header (name in lower case), or undefined. */
  get(name: string): string | undefined {
    const names = this.names;
    for (let j = 0; j < names.length; j++) if (names[j] === name) return this.lines[2 * j + 1];
    return undefined;
  }

  /** A header sent after the upstream's (its name in lower case). */
  add(name: string, value: string): void {
    this.lines.push(name, value);
    this.names.push(name);
  }

  /**
   * Removes the upstream's CORS grants (`access-control-*`): keyward never answers a CORS
   * preflight with CORS headers (DESIGN section 4), a forwarded one included.
   */
  dropCorsGrants(): void {
    this.drop((name) => name.startsWith('access-control-'));
  }

  /** Removes every line whose name is listed (headers the upstream's Connection named) or passes the test. */
  private drop(names: readonly string[] | ((name: string) => boolean)): void {
    const { lines, names: lower } = this;
    const dropped = typeof names === 'function' ? names : (name: string) => names.includes(name);
    let kept = 0;
    for (let j = 0; j < lower.length; j++) {
      if (dropped(lower[j]!)) continue;
      lines[2 * kept] = lines[2 * j]!;
      lines[2 * kept + 1] = lines[2 * j + 1]!;
      lower[kept++] = lower[j]!;
    }
    lines.length = 2 * kept;
    lower.length = kept;
  }
}

/** The client's response and the watcher, on the upstream response that feeds them. */
const CLIENT = Symbol('keyward.clientResponse');
const WATCHER = Symbol('keyward.bodyWatcher');
/** The upstream response a paused relay waits to resume, on the client's response. */
const SOURCE = Symbol('keyward.relaySource');
type Source = IncomingMessage & { [CLIENT]?: ServerResponse; [WATCHER]?: BodyWatcher | null };
type Sink = ServerResponse & { [SOURCE]?: Source };

function relayChunk(this: Source, chunk: Buffer): void {
  this[WATCHER]?.push(chunk);
  const res = this[CLIENT]!;
  if (!res.write(chunk) && !res.destroyed) {
    // The client reads slower than the upstream sends: wait for it.
    this.pause();
    (res as Sink)[SOURCE] = this;
    res.once('drain', resumeSource);
  }
}

function resumeSource(this: Sink): void {
  this[SOURCE]?.resume();
}

function relayEnd(this: Source): void {
  this[CLIENT]!.end();
}

/** Responses whose upstream stopped before the end of its response (few: a set kept only for them). */
const cutByUpstream = new WeakSet<ServerResponse>();

/** Whether `res` was cut because its upstream's response stopped short (not because the client left). */
export const wasCutByUpstream = (res: ServerResponse): boolean => cutByUpstream.has(res);

/** Marks a client response cut because its upstream stopped mid-response. */
export function markCutByUpstream(res: ServerResponse): void {
  if (!res.destroyed) cutByUpstream.add(res);
}

/** An upstream that dies mid-response must not leave the client on an open, seemingly healthy stream. */
function cutClientIfIncomplete(this: Source): void {
  if (this.complete) return;
  const res = this[CLIENT];
  if (!res) return;
  markCutByUpstream(res);
  res.destroy();
}

/**
 * Writes the head (unless the client was answered already) and relays the body; `watcher`
 * sees every chunk before the client is given it. A head Node refuses to write (an
 * invalid header from the upstream) cuts both sides instead of throwing out of the socket.
 */
export function relay(proxyRes: IncomingMessage, res: ServerResponse, opts: { head: ResponseHead; watcher: BodyWatcher | null }): void {
  const source = proxyRes as Source;
  source[CLIENT] = res;
  source[WATCHER] = opts.watcher;
  // 'close' and 'end' come once each: a plain listener does what `once` would, without
  // the wrapper `once` makes and the removal it does when the event comes.
  proxyRes.on('close', cutClientIfIncomplete);
  if (!res.headersSent) {
    try {
      // The reason as the upstream gave it, an empty one included (Node would put its own there).
      res.writeHead(proxyRes.statusCode!, proxyRes.statusMessage ?? '', opts.head.lines);
    } catch {
      res.destroy();
      proxyRes.destroy();
      return;
    }
  }
  if (res.writableEnded) return;
  proxyRes.on('data', relayChunk);
  proxyRes.on('end', relayEnd);
  sendHeadIfBodyWaits(res);
}

/**
 * Node writes a response's head with its first body bytes. Those that came in the packet
 * with the upstream's head have been relayed once the parser's turn is over (its data
 * events and their ticks run first); a body still to come (a model that thinks before its
 * first token, a long poll) must not hold the head back from the client meanwhile.
 */
function sendHeadIfBodyWaits(res: ServerResponse): void {
  const socket = res.socket;
  if (socket === null) return;
  const written = socket.bytesWritten;
  queueMicrotask(() => {
    if (socket.bytesWritten === written && !res.writableEnded && !res.destroyed) res.flushHeaders();
  });
}

/**
 * The upstream keep-alive agent: Node's http.Agent (or https.Agent), its pool, limits,
 * queue and Keep-Alive handling Node's own, with documented hooks overridden (and
 * `destroy`, which also stops the sweep below):
 *
 * - `keepSocketAlive` (a socket goes back to the pool): the socket is marked idle, and any
 *   byte that arrives on it while idle gets it destroyed. Such bytes answer a request it was
 *   not sent (the upstream read a second request somewhere, or doubled a response); handed
 *   to the next request they would become that request's response.
 * - `reuseSocket` (a pooled socket is given to a request): the socket is busy again; one
 *   with unread bytes is destroyed instead.
 * - `createConnection`: what watches a socket is attached once, when it is made, not per
 *   request: the stray-byte listener (which lets a busy socket's bytes pass) and its place
 *   in the agent's sweep.
 *
 * Timeouts are one sweep per agent, not socket timers. A socket timer (Node's `timeout`
 * agent option) is set, cleared and set again on every request, and moved on every read
 * and write; the sweep looks at each socket a few times a second instead. A busy socket
 * whose byte counts (`bytesRead`, `bytesWritten`) have not moved for the upstream's
 * `timeoutMs` is destroyed with UpstreamTimeout, which its request reports as its error.
 * An idle one is closed quietly after IDLE_MAX_MS (or `timeoutMs` when shorter), or sooner
 * when the upstream's last `Keep-Alive: timeout=N` hint says it closes idle connections
 * sooner (`noteKeepAlive`).
 */
import http from 'node:http';
import https from 'node:https';
import type { Socket } from 'node:net';
import type { Duplex } from 'node:stream';

export class UpstreamTimeout extends Error {
  readonly code = 'UPSTREAM_TIMEOUT';
}

export interface UpstreamAgentOptions {
  tls: boolean;
  /** longest quiet spell of a socket, busy or idle (0: none; idle ones then follow the upstream's hint alone) */
  timeoutMs: number;
}

/** Pooling that suits a sidecar: reuse the warmest socket, keep plenty idle, never queue. */
const POOL: http.AgentOptions = { keepAlive: true, keepAliveMsecs: 1000, maxSockets: Infinity, maxFreeSockets: 256, scheduling: 'lifo' };

/** The longest time between two looks at a socket; shorter timeouts are looked at four times each. */
const SWEEP_MAX_MS = 250;
/** An idle socket is closed this long before the upstream's Keep-Alive hint runs out (Node's own margin). */
const HINT_MARGIN_MS = 1000;
/**
 * The longest an idle socket is kept without a hint: many servers close idle connections
 * after 5 s and say nothing (uvicorn, Go's and Node's own defaults), and a request sent on
 * a socket the upstream is closing fails (502). Node's own global agent keeps idle sockets
 * 5 s; a few more handshakes an idle minute cost nothing next to that.
 */
export const IDLE_MAX_MS = 4000;

/** One socket as the sweep sees it. */
interface Watch {
  busy: boolean;
  /** how long an idle spell may last, from the upstream's last Keep-Alive hint (Infinity: none) */
  idleMs: number;
  /** at the last look: busy, the byte counts, and since when all three have been as they are */
  seenBusy: boolean;
  read: number;
  written: number;
  quietSince: number;
}

/** Every live socket of every upstream agent, for noteKeepAlive. */
const watches = new WeakMap<Duplex, Watch>();

let lastHint: string | null = null;
let lastHintMs = Infinity;

/**
 * Tells the socket's agent what the upstream's response on it said of idle connections
 * (its first Keep-Alive line, which the relay's pass over the raw lines finds: Node's
 * header object is built on first use, and building it for this one line cost more than
 * all the rest of the hint's handling). The socket then goes back to the pool for at most
 * that long. Called with each upstream response; one without the header (null) leaves the
 * last hint in force.
 */
export function noteKeepAlive(socket: Duplex | null, hint: string | null): void {
  if (hint === null) return;
  const w = socket && watches.get(socket);
  if (!w) return;
  if (hint !== lastHint) {
    const seconds = /^\s*timeout=(\d+)/i.exec(hint)?.[1];
    lastHint = hint;
    lastHintMs = seconds === undefined ? Infinity : Number(seconds) * 1000 - HINT_MARGIN_MS;
  }
  w.idleMs = lastHintMs;
}

// eslint-disable-next-line @typescript-eslint/no-explicit-any -- a mixin's base takes any arguments (TypeScript's rule)
type AgentClass = new (...args: any[]) => http.Agent;

/**
 * One agent's sockets, looked at together every `sweepMs`: a busy spell longer than the
 * timeout ends the socket with UpstreamTimeout, an idle one longer than its limit closes
 * it quietly. `timeoutMs` 0 leaves busy sockets without a timeout.
 */
class SocketSweep {
  readonly #live = new Map<Socket, Watch>();
  #timer: NodeJS.Timeout | null = null;
  readonly #message: string;
  readonly #busyLimit: number;
  readonly #sweepMs: number;

  constructor(timeoutMs: number) {
    this.#message = `no answer from upstream within ${timeoutMs} ms`;
    this.#busyLimit = timeoutMs > 0 ? timeoutMs : Infinity;
    this.#sweepMs = timeoutMs > 0 ? Math.max(10, Math.min(SWEEP_MAX_MS, timeoutMs / 4)) : SWEEP_MAX_MS;
  }

  /**
   * A spell is seen to start up to one look late and to end up to one look late: an idle
   * socket is closed two looks before its hint's end, so never after it.
   */
  #idleLimit(w: Watch): number {
    return Math.min(this.#busyLimit, Math.min(w.idleMs, IDLE_MAX_MS) - 2 * this.#sweepMs);
  }

  #look(): void {
    const now = performance.now();
    for (const [socket, w] of this.#live) {
      const read = socket.bytesRead;
      const written = socket.bytesWritten;
      if (read !== w.read || written !== w.written || w.busy !== w.seenBusy) {
        w.read = read;
        w.written = written;
        w.seenBusy = w.busy;
        w.quietSince = now;
      } else if (now - w.quietSince >= (w.busy ? this.#busyLimit : this.#idleLimit(w))) {
        socket.destroy(w.busy ? new UpstreamTimeout(this.#message) : undefined);
      }
    }
  }

  /** Watches a new socket (busy: it is made for a request) for the rest of its life. */
  watch(socket: Socket): void {
    const w: Watch = { busy: true, idleMs: Infinity, seenBusy: true, read: 0, written: 0, quietSince: performance.now() };
    watches.set(socket, w);
    this.#live.set(socket, w);
    // One listener for the socket's life: adding and removing one per request cost more
    // than the check it makes on each chunk of a busy socket's response. Recent Node
    // releases guard free sockets too, undocumented and not on every hand-off path; this
    // guard does not rely on it.
    socket.on('data', () => {
      if (!w.busy) socket.destroy();
    });
    socket.once('close', () => {
      this.#live.delete(socket);
      if (this.#live.size === 0) this.stop();
    });
    this.#timer ??= setInterval(() => this.#look(), this.#sweepMs).unref();
  }

  stop(): void {
    if (this.#timer) clearInterval(this.#timer);
    this.#timer = null;
  }
}

/** Base with the hooks above, and a sweep of its own sockets. */
function guarded<B extends AgentClass>(Base: B, timeoutMs: number) {
  return class extends Base {
    readonly #sweep = new SocketSweep(timeoutMs);

    override keepSocketAlive(socket: Duplex): boolean {
      const keep = super.keepSocketAlive(socket) as unknown as boolean;
      const w = watches.get(socket);
      if (keep && w) w.busy = false;
      return keep;
    }

    override reuseSocket(socket: Duplex, req: http.ClientRequest): void {
      const w = watches.get(socket);
      if (w) w.busy = true;
      if (socket.readableLength > 0) socket.destroy();
      super.reuseSocket(socket, req);
    }

    override createConnection(options: http.ClientRequestArgs, callback?: (err: Error | null, stream: Duplex) => void): Duplex | null | undefined {
      const socket = super.createConnection(options, callback);
      if (socket) this.#sweep.watch(socket as Socket);
      return socket;
    }

    override destroy(): void {
      super.destroy();
      this.#sweep.stop();
    }
  };
}

export function createUpstreamAgent(o: UpstreamAgentOptions): http.Agent {
  const Agent = guarded(o.tls ? (https.Agent as AgentClass) : http.Agent, o.timeoutMs);
  return new Agent(POOL);
}

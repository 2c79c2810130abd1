/**
 * The upstream keep-alive agent: Node's http.Agent (or https.Agent), its pool, limits,
 * queue and Keep-Alive handling Node's own, with three documented hooks overridden:
 *
 * - `keepSocketAlive` (a socket goes back to the pool): the socket is marked idle, and any
 *   byte that arrives on it while idle gets it destroyed. Such bytes answer a request it was
 *   not sent (the upstream read a second request somewhere, or doubled a response); handed
 *   to the next request they would become that request's response.
 * - `reuseSocket` (a pooled socket is given to a request): the socket is busy again; one
 *   with unread bytes is destroyed instead, and its idle timer, which a short Keep-Alive
 *   hint may have shortened, is the upstream's timeout again.
 * - `createConnection`: what watches a socket is attached once, when it is made, not per
 *   request: the stray-byte listener (which lets a busy socket's bytes pass) and the
 *   upstream's timeout. A socket that goes quiet while busy is destroyed with
 *   UpstreamTimeout, which its request reports as its error; an idle one is Node's to close.
 */
import http from 'node:http';
import https from 'node:https';
import type { Duplex } from 'node:stream';

export class UpstreamTimeout extends Error {
  readonly code = 'UPSTREAM_TIMEOUT';
}

export interface UpstreamAgentOptions {
  tls: boolean;
  /** longest quiet spell of a busy socket (0: none) */
  timeoutMs: number;
}

/** Pooling that suits a sidecar: reuse the warmest socket, keep plenty idle, never queue. */
const POOL: http.AgentOptions = { keepAlive: true, keepAliveMsecs: 1000, maxSockets: Infinity, maxFreeSockets: 256, scheduling: 'lifo' };

// eslint-disable-next-line @typescript-eslint/no-explicit-any -- a mixin's base takes any arguments (TypeScript's rule)
type AgentClass = new (...args: any[]) => http.Agent;

/** Base with the three hooks above; `timeoutMs` 0 leaves timeouts to Node. */
function guarded<B extends AgentClass>(Base: B, timeoutMs: number) {
  const idle = new WeakSet<Duplex>();
  const message = `no answer from upstream within ${timeoutMs} ms`;
  function onSocketTimeout(this: Duplex): void {
    if (!idle.has(this)) this.destroy(new UpstreamTimeout(message));
  }
  // One listener for the socket's life: adding and removing one per request cost more than
  // the check it makes on each chunk of a busy socket's response. Recent Node releases guard
  // free sockets too, undocumented and not on every hand-off path; this guard does not rely on it.
  function destroyOnStrayBytes(this: Duplex): void {
    if (idle.has(this)) this.destroy();
  }
  return class extends Base {
    override keepSocketAlive(socket: Duplex): boolean {
      const keep = super.keepSocketAlive(socket) as unknown as boolean;
      if (keep) idle.add(socket);
      return keep;
    }

    override reuseSocket(socket: Duplex, req: http.ClientRequest): void {
      idle.delete(socket);
      if (socket.readableLength > 0) socket.destroy();
      else if (timeoutMs > 0 && (socket as Duplex & { timeout?: number }).timeout !== timeoutMs) (socket as Duplex & { setTimeout(ms: number): void }).setTimeout(timeoutMs);
      super.reuseSocket(socket, req);
    }

    override createConnection(options: http.ClientRequestArgs, callback?: (err: Error | null, stream: Duplex) => void): Duplex | null | undefined {
      const socket = super.createConnection(options, callback);
      socket?.on('data', destroyOnStrayBytes);
      if (timeoutMs > 0) socket?.on('timeout', onSocketTimeout);
      return socket;
    }
  };
}

export function createUpstreamAgent(o: UpstreamAgentOptions): http.Agent {
  const options: http.AgentOptions = o.timeoutMs > 0 ? { ...POOL, timeout: o.timeoutMs } : POOL;
  const Agent = guarded(o.tls ? (https.Agent as AgentClass) : http.Agent, o.timeoutMs);
  return new Agent(options);
}

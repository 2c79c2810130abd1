/**
 * The upstream keep-alive agent: Node's http.Agent with two of its per-request steps made
 * cheaper, and nothing else changed (its pool, limits, queue, timeouts and events are
 * Node's own).
 *
 * - Taking a pooled socket: Node's addRequest first copies the call's options and the
 *   agent's into a new dictionary object and works out a TLS server name from the Host
 *   header, both per request and both needed only to open a new connection. For a plain
 *   HTTP agent the pool's name is the same from the call's options alone, so a request
 *   that finds a pooled socket takes it without them; every other case (no pooled socket,
 *   a queue, TLS) goes through Node's own addRequest.
 * - Returning a socket to the pool: Node reads the response's `Keep-Alive: timeout=N` hint
 *   from `res.headers`, which builds the whole header object of every upstream response
 *   that nothing else reads (the relay works from the raw lines); here the hint is read
 *   from the raw lines.
 */
import http from 'node:http';
import { Socket } from 'node:net';

type Pooled = Socket & { _httpMessage?: (http.ClientRequest & { res?: http.IncomingMessage }) | null };
interface AgentInternals {
  freeSockets: Record<string, Pooled[] | undefined>;
  sockets: Record<string, Pooled[] | undefined>;
  options: { timeout?: number };
  keepAliveMsecs: number;
  getName(options: unknown): string;
  reuseSocket(socket: Pooled, req: http.ClientRequest): void;
}

/** Node's id field on a socket, reset for each request it carries (async_hooks); found by its name. */
const ASYNC_ID = Object.getOwnPropertySymbols(new Socket()).find((s) => s.description === 'async_id_symbol');

/** The resource a reused handle reports to async hooks, shaped as Node's own (ReusedHandle). */
class ReusedHandle {
  constructor(
    readonly type: number,
    readonly handle: unknown,
  ) {}
}

/** What Node's asyncResetHandle does: the reused socket's handle gets a new async id. */
function asyncReset(socket: Pooled, asyncId: symbol): void {
  const handle = (socket as unknown as { _handle?: { asyncReset?(r: unknown): void; getProviderType(): number; getAsyncId(): number } })._handle;
  if (handle && typeof handle.asyncReset === 'function') {
    handle.asyncReset(new ReusedHandle(handle.getProviderType(), handle));
    (socket as unknown as Record<symbol, number>)[asyncId] = handle.getAsyncId();
  }
}

/** The seconds a `Keep-Alive: timeout=N` line gives, from raw header lines (first such line); null without one. */
export function keepAliveHint(raw: readonly string[]): number | null {
  for (let i = 0; i < raw.length; i += 2) {
    const name = raw[i]!;
    if (name.length !== 10 || name.toLowerCase() !== 'keep-alive') continue;
    const m = /^timeout=(\d+)/.exec(raw[i + 1]!);
    return m ? Number.parseInt(m[1]!, 10) : null;
  }
  return null;
}

/** Node's own margin: the pool lets a socket go this long before the server's announced timeout. */
const KEEP_ALIVE_TIMEOUT_BUFFER_MS = 1000;

/** What Node's getName reads of a call's options (a plain HTTP agent's). */
interface NameFields {
  host?: string;
  port?: number | string;
  localAddress?: string;
  family?: number;
  socketPath?: string;
}

/**
 * The pool's name for a call's options, kept from the last call with the same fields: every
 * call to one upstream has the same name, and a name built anew is a new string to hash
 * for each lookup in the pool.
 */
function poolName(agent: AgentInternals, last: { fields: NameFields | null; name: string }, o: NameFields): string {
  const f = last.fields;
  if (f !== null && f.host === o.host && f.port === o.port && f.localAddress === o.localAddress && f.family === o.family && f.socketPath === o.socketPath) return last.name;
  last.fields = { host: o.host, port: o.port, localAddress: o.localAddress, family: o.family, socketPath: o.socketPath };
  last.name = agent.getName(o);
  return last.name;
}

/** Takes a pooled socket for `req` the way Node's addRequest does; false when there is none to take. */
function takePooled(agent: AgentInternals, req: http.ClientRequest, name: string, asyncId: symbol): boolean {
  const free = agent.freeSockets[name];
  if (free === undefined) return false;
  let socket: Pooled | undefined;
  while (free.length > 0) {
    const s = free.pop()!;
    if (!s.destroyed) {
      socket = s;
      break;
    }
  }
  // Node's pool drops the entry of an empty list (its removeSocket reads a missing one as none)
  if (free.length === 0) delete agent.freeSockets[name];
  if (!socket) return false;
  asyncReset(socket, asyncId);
  agent.reuseSocket(socket, req);
  req.onSocket(socket);
  const timeout = (req as { timeout?: number }).timeout;
  if (timeout !== undefined && timeout !== (agent.options.timeout || 0)) socket.setTimeout(timeout);
  (agent.sockets[name] ??= []).push(socket);
  return true;
}

/** Node's keepSocketAlive, reading the Keep-Alive hint from the raw lines. */
function keepSocketAlive(this: AgentInternals, socket: Pooled): boolean {
  socket.setKeepAlive(true, this.keepAliveMsecs);
  socket.unref();
  let timeout = this.options.timeout || 0;
  let keep = true;
  const res = socket._httpMessage?.res;
  const hint = res ? keepAliveHint(res.rawHeaders) : null;
  if (hint !== null) {
    const ms = hint * 1000 - KEEP_ALIVE_TIMEOUT_BUFFER_MS;
    if (ms <= 0) keep = false;
    else if (ms < timeout) timeout = ms;
  }
  if (socket.timeout !== timeout) socket.setTimeout(timeout);
  return keep;
}

/** `agent` with the two steps above; an HTTPS agent gets only the second (its pool names carry the TLS server name). */
export function leanAgent<A extends http.Agent>(agent: A, opts: { tls: boolean }): A {
  const a = agent as unknown as AgentInternals & { addRequest(req: http.ClientRequest, options: unknown): void; keepSocketAlive: typeof keepSocketAlive };
  a.keepSocketAlive = keepSocketAlive;
  if (opts.tls || ASYNC_ID === undefined) return agent;
  const asyncId = ASYNC_ID;
  const nodeAddRequest = a.addRequest.bind(a);
  const last = { fields: null as NameFields | null, name: '' };
  a.addRequest = (req, options) => {
    if (!takePooled(a, req, poolName(a, last, options as NameFields), asyncId)) nodeAddRequest(req, options);
  };
  return agent;
}

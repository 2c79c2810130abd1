/**
 * An open-loop, evenly paced load generator for latency. autocannon's fixed rate (-R)
 * gives each connection a quota per one-second tick, which it sends back to back as
 * soon as the tick starts, so its "fixed rate" is a burst at full speed followed by
 * idle time, and its latencies mix queueing into the figure. Here requests are
 * scheduled every 1/rate seconds (in groups per 1 ms timer tick), sent on an idle
 * keep-alive connection (a new one is opened when all are busy), and each latency is
 * measured from the request's scheduled time to the last byte of its response, so a
 * stall is charged to every request it delays (no coordinated omission).
 *
 * Responses must carry Content-Length (every server in this benchmark answers so).
 */
import net from 'node:net';

export interface PacedOptions {
  host: string;
  port: number;
  /** the complete request, bytes on the wire */
  request: Buffer;
  rate: number;
  durationMs: number;
  /** most connections opened; past this, requests wait (and their wait counts) */
  maxConnections?: number;
}

export interface PacedResult {
  sent: number;
  completed: number;
  errors: number;
  non2xx: number;
  connections: number;
  /** latencies in ms, in completion order */
  latencies: number[];
  /** each latency's scheduled send time, ms on performance.now()'s clock (same order) */
  scheduled: number[];
}

interface Conn {
  socket: net.Socket;
  busy: boolean;
  scheduledAt: number;
  buf: Buffer;
}

const HEADER_END = Buffer.from('\r\n\r\n');

export function paced(opts: PacedOptions): Promise<PacedResult> {
  const maxConnections = opts.maxConnections ?? 64;
  const conns: Conn[] = [];
  const idle: Conn[] = [];
  const backlog: number[] = [];
  const result: PacedResult = { sent: 0, completed: 0, errors: 0, non2xx: 0, connections: 0, latencies: [], scheduled: [] };
  const now = () => performance.now();
  const start = now();
  const intervalMs = 1000 / opts.rate;
  let scheduled = 0;
  let stopped = false;
  let finish!: () => void;
  const done = new Promise<void>((resolve) => (finish = resolve));

  const send = (c: Conn, scheduledAt: number) => {
    c.busy = true;
    c.scheduledAt = scheduledAt;
    result.sent++;
    c.socket.write(opts.request);
  };

  const release = (c: Conn) => {
    c.busy = false;
    const next = backlog.shift();
    if (next !== undefined) send(c, next);
    else idle.push(c);
    if (stopped && result.completed + result.errors >= result.sent && backlog.length === 0) finish();
  };

  const onData = (c: Conn, chunk: Buffer) => {
    c.buf = c.buf.length === 0 ? chunk : Buffer.concat([c.buf, chunk]);
    for (;;) {
      const end = c.buf.indexOf(HEADER_END);
      if (end < 0) return;
      const head = c.buf.subarray(0, end).toString('latin1');
      const m = /\r\ncontent-length:[ \t]*(\d+)/i.exec(head);
      if (!m) {
        result.errors++;
        c.socket.destroy();
        return;
      }
      const total = end + 4 + Number(m[1]);
      if (c.buf.length < total) return;
      const status = Number(head.slice(9, 12));
      c.buf = c.buf.subarray(total);
      result.completed++;
      if (status >= 200 && status < 300) {
        result.latencies.push(now() - c.scheduledAt);
        result.scheduled.push(c.scheduledAt);
      }
      else result.non2xx++;
      release(c);
    }
  };

  const open = (): Conn => {
    const c: Conn = { socket: net.connect({ host: opts.host, port: opts.port, noDelay: true }), busy: false, scheduledAt: 0, buf: Buffer.alloc(0) };
    result.connections++;
    conns.push(c);
    c.socket.on('data', (chunk: Buffer) => onData(c, chunk));
    c.socket.on('error', () => undefined);
    c.socket.on('close', () => {
      const i = conns.indexOf(c);
      if (i >= 0) conns.splice(i, 1);
      const j = idle.indexOf(c);
      if (j >= 0) idle.splice(j, 1);
      if (c.busy) {
        c.busy = false;
        result.errors++;
        if (stopped && result.completed + result.errors >= result.sent && backlog.length === 0) finish();
      }
    });
    return c;
  };

  const dispatch = (scheduledAt: number) => {
    const c = idle.pop() ?? (conns.length < maxConnections ? open() : null);
    if (c) send(c, scheduledAt);
    else backlog.push(scheduledAt);
  };

  const tick = () => {
    const t = now();
    const elapsed = t - start;
    const due = Math.min(Math.floor(elapsed / intervalMs) + 1, Math.floor(opts.durationMs / intervalMs));
    while (scheduled < due) {
      dispatch(start + scheduled * intervalMs);
      scheduled++;
    }
    if (elapsed >= opts.durationMs) {
      stopped = true;
      clearInterval(timer);
      if (result.completed + result.errors >= result.sent && backlog.length === 0) finish();
    }
  };
  const timer = setInterval(tick, 1);
  tick();

  const guard = setTimeout(() => finish(), opts.durationMs + 10_000);
  return done.then(() => {
    clearTimeout(guard);
    clearInterval(timer);
    for (const c of conns.slice()) c.socket.destroy();
    return result;
  });
}

export function percentile(sorted: readonly number[], p: number): number {
  if (sorted.length === 0) return NaN;
  const i = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1));
  return sorted[i]!;
}

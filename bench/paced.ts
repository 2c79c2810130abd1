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

/** Index of the end of the first complete response in `buf`, its status; null: not complete yet; 'bad': no Content-Length. */
function firstResponse(buf: Buffer): { total: number; status: number } | null | 'bad' {
  const end = buf.indexOf(HEADER_END);
  if (end < 0) return null;
  const head = buf.subarray(0, end).toString('latin1');
  const m = /\r\ncontent-length:[ \t]*(\d+)/i.exec(head);
  if (!m) return 'bad';
  const total = end + 4 + Number(m[1]);
  return buf.length < total ? null : { total, status: Number(head.slice(9, 12)) };
}

/** One paced run: its connections, the requests waiting for one, and what was measured. */
class PacedRun {
  readonly result: PacedResult = { sent: 0, completed: 0, errors: 0, non2xx: 0, connections: 0, latencies: [], scheduled: [] };
  private readonly conns: Conn[] = [];
  private readonly idle: Conn[] = [];
  private readonly backlog: number[] = [];
  private readonly start = performance.now();
  private readonly intervalMs: number;
  private scheduled = 0;
  private stopped = false;
  private finish!: () => void;
  readonly done = new Promise<void>((resolve) => (this.finish = resolve));

  constructor(private readonly opts: PacedOptions & { maxConnections: number }) {
    this.intervalMs = 1000 / opts.rate;
  }

  /** Schedules every request due by now; past the duration, stops scheduling. Returns whether it stopped. */
  tick(): boolean {
    const elapsed = performance.now() - this.start;
    const due = Math.min(Math.floor(elapsed / this.intervalMs) + 1, Math.floor(this.opts.durationMs / this.intervalMs));
    while (this.scheduled < due) {
      this.dispatch(this.start + this.scheduled * this.intervalMs);
      this.scheduled++;
    }
    if (elapsed < this.opts.durationMs) return false;
    this.stopped = true;
    this.finishIfDrained();
    return true;
  }

  close(): void {
    for (const c of this.conns.slice()) c.socket.destroy();
  }

  /** Ends the run with what was measured so far, answered or not. */
  giveUp(): void {
    this.finish();
  }

  /** Resolves `done` once the run has stopped and every request sent was answered or failed. */
  private finishIfDrained(): void {
    const r = this.result;
    if (this.stopped && r.completed + r.errors >= r.sent && this.backlog.length === 0) this.finish();
  }

  private dispatch(scheduledAt: number): void {
    const c = this.idle.pop() ?? (this.conns.length < this.opts.maxConnections ? this.open() : null);
    if (c) this.send(c, scheduledAt);
    else this.backlog.push(scheduledAt);
  }

  private send(c: Conn, scheduledAt: number): void {
    c.busy = true;
    c.scheduledAt = scheduledAt;
    this.result.sent++;
    c.socket.write(this.opts.request);
  }

  private release(c: Conn): void {
    c.busy = false;
    const next = this.backlog.shift();
    if (next !== undefined) this.send(c, next);
    else this.idle.push(c);
    this.finishIfDrained();
  }

  private onData(c: Conn, chunk: Buffer): void {
    c.buf = c.buf.length === 0 ? chunk : Buffer.concat([c.buf, chunk]);
    for (;;) {
      const response = firstResponse(c.buf);
      if (response === null) return;
      if (response === 'bad') {
        this.result.errors++;
        c.socket.destroy();
        return;
      }
      c.buf = c.buf.subarray(response.total);
      this.result.completed++;
      if (response.status >= 200 && response.status < 300) {
        this.result.latencies.push(performance.now() - c.scheduledAt);
        this.result.scheduled.push(c.scheduledAt);
      } else this.result.non2xx++;
      this.release(c);
    }
  }

  private open(): Conn {
    const c: Conn = { socket: net.connect({ host: this.opts.host, port: this.opts.port, noDelay: true }), busy: false, scheduledAt: 0, buf: Buffer.alloc(0) };
    this.result.connections++;
    this.conns.push(c);
    c.socket.on('data', (chunk: Buffer) => this.onData(c, chunk));
    c.socket.on('error', () => undefined);
    c.socket.on('close', () => this.onClose(c));
    return c;
  }

  /** A connection gone: a request it carried counts as an error. */
  private onClose(c: Conn): void {
    const i = this.conns.indexOf(c);
    if (i >= 0) this.conns.splice(i, 1);
    const j = this.idle.indexOf(c);
    if (j >= 0) this.idle.splice(j, 1);
    if (!c.busy) return;
    c.busy = false;
    this.result.errors++;
    this.finishIfDrained();
  }
}

export function paced(opts: PacedOptions): Promise<PacedResult> {
  const run = new PacedRun({ ...opts, maxConnections: opts.maxConnections ?? 64 });
  const timer = setInterval(() => {
    if (run.tick()) clearInterval(timer);
  }, 1);
  if (run.tick()) clearInterval(timer);
  // A server that never answers some requests: give up on them this long after the end.
  const guard = setTimeout(() => run.giveUp(), opts.durationMs + 10_000);
  return run.done.then(() => {
    clearTimeout(guard);
    clearInterval(timer);
    run.close();
    return run.result;
  });
}

export function percentile(sorted: readonly number[], p: number): number {
  if (sorted.length === 0) return NaN;
  const i = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1));
  return sorted[i]!;
}

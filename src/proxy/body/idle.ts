/**
 * Watching request bodies for a stall (`server.bodyIdleTimeoutMs`). One small object per
 * watched request, in a set that one interval per idle time sweeps: nothing per request
 * goes into Node's timer lists (an interval made and cleared for every request cost a
 * Timeout object and a timer-list insert and removal each, on nearly every request, since
 * a body is rarely complete when its head is handled).
 */
import type { IncomingMessage } from 'node:http';
import type { Socket } from 'node:net';
import { hasBody } from './read.js';
import { DenseSet } from '../../dense-set.js';

export interface BodyWatch {
  stop(): void;
}

const NOT_WATCHED: BodyWatch = { stop() {} };

/** Every watch of one idle time, checked together every quarter of it. */
class Sweep {
  /** not a Set: src/dense-set.ts says why */
  readonly watches = new DenseSet<IdleWatch<unknown>>();
  private timer: NodeJS.Timeout | null = null;

  constructor(private readonly everyMs: number) {}

  /** Returns the watch's index, which `delete` takes. */
  add(w: IdleWatch<unknown>): number {
    const index = this.watches.add(w);
    if (this.timer === null) {
      this.timer = setInterval(sweep, this.everyMs, this);
      this.timer.unref();
    }
    return index;
  }

  delete(index: number): void {
    this.watches.delete(index);
    if (this.watches.size === 0 && this.timer !== null) {
      clearInterval(this.timer);
      this.timer = null;
    }
  }
}

class IdleWatch<T> implements BodyWatch {
  readonly socket: Socket;
  lastBytes: number;
  lastChange: number;
  /** its slot in the sweep (-1: stopped) */
  private index: number;

  readonly req: IncomingMessage;
  readonly idleMs: number;
  readonly onIdle: (subject: T) => void;
  readonly subject: T;
  readonly now: () => number;
  private readonly sweep: Sweep;

  constructor(o: { req: IncomingMessage; idleMs: number; onIdle: (subject: T) => void; subject: T; now: () => number; sweep: Sweep }) {
    this.req = o.req;
    this.idleMs = o.idleMs;
    this.onIdle = o.onIdle;
    this.subject = o.subject;
    this.now = o.now;
    this.sweep = o.sweep;
    this.socket = o.req.socket;
    this.lastBytes = this.socket.bytesRead;
    this.lastChange = o.now();
    this.index = o.sweep.add(this as IdleWatch<unknown>);
  }

  stop(): void {
    if (this.index === -1) return;
    this.sweep.delete(this.index);
    this.index = -1;
  }

  /** One look: the body ended, moved, is held back by the sidecar, or has stalled for idleMs. */
  check(): void {
    const req = this.req;
    if (req.complete || req.destroyed) return this.stop();
    const bytes = this.socket.bytesRead;
    if (bytes !== this.lastBytes || req.isPaused()) {
      this.lastBytes = bytes;
      this.lastChange = this.now();
    } else if (this.now() - this.lastChange >= this.idleMs) {
      this.stop();
      this.onIdle(this.subject);
    }
  }
}

function sweep(s: Sweep): void {
  // A watch that stops during the loop leaves its slot; the walk passes over it.
  s.watches.forEach((w) => w.check());
}

/** One sweep per idle time in use (in practice one: `server.bodyIdleTimeoutMs`). */
const sweeps = new Map<number, Sweep>();

const WATCH = Symbol('keyward.bodyWatch');
type WatchedRequest = IncomingMessage & { [WATCH]?: BodyWatch };

function stopOnEnd(this: WatchedRequest): void {
  this[WATCH]?.stop();
}

/**
 * Calls `onIdle(subject)` once when the request body has been incomplete, and not held
 * back by the sidecar itself (paused for backpressure or admission), with no byte
 * arriving for `idleMs` (noticed within a quarter of it). Watches the socket's byte
 * count, so the body stream is never touched. Stops by itself when the body ends;
 * `stop()` stops it earlier.
 */
export function watchBodyIdle<T>(req: IncomingMessage, opts: { idleMs: number; onIdle: (subject: T) => void; subject: T; now?: () => number }): BodyWatch {
  if (opts.idleMs <= 0 || req.complete || !hasBody(req)) return NOT_WATCHED;
  const everyMs = Math.max(10, Math.floor(opts.idleMs / 4));
  let s = sweeps.get(everyMs);
  if (s === undefined) sweeps.set(everyMs, (s = new Sweep(everyMs)));
  const watch = new IdleWatch({ req, idleMs: opts.idleMs, onIdle: opts.onIdle, subject: opts.subject, now: opts.now ?? Date.now, sweep: s });
  (req as WatchedRequest)[WATCH] = watch;
  // 'end' comes once: a plain listener does what `once` would, without its wrapper.
  req.on('end', stopOnEnd);
  return watch;
}

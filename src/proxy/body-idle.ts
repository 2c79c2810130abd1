/**
 * Watching a request body for a stall (`server.bodyIdleTimeoutMs`). One small object and
 * one interval per watched request; the timer and 'end' callbacks are shared functions
 * that find their watch through their argument or the request, so watching allocates no
 * closure per request.
 */
import type { IncomingMessage } from 'node:http';
import type { Socket } from 'node:net';
import { hasBody } from './body.js';

export interface BodyWatch {
  stop(): void;
}

const NOT_WATCHED: BodyWatch = { stop() {} };

class IdleWatch<T> implements BodyWatch {
  readonly socket: Socket;
  lastBytes: number;
  lastChange: number;
  private readonly timer: NodeJS.Timeout;

  constructor(
    readonly req: IncomingMessage,
    readonly idleMs: number,
    readonly onIdle: (subject: T) => void,
    readonly subject: T,
    readonly now: () => number,
  ) {
    this.socket = req.socket;
    this.lastBytes = this.socket.bytesRead;
    this.lastChange = now();
    this.timer = setInterval(checkIdle, Math.max(10, Math.floor(idleMs / 4)), this);
    this.timer.unref();
  }

  stop(): void {
    clearInterval(this.timer);
  }
}

function checkIdle<T>(w: IdleWatch<T>): void {
  const req = w.req;
  if (req.complete || req.destroyed) return w.stop();
  const bytes = w.socket.bytesRead;
  if (bytes !== w.lastBytes || req.isPaused()) {
    w.lastBytes = bytes;
    w.lastChange = w.now();
  } else if (w.now() - w.lastChange >= w.idleMs) {
    w.stop();
    w.onIdle(w.subject);
  }
}

const WATCH = Symbol('keyward.bodyWatch');
type WatchedRequest = IncomingMessage & { [WATCH]?: BodyWatch };

function stopOnEnd(this: WatchedRequest): void {
  this[WATCH]?.stop();
}

/**
 * Calls `onIdle(subject)` once when the request body has been incomplete, and not held
 * back by the sidecar itself (paused for backpressure or admission), with no byte
 * arriving for `idleMs`. Watches the socket's byte count, so the body stream is never
 * touched. Stops by itself when the body ends; `stop()` stops it earlier.
 */
export function watchBodyIdle<T>(req: IncomingMessage, opts: { idleMs: number; onIdle: (subject: T) => void; subject: T; now?: () => number }): BodyWatch {
  if (opts.idleMs <= 0 || req.complete || !hasBody(req)) return NOT_WATCHED;
  const watch = new IdleWatch(req, opts.idleMs, opts.onIdle, opts.subject, opts.now ?? Date.now);
  (req as WatchedRequest)[WATCH] = watch;
  // 'end' comes once: a plain listener does what `once` would, without its wrapper.
  req.on('end', stopOnEnd);
  return watch;
}

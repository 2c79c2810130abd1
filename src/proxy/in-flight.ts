/**
 * What one connection may have in flight. Node parses every request a client pipelines as
 * it arrives (a whole read's worth at once), so one connection that sends requests and
 * reads nothing could have each decided and forwarded at once: an upstream socket and a
 * buffered response for each, a thousand for a few hundred KB sent. Past MAX_IN_FLIGHT
 * requests started and not yet answered, a request waits for one of them to close before
 * it is decided. Once MAX_IN_FLIGHT wait, the connection's reading stops as the next one
 * arrives, so no more are parsed than the read that brought it (Node parses a read whole);
 * fewer waiting requests leave reading on, so a client that pipelines an upload behind a
 * few requests keeps sending it. A request whose body is still to come when its turn comes
 * lets reading go on: no request that has begun waits for bytes behind the pause. Node
 * tells a request complete only after its 'request' event, so reading cannot wait for that.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Socket } from 'node:net';

/** Clients of model APIs do not pipeline: this many leaves room for one that does. */
export const MAX_IN_FLIGHT = 8;

/** A request waiting its turn, and what its start needs. */
export interface Waiting<T> {
  res: ServerResponse;
  payload: T;
}

interface Line {
  started: number;
  waiting: Waiting<unknown>[];
  /** set while this module holds the connection's reading */
  repause: (() => void) | null;
}

const LINE = Symbol('keyward.inFlight');
type Lined = Socket & { [LINE]?: Line };

/**
 * A request arrived: true when it may start now; false when it waits (with `payload`) for
 * fewer than MAX_IN_FLIGHT of its connection's to be in flight, which `answered` tells.
 */
export function mayStart<T>(req: IncomingMessage, res: ServerResponse, payload: T): boolean {
  const socket = req.socket as Lined | null;
  if (!socket) return true;
  const line = (socket[LINE] ??= { started: 0, waiting: [], repause: null });
  if (line.started < MAX_IN_FLIGHT) {
    line.started++;
    return true;
  }
  line.waiting.push({ res, payload });
  if (line.waiting.length > MAX_IN_FLIGHT) stopReading(socket, line);
  return false;
}

/**
 * A response closed (started or still waiting). Returns the waiting request that starts in
 * its place, if any; with none waiting, reading goes on.
 */
export function answered<T>(res: ServerResponse): Waiting<T> | null {
  const socket = res.req.socket as Lined | null;
  const line = socket?.[LINE];
  if (!socket || !line) return null;
  // A response is either started or waiting; waiting ones are rare.
  if (line.waiting.length > 0) {
    const i = line.waiting.findIndex((w) => w.res === res);
    if (i !== -1) return (line.waiting.splice(i, 1), null);
  }
  const next = line.waiting.shift();
  if (next) {
    if (!next.res.req.complete) goOnReading(socket, line);
    return next as Waiting<T>;
  }
  line.started--;
  goOnReading(socket, line);
  return null;
}

function goOnReading(socket: Lined, line: Line): void {
  if (line.repause === null) return;
  socket.off('resume', line.repause);
  line.repause = null;
  // Whatever else holds reading (Node's own backpressure, a decision's hold) pauses it again.
  socket.resume();
}

function stopReading(socket: Lined, line: Line): void {
  if (line.repause !== null || socket.destroyed || line.waiting.length === 0) return;
  // A request body's stream resumes its socket when it wants more: paused again at once.
  const repause = (line.repause = () => socket.pause());
  socket.on('resume', repause);
  socket.pause();
}

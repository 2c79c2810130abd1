/**
 * What one connection may have in flight. Node parses every request a client pipelines as
 * it arrives (a whole read's worth at once), so one connection that sends requests and
 * reads nothing could have each decided and forwarded at once: an upstream socket and a
 * buffered response for each, a thousand for a few hundred KB sent. Past MAX_IN_FLIGHT
 * requests started and not yet answered, a request waits for one of them to close before
 * it is decided, and the connection's reading stops until then, so no more are parsed.
 * Reading stops only once the newest request is complete: no request that has begun waits
 * for bytes behind the pause.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Socket } from 'node:net';

/** Clients of model APIs do not pipeline: this many leaves room for one that does. */
export const MAX_IN_FLIGHT = 8;

interface Line {
  started: number;
  waiting: { res: ServerResponse; start: () => void }[];
  /** set while this module holds the connection's reading */
  repause: (() => void) | null;
}

const LINE = Symbol('keyward.inFlight');
type Lined = Socket & { [LINE]?: Line };

/** A request arrived: `start` runs now, or once fewer than MAX_IN_FLIGHT of its connection's are in flight. */
export function arrived(req: IncomingMessage, res: ServerResponse, start: () => void): void {
  const socket = req.socket as Lined | null;
  if (!socket) return start();
  const line = (socket[LINE] ??= { started: 0, waiting: [], repause: null });
  if (line.started < MAX_IN_FLIGHT) return begin(line, start);
  line.waiting.push({ res, start });
  if (req.complete) stopReading(socket, line);
  else req.once('end', () => stopReading(socket, line));
}

/** A response closed (started or still waiting): the next waiting request starts, or reading goes on. */
export function answered(res: ServerResponse): void {
  const socket = res.req.socket as Lined | null;
  const line = socket?.[LINE];
  if (!socket || !line) return;
  // A response is either started or waiting; waiting ones are rare.
  if (line.waiting.length > 0) {
    const i = line.waiting.findIndex((w) => w.res === res);
    if (i !== -1) return void line.waiting.splice(i, 1);
  }
  line.started--;
  const next = line.waiting.shift();
  if (next) return begin(line, next.start);
  if (line.repause === null) return;
  socket.off('resume', line.repause);
  line.repause = null;
  // Whatever else holds reading (Node's own backpressure, a decision's hold) pauses it again.
  socket.resume();
}

function begin(line: Line, start: () => void): void {
  line.started++;
  start();
}

function stopReading(socket: Lined, line: Line): void {
  if (line.repause !== null || socket.destroyed || line.waiting.length === 0) return;
  // A request body's stream resumes its socket when it wants more: paused again at once.
  const repause = (line.repause = () => socket.pause());
  socket.on('resume', repause);
  socket.pause();
}

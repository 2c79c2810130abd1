/**
 * The response after which a connection closes, once keyward has committed to closing it
 * (an HTTP/1.0 client, a denial that leaves a large body unread, a stalled body, an unmet
 * expectation, a drain). Requests the client pipelined behind it would be decided,
 * forwarded and billed for answers that can never reach it: they are not forwarded.
 */
import type { ServerResponse } from 'node:http';
import type { Socket } from 'node:net';

const COUNT = Symbol('keyward.responsesOnSocket');
const LAST = Symbol('keyward.lastResponse');
const PLACE = Symbol('keyward.placeOnSocket');
type Counted = Socket & { [COUNT]?: number; [LAST]?: number };
type Placed = ServerResponse & { [PLACE]?: number };

/** Numbers a response in its connection's order as its request arrives; `last`: the connection closes after it. */
export function placeOnSocket(res: ServerResponse, o: { last: boolean }): void {
  const socket = res.req.socket as Counted | null;
  if (!socket) return;
  (res as Placed)[PLACE] = socket[COUNT] = (socket[COUNT] ?? 0) + 1;
  if (o.last) closesAfter(res);
}

/**
 * The connection closes after `res`: Node answers `Connection: close` and closes it (not a
 * header: headers set ahead would make the forwarder's one-shot head merge into them).
 */
export function closesAfter(res: ServerResponse): void {
  res.shouldKeepAlive = false;
  const socket = res.req.socket as Counted | null;
  const place = (res as Placed)[PLACE];
  if (!socket || place === undefined) return;
  if (socket[LAST] === undefined || place < socket[LAST]) socket[LAST] = place;
}

/** Whether a response before `res` closes the connection: `res` could never be delivered. */
export function closedBefore(res: ServerResponse): boolean {
  const last = (res.req.socket as Counted | null)?.[LAST];
  const place = (res as Placed)[PLACE];
  return last !== undefined && place !== undefined && last < place;
}

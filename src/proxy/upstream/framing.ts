/**
 * Request framing rules (DESIGN section 5, "Framing") that do not depend on the route:
 * which transfer codings may be forwarded, and the answers written straight on a socket
 * to what never became a request (a parser refusal, a CONNECT).
 */
import { maxHeaderSize, type IncomingMessage, type ServerResponse } from 'node:http';
import type { Duplex } from 'node:stream';
import { deny, renderError, type Denial, type ErrorStyle } from '../../errors.js';

/**
 * Whether a request's Transfer-Encoding value is one keyward does not forward. Node accepts
 * a transfer-coding list that ends in chunked (`gzip, chunked`); the upstream would decode
 * the other codings and read a body no one checked, so only plain `chunked` passes. Checked
 * before the decision (preflight.ts), so such a request takes from no limit.
 */
export function unforwardableCoding(te: string | undefined): boolean {
  return te !== undefined && te.trim().toLowerCase() !== 'chunked';
}

/**
 * Whether the request the parser refused may have been a HEAD: its answer then carries no
 * body, or a client (or a proxy in front) would read that body as the next response.
 * The method is only known for sure when the failing packet is everything the connection
 * sent after its last answered request (`answeredAt`: the socket's bytesRead when that
 * answer closed; 0 on a new connection); otherwise the start line may lie in an earlier
 * packet, so: maybe HEAD. On a reused connection the packet must also begin with a start
 * line: a client that pipelined may have sent part of the next request with the last one,
 * before that answer. Within the packet, only a line that starts `HEAD ` can be a HEAD's
 * start line (a header named `X-HEAD-Fold` is not one).
 */
export function parserRefusalMayBeHead(err: NodeJS.ErrnoException & { rawPacket?: unknown }, socket: Duplex, answeredAt = 0): boolean {
  const raw = err.rawPacket;
  if (!Buffer.isBuffer(raw)) return true;
  const bytesRead = (socket as Duplex & { bytesRead?: number }).bytesRead;
  if (bytesRead !== answeredAt + raw.length) return true;
  const text = raw.toString('latin1');
  if (answeredAt > 0 && !START_LINE.test(text)) return true;
  return HEAD_LINE.test(text);
}

/**
 * How long a connection keyward has ended may take to close: a client that keeps its half
 * open (a CONNECT's) or never reads its answer would otherwise hold the socket for good.
 */
export const LINGER_MS = 5_000;

/** Writes the last bytes of a connection and ends it; destroys it if it has not closed LINGER_MS later. */
export function endThenDrop(socket: Duplex, data: string): void {
  socket.end(data);
  const timer = setTimeout(() => socket.destroy(), LINGER_MS).unref();
  socket.once('close', () => clearTimeout(timer));
}

const HEAD_LINE = /(?:^|\n)HEAD /;
const START_LINE = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+ \S+ HTTP\/1\.[01]\r?\n/;

/**
 * Answers a request the HTTP parser refused. `current` is the last request seen on the
 * socket: when the refused bytes belong to it (its body was still coming) and its answer
 * has begun, a second response would answer the next request, so the connection closes.
 * When its answer has not begun, the answer is that request's: its method is known (only
 * a HEAD goes without a body), and a connection that ended inside its body cut it short.
 * Returns the status and code written, or null when the connection closed unanswered.
 */
export function answerParserRefusal(
  err: NodeJS.ErrnoException,
  socket: Duplex,
  o: { current: { req: IncomingMessage; res: ServerResponse; style: () => ErrorStyle } | undefined; answeredAt: number; reqId: string },
): { status: number; code: string } | null {
  const current = o.current;
  if (!socket.writable || (current && !current.req.complete && current.res.headersSent)) {
    socket.destroy();
    return null;
  }
  const inBody = current !== undefined && !current.req.complete;
  const { statusLine, ...denial } = refusalOf(err.code, inBody);
  // Refused inside a body, the answer is that request's, in its route's style.
  const out = renderError(denial, inBody ? current.style() : 'openai');
  const head = inBody ? current.req.method === 'HEAD' : parserRefusalMayBeHead(err, socket, o.answeredAt);
  const body = head ? '' : out.body;
  endThenDrop(socket, `HTTP/1.1 ${statusLine}\r\ncontent-type: application/json\r\nx-keyward-error: ${denial.code}\r\nx-request-id: ${o.reqId}\r\ncontent-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`);
  return { status: Number(statusLine.slice(0, 3)), code: denial.code };
}

/** What a parser refusal answers, by Node's error code. */
function refusalOf(code: string | undefined, inBody: boolean): Denial & { statusLine: string } {
  // headersTimeout: the request head did not arrive in time
  if (code === 'ERR_HTTP_REQUEST_TIMEOUT') return { ...deny('invalid_request', { variant: 'headers_timeout' }), statusLine: '408 Request Timeout' };
  // past Node's maxHeaderSize (request line and headers together)
  if (code === 'HPE_HEADER_OVERFLOW') return { ...deny('invalid_request', { variant: 'headers_too_large', params: { limit: maxHeaderSize } }), statusLine: '431 Request Header Fields Too Large' };
  // a request target with a byte the parser takes in no URL (a raw character outside ASCII among them): DESIGN section 5, "Paths"
  if (code === 'HPE_INVALID_URL') return { ...deny('invalid_path'), statusLine: '400 Bad Request' };
  return { ...deny('invalid_request', { variant: inBody && code === 'HPE_INVALID_EOF_STATE' ? 'cut_short' : 'http' }), statusLine: '400 Bad Request' };
}

/**
 * Answers a CONNECT, which asks for a tunnel keyward never opens: its target is an
 * authority, not a path, so it is 400 `invalid_path` like an absolute-form target, and
 * the connection closes (Node hands the socket over raw, with no response object).
 */
export function answerConnect(socket: Duplex, reqId: string): void {
  if (!socket.writable) return void socket.destroy();
  const out = renderError(deny('invalid_path', { detail: 'CONNECT requests are not accepted: keyward opens no tunnels; send the path only' }), 'openai');
  let head = 'HTTP/1.1 400 Bad Request\r\n';
  for (const [name, value] of Object.entries(out.headers)) head += `${name}: ${value}\r\n`;
  head += `x-request-id: ${reqId}\r\n`;
  endThenDrop(socket, `${head}connection: close\r\n\r\n${out.body}`);
}

/**
 * Request framing rules (DESIGN section 5, "Framing") that do not depend on the route:
 * which transfer codings may be forwarded, and the answers written straight on a socket
 * to what never became a request (a parser refusal, a CONNECT, an expectation other than
 * 100-continue).
 */
import { maxHeaderSize, type IncomingMessage, type ServerResponse } from 'node:http';
import type { Duplex } from 'node:stream';
import { deny, renderError } from '../../errors.js';

/**
 * Why the request's framing cannot be forwarded as received, or null. Node accepts a
 * transfer-coding list that ends in chunked (`gzip, chunked`); the upstream would decode
 * the other codings and read a body no one checked, so only plain `chunked` passes.
 */
export function framingProblem(req: IncomingMessage): string | null {
  const te = req.headers['transfer-encoding'];
  if (te !== undefined && te.trim().toLowerCase() !== 'chunked') return 'Only "Transfer-Encoding: chunked" is accepted as a request transfer coding.';
  return null;
}

/**
 * Whether the request the parser refused may have been a HEAD: its answer then carries no
 * body, or a client (or a proxy in front) would read that body as the next response.
 * The method is only known for sure when the failing packet is everything the connection
 * has sent; otherwise the start line may lie in an earlier packet, so: maybe HEAD.
 */
export function parserRefusalMayBeHead(err: NodeJS.ErrnoException & { rawPacket?: unknown }, socket: Duplex): boolean {
  const raw = err.rawPacket;
  if (!Buffer.isBuffer(raw)) return true;
  const bytesRead = (socket as Duplex & { bytesRead?: number }).bytesRead;
  if (bytesRead !== raw.length) return true;
  return raw.includes('HEAD', 0, 'latin1');
}

/**
 * Answers a request the HTTP parser refused. `current` is the last request seen on the
 * socket: when the refused bytes belong to it (its body was still coming) and its answer
 * has begun, a second response would answer the next request, so the connection closes.
 * When its answer has not begun, the answer is that request's: its method is known (only
 * a HEAD goes without a body), and a connection that ended inside its body cut it short.
 */
export function answerParserRefusal(err: NodeJS.ErrnoException, socket: Duplex, current: { req: IncomingMessage; res: ServerResponse } | undefined): void {
  if (!socket.writable || (current && !current.req.complete && current.res.headersSent)) {
    socket.destroy();
    return;
  }
  const inBody = current !== undefined && !current.req.complete;
  const { variant, statusLine } = refusalOf(err.code, inBody);
  const out = renderError(deny('invalid_request', { variant, params: { limit: maxHeaderSize } }), 'openai');
  const head = inBody ? current.req.method === 'HEAD' : parserRefusalMayBeHead(err, socket);
  const body = head ? '' : out.body;
  socket.end(`HTTP/1.1 ${statusLine}\r\ncontent-type: application/json\r\nx-keyward-error: invalid_request\r\ncontent-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`);
}

/** What a parser refusal says, by Node's error code. */
function refusalOf(code: string | undefined, inBody: boolean): { variant: 'headers_timeout' | 'headers_too_large' | 'cut_short' | 'http'; statusLine: string } {
  // headersTimeout: the request head did not arrive in time
  if (code === 'ERR_HTTP_REQUEST_TIMEOUT') return { variant: 'headers_timeout', statusLine: '408 Request Timeout' };
  // past Node's maxHeaderSize (request line and headers together)
  if (code === 'HPE_HEADER_OVERFLOW') return { variant: 'headers_too_large', statusLine: '431 Request Header Fields Too Large' };
  return { variant: inBody && code === 'HPE_INVALID_EOF_STATE' ? 'cut_short' : 'http', statusLine: '400 Bad Request' };
}

/**
 * Answers a CONNECT, which asks for a tunnel keyward never opens: its target is an
 * authority, not a path, so it is 400 `invalid_path` like an absolute-form target, and
 * the connection closes (Node hands the socket over raw, with no response object).
 */
export function answerConnect(socket: Duplex): void {
  if (!socket.writable) return void socket.destroy();
  const out = renderError(deny('invalid_path', { detail: 'CONNECT requests are not accepted: keyward opens no tunnels; send the path only' }), 'openai');
  let head = 'HTTP/1.1 400 Bad Request\r\n';
  for (const [name, value] of Object.entries(out.headers)) head += `${name}: ${value}\r\n`;
  socket.end(`${head}connection: close\r\n\r\n${out.body}`);
}

/**
 * Answers a request whose `Expect` asks for something other than 100-continue, which Node
 * hands over instead of the request (without a listener it answers a bare 417): 417 with
 * the JSON body every denial carries, and the connection closes, since the client may be
 * holding its body back or sending it anyway.
 */
export function answerExpectation(res: ServerResponse): void {
  const out = renderError(deny('invalid_request', { variant: 'expectation', status: 417 }), 'openai');
  res.writeHead(417, { ...out.headers, connection: 'close' });
  res.end(out.body);
}

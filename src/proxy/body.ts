/**
 * Bounded reading of model-request bodies (DESIGN section 5, step 6). JSON bodies are
 * read whole up to `limit` and replayed byte for byte; multipart bodies are read only
 * up to the first file part, then the rest streams through unbuffered.
 */
import type { IncomingMessage } from 'node:http';
import { PassThrough } from 'node:stream';
import { deny, type Denial } from '../errors.js';
import { inspectJson } from './json-scan.js';
import { createLateFieldGuard, lateFieldMessage, multipartBoundary, scanFields, scanLateField } from './multipart.js';

/** What is forwarded instead of `req`; http-proxy-3 only ever calls `pipe` on it. */
export interface BodySource {
  pipe<T extends NodeJS.WritableStream>(dest: T): T;
}

/** A body read whole: one write, no stream machinery on the hot path. */
class BufferSource implements BodySource {
  constructor(private readonly buf: Buffer) {}
  pipe<T extends NodeJS.WritableStream>(dest: T): T {
    dest.end(this.buf);
    return dest;
  }
}

export interface ModelBody {
  model: string | null;
  maxOutputTokens: number | null;
  /** bytes that count towards the TPM estimate: the JSON body, or a multipart body's fields */
  estimateBytes: number;
  /** what to forward instead of `req`; null when nothing was consumed */
  replay: BodySource | null;
}

export type BodyResult = { ok: true; body: ModelBody } | { ok: false; denial: Denial; closeConnection: boolean };

/** Fields before the first file part are read up to this many bytes; past it the model is "not found". */
const MULTIPART_HEAD_LIMIT = 1 << 20;

const invalid = (message: string): BodyResult => ({ ok: false, denial: deny('invalid_request', { detail: message }), closeConnection: false });

function tooLarge(limit: number): BodyResult {
  return { ok: false, denial: deny('body_too_large', { params: { limit } }), closeConnection: true };
}

export function hasBody(req: IncomingMessage): boolean {
  const len = req.headers['content-length'];
  return req.headers['transfer-encoding'] !== undefined || (len !== undefined && len !== '0');
}

/**
 * Reads chunks until `enough` says stop or the body ends. Resolves with the chunks and
 * whether the body ended; leaves `req` paused when it stopped early.
 */
function readUntil(req: IncomingMessage, opts: { limit: number; enough: (chunks: Buffer[], total: number) => boolean }) {
  return new Promise<{ chunks: Buffer[]; total: number; ended: boolean; overLimit: boolean }>((resolve, reject) => {
    const chunks: Buffer[] = [];
    let total = 0;
    const cleanup = () => {
      req.off('data', onData);
      req.off('end', onEnd);
      req.off('error', onError);
      req.off('close', onClose);
    };
    const onData = (chunk: Buffer) => {
      chunks.push(chunk);
      total += chunk.length;
      if (total > opts.limit || opts.enough(chunks, total)) {
        req.pause();
        cleanup();
        resolve({ chunks, total, ended: false, overLimit: total > opts.limit });
      }
    };
    const onEnd = () => {
      cleanup();
      resolve({ chunks, total, ended: true, overLimit: false });
    };
    const onError = (err: Error) => {
      cleanup();
      reject(err);
    };
    const onClose = () => {
      if (!req.complete) onError(new Error('client closed the request before sending its body'));
    };
    req.on('data', onData);
    req.on('end', onEnd);
    req.on('error', onError);
    req.on('close', onClose);
  });
}

/**
 * A stream of what was read followed by whatever is still to come. With `guardFrom`,
 * the bytes from that offset on pass through a guard that refuses a second `model`
 * part; its error destroys whatever the stream is piped into (the upstream request).
 */
function replayStream(req: IncomingMessage, read: { chunks: Buffer[]; ended: boolean }, guard: { boundary: string; from: number } | null): BodySource {
  const head = read.chunks.length === 1 ? read.chunks[0]! : Buffer.concat(read.chunks);
  if (read.ended) return new BufferSource(head);
  const out = new PassThrough();
  if (guard === null) {
    out.write(head);
    req.pipe(out);
  } else {
    const g = createLateFieldGuard({ boundary: guard.boundary, field: 'model' });
    out.write(head.subarray(0, guard.from));
    g.pipe(out);
    g.write(head.subarray(guard.from));
    req.pipe(g);
    g.once('error', (err) => {
      req.unpipe(g);
      out.emit('reject', err);
    });
  }
  req.resume();
  return out;
}

async function readJson(req: IncomingMessage, limit: number): Promise<BodyResult> {
  const read = await readUntil(req, { limit, enough: () => false });
  if (read.overLimit) return tooLarge(limit);
  const buf = read.chunks.length === 1 ? read.chunks[0]! : Buffer.concat(read.chunks);
  if (buf.length === 0) return { ok: true, body: { model: null, maxOutputTokens: null, estimateBytes: 0, replay: new BufferSource(buf) } };
  const found = inspectJson(buf);
  if (!found.ok) return invalid(found.message);
  return { ok: true, body: { model: found.model, maxOutputTokens: found.maxOutputTokens, estimateBytes: buf.length, replay: new BufferSource(buf) } };
}

async function readMultipart(req: IncomingMessage, boundary: string): Promise<BodyResult> {
  let scan = scanFields(Buffer.alloc(0), boundary, false);
  const read = await readUntil(req, {
    limit: MULTIPART_HEAD_LIMIT,
    enough: (chunks) => {
      scan = scanFields(Buffer.concat(chunks), boundary, false);
      return scan.state !== 'more';
    },
  });
  if (read.ended || read.overLimit) scan = scanFields(Buffer.concat(read.chunks), boundary, read.ended);
  if (scan.state === 'error') return invalid(scan.message);
  const fields = scan.state === 'done' ? scan.fields : new Map<string, string[]>();
  const models = fields.get('model') ?? [];
  if (models.length > 1) return invalid('The form names "model" more than once.');
  const model = models[0] ?? null;
  if (model === '') return invalid('The "model" form field must not be empty.');
  const estimateBytes = scan.state === 'done' ? scan.bytes : read.total;
  const fileAt = scan.state === 'done' ? scan.fileAt : null;
  if (read.ended && fileAt !== null && scanLateField(Buffer.concat(read.chunks).subarray(fileAt), { boundary, field: 'model' }).found) {
    return invalid(lateFieldMessage('model'));
  }
  const replay = replayStream(req, read, fileAt === null ? null : { boundary, from: fileAt });
  return { ok: true, body: { model, maxOutputTokens: null, estimateBytes, replay } };
}

/**
 * Step 6. `modelRequired` makes a POST without `model` a 400. The caller forwards
 * `body.replay` instead of `req`.
 */
export async function readModelBody(req: IncomingMessage, opts: { limit: number; modelRequired: boolean }): Promise<BodyResult> {
  const declared = Number(req.headers['content-length'] ?? NaN);
  if (declared > opts.limit) return tooLarge(opts.limit);
  if (!hasBody(req)) {
    if (opts.modelRequired && req.method === 'POST') return invalid('The request needs a JSON body that names "model".');
    return { ok: true, body: { model: null, maxOutputTokens: null, estimateBytes: 0, replay: null } };
  }
  const encoding = req.headers['content-encoding'];
  if (encoding !== undefined && encoding.toLowerCase() !== 'identity') {
    return invalid('Compressed request bodies are not accepted on model routes; send the body uncompressed.');
  }
  const boundary = multipartBoundary(req.headers['content-type']);
  const result = boundary !== null ? await readMultipart(req, boundary) : await readJson(req, opts.limit);
  if (result.ok && result.body.model === null && opts.modelRequired) {
    return invalid(boundary !== null ? 'The form needs a "model" field before the file part.' : 'The request body must name "model".');
  }
  return result;
}

/**
 * Bounded reading of model-request bodies (DESIGN section 5, step 6). JSON bodies are
 * read whole up to `server.maxJsonBodyBytes` and replayed byte for byte; multipart
 * bodies are read only up to the first file part, then the rest streams through
 * unbuffered, held to `server.maxUploadBytes` instead (see upload.ts).
 */
import type { IncomingMessage } from 'node:http';
import { PassThrough } from 'node:stream';
import { deny, type Denial } from '../../errors.js';
import { inspectJson, queryNamesModel, selectsModels } from './json-scan.js';
import { modelNamesProblem, modelsOfField, TOO_DEEP } from './model-names.js';
import { createMultipartGuard, fieldBase, MultipartReader } from './multipart.js';
import { jsonCharsetRefusal } from './content-type.js';
import { multipartBoundary } from './multipart-head.js';
import { bodyTooLarge, byteLimit, declaredOver, dropRest, needsCounting, toComeAfter } from './upload.js';

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
  /** further models the body selects (`models`, `fallbacks`): held to the key's scope too */
  models: string[];
  maxOutputTokens: number | null;
  /** `"background": true`: the answer comes before the generation, without its usage */
  background: boolean;
  /** bytes that count towards the TPM estimate: the whole body (a chunked multipart body: what was read before admission) */
  estimateBytes: number;
  /** what to forward instead of `req`; null when nothing was consumed */
  replay: BodySource | null;
  /** a body whose size was not declared: the bytes of it read so far (null: estimateBytes is the whole) */
  bytesSeen: (() => number) | null;
}

export type BodyResult = { ok: true; body: ModelBody } | { ok: false; denial: Denial; closeConnection: boolean };

/** Fields before the first file part are read up to this many bytes; past it the model is "not found". */
const MULTIPART_HEAD_LIMIT = 1 << 20;

const invalid = (message: string): BodyResult => ({ ok: false, denial: deny('invalid_request', { detail: message }), closeConnection: false });

/** The rest of an over-limit body is dropped as it comes: the connection closes after the answer. */
function tooLarge(req: IncomingMessage, limit: number): BodyResult {
  if (!req.complete) req.resume();
  return { ok: false, denial: bodyTooLarge(limit), closeConnection: true };
}

const cutShort = (): BodyResult => ({ ok: false, denial: deny('invalid_request', { variant: 'cut_short', status: 408 }), closeConnection: true });

export function hasBody(req: IncomingMessage): boolean {
  const len = req.headers['content-length'];
  return req.headers['transfer-encoding'] !== undefined || (len !== undefined && len !== '0');
}

interface ReadResult {
  chunks: Buffer[];
  total: number;
  ended: boolean;
  overLimit: boolean;
  cut?: boolean;
}

/** The read in progress on a request, found by the shared listeners below. */
const READ = Symbol('keyward.bodyRead');
type ReadingRequest = IncomingMessage & { [READ]?: BodyRead };

/**
 * One body read. Its listeners are shared by every request and find their read on the
 * request they are called on, so a read allocates this object and its promise only.
 */
class BodyRead {
  readonly chunks: Buffer[] = [];
  total = 0;
  resolve!: (r: ReadResult) => void;
  reject!: (err: Error) => void;

  constructor(
    readonly limit: number,
    readonly enough: (chunks: Buffer[], total: number) => boolean,
  ) {}
}

function stopReading(req: ReadingRequest): BodyRead {
  const read = req[READ]!;
  req[READ] = undefined;
  req.off('data', onReadData);
  req.off('end', onReadEnd);
  req.off('error', onReadError);
  req.off('close', onReadClose);
  return read;
}

function onReadData(this: ReadingRequest, chunk: Buffer): void {
  const read = this[READ];
  if (read === undefined) return;
  read.chunks.push(chunk);
  read.total += chunk.length;
  const enough = read.enough(read.chunks, read.total);
  if (read.total > read.limit || enough) {
    this.pause();
    stopReading(this);
    read.resolve({ chunks: read.chunks, total: read.total, ended: false, overLimit: read.total > read.limit });
  }
}

/**
 * The body has ended: the read lets go of the request, but its listeners stay. Nothing
 * more comes to them (no data after the end; no error and nothing to do at the close of
 * a complete request), and taking four listeners off a stream costs more than they do.
 * A request is read at most once.
 */
function onReadEnd(this: ReadingRequest): void {
  const read = this[READ];
  if (read === undefined) return;
  this[READ] = undefined;
  read.resolve({ chunks: read.chunks, total: read.total, ended: true, overLimit: false });
}

function onReadError(this: ReadingRequest, err: Error): void {
  if (this[READ] !== undefined) stopReading(this).reject(err);
}

/** The client went away, or its stalled body was cut: nothing more will come. */
function onReadClose(this: ReadingRequest): void {
  if (this.complete || this[READ] === undefined) return;
  const read = stopReading(this);
  read.resolve({ chunks: read.chunks, total: read.total, ended: false, overLimit: false, cut: true });
}

const NOT_ENOUGH = (): boolean => false;

/**
 * Reads chunks until `enough` says stop or the body ends. Resolves with the chunks and
 * whether the body ended; leaves `req` paused when it stopped early.
 */
function readUntil(req: IncomingMessage, opts: { limit: number; enough: (chunks: Buffer[], total: number) => boolean }): Promise<ReadResult> {
  const read = new BodyRead(opts.limit, opts.enough);
  const promise = new Promise<ReadResult>((resolve, reject) => {
    read.resolve = resolve;
    read.reject = reject;
  });
  (req as ReadingRequest)[READ] = read;
  req.on('data', onReadData);
  req.on('end', onReadEnd);
  req.on('error', onReadError);
  req.on('close', onReadClose);
  return promise;
}

/**
 * A stream of what was read followed by whatever is still to come. With a multipart
 * reader, the rest passes through a guard that goes on reading it strictly; with an
 * upload limit and no declared length, through a byte counter. A stage's error emits
 * 'reject' on the stream, on which the forwarder destroys the upstream request.
 */
function replayStream(req: IncomingMessage, read: { chunks: Buffer[]; total: number; ended: boolean }, reader: MultipartReader | null, uploadLimit: number): BodySource {
  const head = read.chunks.length === 1 ? read.chunks[0]! : Buffer.concat(read.chunks);
  if (read.ended) return new BufferSource(head);
  const out = new PassThrough();
  out.write(head);
  const stages = [
    ...(needsCounting(req, uploadLimit) ? [byteLimit(uploadLimit, read.total)] : []),
    ...(reader === null ? [] : [createMultipartGuard(reader, toComeAfter(req, read.total))]),
  ];
  let upstream: NodeJS.ReadableStream = req;
  for (const stage of stages) {
    upstream = upstream.pipe(stage);
    stage.once('error', (err) => {
      dropRest(req, stages[0]!);
      out.emit('reject', err);
    });
  }
  upstream.pipe(out);
  req.resume();
  return out;
}

async function readJson(req: IncomingMessage, limit: number): Promise<BodyResult> {
  const read = await readUntil(req, { limit, enough: NOT_ENOUGH });
  if (read.cut) return cutShort();
  if (read.overLimit) return tooLarge(req, limit);
  const buf = read.chunks.length === 1 ? read.chunks[0]! : Buffer.concat(read.chunks);
  if (buf.length === 0) return { ok: true, body: { model: null, models: [], maxOutputTokens: null, background: false, estimateBytes: 0, replay: new BufferSource(buf), bytesSeen: null } };
  const found = inspectJson(buf);
  if (!found.ok) return invalid(found.message);
  return { ok: true, body: { model: found.model, models: found.models, maxOutputTokens: found.maxOutputTokens, background: found.background, estimateBytes: buf.length, replay: new BufferSource(buf), bytesSeen: null } };
}

/**
 * Reads a multipart body up to its first file part (or its end), strictly (see
 * multipart.ts); the rest streams through a guard that goes on reading it the same way.
 */
async function readMultipart(req: IncomingMessage, boundary: string, uploadLimit: number): Promise<BodyResult> {
  const reader = new MultipartReader(boundary);
  const fields: [name: string, value: string][] = [];
  let problem: string | null = null;
  const feed = (chunk: Buffer) => {
    const r = reader.push(chunk);
    if (!Array.isArray(r)) problem = r.problem;
    else for (const e of r) if (e.type === 'field') fields.push([e.name, e.value]);
  };
  const read = await readUntil(req, {
    limit: uploadLimit > 0 ? Math.min(MULTIPART_HEAD_LIMIT, uploadLimit) : MULTIPART_HEAD_LIMIT,
    enough: (chunks) => {
      feed(chunks[chunks.length - 1]!);
      return problem !== null || reader.fileSeen || reader.closed;
    },
  });
  if (read.cut) return cutShort();
  if (uploadLimit > 0 && read.total > uploadLimit) return tooLarge(req, uploadLimit);
  problem ??= read.ended ? reader.end() : reader.seal();
  if (problem !== null) return invalid(problem);
  const models: string[] = [];
  for (const [name, value] of fields) {
    if (!selectsModels(fieldBase(name))) continue;
    const named = modelsOfField(value);
    if (named === null) return invalid(TOO_DEEP);
    models.push(...named);
  }
  const model = fields.find(([name]) => name === 'model')?.[1] ?? null;
  const names = modelNamesProblem(model, models);
  if (names) return invalid(names);
  // The whole body counts towards the estimate, whatever the order of its parts.
  const declared = Number(req.headers['content-length']);
  const estimateBytes = Number.isSafeInteger(declared) && declared > read.total ? declared : read.total;
  const bytesSeen = read.ended || Number.isSafeInteger(declared) ? null : bytesFrom(req, read.total);
  const replay = replayStream(req, read, read.ended ? null : reader, uploadLimit);
  return { ok: true, body: { model, models, maxOutputTokens: null, background: false, estimateBytes, replay, bytesSeen } };
}

/** The bytes of `req`'s body read so far: `already`, and what it emits from now on (an extra listener takes nothing from the pipe). */
function bytesFrom(req: IncomingMessage, already: number): () => number {
  let seen = already;
  req.on('data', (chunk: Buffer) => {
    seen += chunk.length;
  });
  return () => seen;
}

function countHeader(raw: string[], name: string): number {
  let n = 0;
  for (let i = 0; i < raw.length; i += 2) if (raw[i]!.length === name.length && raw[i]!.toLowerCase() === name) n++;
  return n;
}

export interface ReadOptions {
  /** `server.maxJsonBodyBytes`: JSON bodies are read whole up to it */
  limit: number;
  /** `server.maxUploadBytes`: multipart bodies stream through, held to it (0: no limit) */
  uploadLimit: number;
  /** a request without `model`, bodiless included, is a 400 */
  modelRequired: boolean;
}

/**
 * Step 6. The caller forwards `body.replay` instead of `req`. `proceed` runs once the
 * request's head has passed every check and its body is about to be read: the place to
 * answer `Expect: 100-continue`, so a body refused on its head alone is never invited.
 */
export async function readModelBody(req: IncomingMessage, opts: ReadOptions, proceed?: () => void): Promise<BodyResult> {
  if (queryNamesModel(req.url ?? '/')) return invalid('Name the model in the request body, not in the query string.');
  const contentType = req.headers['content-type'];
  const boundary = multipartBoundary(contentType);
  // Which limit a declared length answers to depends only on the body's kind.
  const limit = boundary !== null ? opts.uploadLimit : opts.limit;
  if (declaredOver(req, limit)) return tooLarge(req, limit);
  if (!hasBody(req)) {
    if (opts.modelRequired) return invalid('The request needs a JSON body that names "model".');
    return { ok: true, body: { model: null, models: [], maxOutputTokens: null, background: false, estimateBytes: 0, replay: null, bytesSeen: null } };
  }
  const encoding = req.headers['content-encoding'];
  if (encoding !== undefined && encoding.toLowerCase() !== 'identity') {
    return invalid('Compressed request bodies are not accepted on model routes; send the body uncompressed.');
  }
  // Node keeps the first Content-Type line, an upstream may keep the last.
  if (countHeader(req.rawHeaders, 'content-type') > 1) return invalid('The request names its Content-Type more than once.');
  // Gateways read any "form" content type as a form: a JSON reading here would not be theirs.
  if (boundary === null && contentType !== undefined && /form/i.test(contentType)) {
    return invalid('Form-encoded bodies are not accepted here; send JSON, or multipart/form-data with one boundary of 1-70 characters.');
  }
  if (boundary === null && contentType !== undefined) {
    const refused = jsonCharsetRefusal(contentType);
    if (refused !== null) return invalid(refused);
  }
  proceed?.();
  const result = boundary !== null ? await readMultipart(req, boundary, opts.uploadLimit) : await readJson(req, opts.limit);
  if (result.ok && result.body.model === null && opts.modelRequired) {
    return invalid(boundary !== null ? 'The form needs a "model" field before the file part.' : 'The request body must name "model".');
  }
  return result;
}

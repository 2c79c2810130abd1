/**
 * multipart/form-data read as RFC 2046/7578 parsers read it, strictly enough that no
 * common parser (Go's mime/multipart, python-multipart under Starlette, busboy) can read
 * the same bytes another way. Pure and incremental: feed it bytes as they come, it
 * reports the form fields that select models, where the first file part starts, and
 * every problem, with bounded memory whatever the body size.
 *
 * Refused, because parsers disagree on them: a preamble; `\r\n--boundary` followed by
 * anything but CRLF or `--` (transport padding is a delimiter to Go and data to
 * python-multipart; anything else is a boundary inside content, which RFC 2046 forbids);
 * bare CR or LF, folded lines, or malformed lines in part headers; zero or several
 * Content-Disposition lines; a disposition that is not form-data; duplicate, `*=`
 * (RFC 2231) or backslash-quoted parameters; Content-Transfer-Encoding other than
 * 7bit/8bit/binary (Go decodes quoted-printable); a `_charset_` field (it changes how
 * Starlette decodes later fields); a model-selecting field that is a file, appears twice,
 * appears after a file part, or is named in another letter case; anything but
 * whitespace after the closing delimiter.
 */
import { Transform } from 'node:stream';
import { foldKey, isSensitiveField, selectsModels } from './json-scan.js';
import { MAX_MODEL_LENGTH } from './model-names.js';
import { MAX_HEADER_BYTES, type PartHead, parsePartHeaders } from './multipart-head.js';

export type MultipartEvent =
  /** a part's headers are read */
  | { type: 'part'; part: PartHead }
  /** a model-selecting field's whole value (an array element's, each under its own name) */
  | { type: 'field'; name: string; value: string };

const decoder = new TextDecoder('utf-8', { fatal: true });

/** A reading step's result: a problem, null when more bytes are needed, or NEXT to go on in the new state. */
const NEXT = true;
type Step = string | null | typeof NEXT;

/**
 * Incremental strict reader. `push` returns the events the new bytes completed, or a
 * problem; `end` says whether the body closed properly. After a problem it stays failed.
 */
export class MultipartReader {
  private state: 'start' | 'afterDelim' | 'headers' | 'body' | 'epilogue' | 'failed' = 'start';
  private buf: Buffer = Buffer.alloc(0);
  private readonly first: Buffer;
  private readonly marker: Buffer;
  private current: PartHead | null = null;
  private value: Buffer[] | null = null;
  private valueBytes = 0;
  private readonly seen = new Set<string>();
  /** whether a file part has begun: admission need not wait for more */
  fileSeen = false;
  private sealed = false;
  problem: string | null = null;

  constructor(boundary: string) {
    this.first = Buffer.from(`--${boundary}`);
    this.marker = Buffer.from(`\r\n--${boundary}`);
  }

  get closed(): boolean {
    return this.state === 'epilogue';
  }

  push(chunk: Buffer): MultipartEvent[] | { problem: string } {
    if (this.state === 'failed') return { problem: this.problem! };
    const events: MultipartEvent[] = [];
    const problem = this.append(chunk) ?? this.run(events);
    if (problem) {
      this.state = 'failed';
      this.problem = problem;
      return { problem };
    }
    return events;
  }

  /**
   * Admission has read its fields: a model-selecting field from here on is a problem,
   * as is one whose value is still being read.
   */
  seal(): string | null {
    this.sealed = true;
    if (this.value !== null) {
      this.state = 'failed';
      this.problem = 'A model-selecting form field is too far into the body; send it first.';
    }
    return this.problem;
  }

  /** Null when the body ended after its closing delimiter, else the problem. */
  end(): string | null {
    if (this.state === 'failed') return this.problem;
    if (this.state !== 'epilogue') {
      this.state = 'failed';
      this.problem = 'The multipart body ends before its closing delimiter.';
    }
    return this.problem;
  }

  /**
   * Puts the new bytes behind what is left of the old. Inside a part's content what is left
   * is a tail shorter than the delimiter; when no delimiter begins in it, the tail is
   * content and the chunk is read as it came, so a file part is not copied chunk by chunk.
   */
  private append(chunk: Buffer): string | null {
    const tail = this.buf;
    if (tail.length === 0) {
      this.buf = chunk;
      return null;
    }
    // A delimiter that begins in the tail ends within the chunk's first marker.length - 1 bytes.
    if (this.state === 'body' && chunk.length >= this.marker.length - 1) {
      const at = Buffer.concat([tail, chunk.subarray(0, this.marker.length - 1)]).indexOf(this.marker);
      if (at === -1 || at >= tail.length) {
        this.buf = chunk;
        return this.collect(tail);
      }
    }
    this.buf = Buffer.concat([tail, chunk]);
    return null;
  }

  private consume(n: number): void {
    this.buf = this.buf.subarray(n);
  }

  /** Reads as far as the bytes go: null when it needs more, else the problem. */
  private run(events: MultipartEvent[]): string | null {
    for (;;) {
      const step = this.step(events);
      if (step !== NEXT) return step;
    }
  }

  private step(events: MultipartEvent[]): Step {
    switch (this.state) {
      case 'start':
        return this.atStart();
      case 'afterDelim':
        return this.afterDelimiter();
      case 'headers':
        return this.atHeaders(events);
      case 'body':
        return this.inBody(events);
      case 'epilogue':
        if (!/^[\r\n\t ]*$/.test(this.buf.toString('latin1'))) return 'Only whitespace may follow the closing multipart delimiter.';
        this.consume(this.buf.length);
        return null;
      default:
        return this.problem;
    }
  }

  private atStart(): Step {
    if (this.buf.length < this.first.length) {
      return this.first.subarray(0, this.buf.length).equals(this.buf) ? null : 'The multipart body must start with its boundary delimiter.';
    }
    if (!this.buf.subarray(0, this.first.length).equals(this.first)) return 'The multipart body must start with its boundary delimiter.';
    this.consume(this.first.length);
    this.state = 'afterDelim';
    return NEXT;
  }

  /** After a delimiter: `--` closes the body, CRLF starts a part, anything else is refused. */
  private afterDelimiter(): Step {
    if (this.buf.length < 2) return null;
    const two = this.buf.toString('latin1', 0, 2);
    if (two === '--') {
      this.consume(2);
      this.state = 'epilogue';
    } else if (two === '\r\n') {
      this.consume(2);
      this.state = 'headers';
    } else return 'The multipart boundary appears inside content, or a delimiter carries padding; parsers read that differently.';
    return NEXT;
  }

  private atHeaders(events: MultipartEvent[]): Step {
    if (this.buf.length >= 2 && this.buf[0] === 13 && this.buf[1] === 10) return 'A multipart part has no headers.';
    const end = this.buf.indexOf('\r\n\r\n');
    if (end === -1 ? this.buf.length > MAX_HEADER_BYTES : end > MAX_HEADER_BYTES) return 'A multipart part header section is too large.';
    if (end === -1) return null;
    const parsed = parsePartHeaders(this.buf.toString('utf8', 0, end));
    if (!parsed.ok) return parsed.message;
    const problem = this.startPart(parsed.part, events);
    if (problem) return problem;
    this.consume(end + 4);
    this.state = 'body';
    return NEXT;
  }

  /** A part's content up to the next delimiter; a tail that may begin one is kept for the next chunk. */
  private inBody(events: MultipartEvent[]): Step {
    const at = this.buf.indexOf(this.marker);
    const take = at === -1 ? Math.max(0, this.buf.length - this.marker.length + 1) : at;
    const problem = this.collect(this.buf.subarray(0, take));
    if (problem) return problem;
    if (at === -1) {
      this.consume(take);
      this.buf = Buffer.from(this.buf); // do not pin the chunk the tail was cut from
      return null;
    }
    const ended = this.endPart(events);
    if (ended) return ended;
    this.consume(at + this.marker.length);
    this.state = 'afterDelim';
    return NEXT;
  }

  private startPart(part: PartHead, events: MultipartEvent[]): string | null {
    const base = fieldBase(part.name);
    const folded = foldKey(base);
    if (folded === '_charset_') return 'A multipart "_charset_" field is not accepted.';
    if (isSensitiveField(folded)) {
      // `fallbacks[]`, `fallbacks[0]`: elements of an array to the decoders that fold brackets (PHP's, LiteLLM's form reader).
      const element = base !== part.name;
      if (element && !selectsModels(folded)) return `The form field "${folded}" must be sent once, as "${folded}", not as an array.`;
      if (folded !== base) return `The form names "${folded}" in another letter case; use "${folded}".`;
      if (part.isFile) return `The form field "${folded}" must not be a file.`;
      if (this.fileSeen || this.sealed) return `The form names "${folded}" after the file part; send it once, before the file.`;
      if (!element && this.seen.has(folded)) return `The form names "${folded}" more than once.`;
      if (!element) this.seen.add(folded);
      this.value = [];
      this.valueBytes = 0;
    }
    if (part.isFile) this.fileSeen = true;
    this.current = part;
    events.push({ type: 'part', part });
    return null;
  }

  private collect(bytes: Buffer): string | null {
    if (this.value === null || bytes.length === 0) return null;
    this.valueBytes += bytes.length;
    if (this.valueBytes > 64 * 1024) return `The form field "${this.current!.name}" is too large.`;
    this.value.push(Buffer.from(bytes));
    return null;
  }

  private endPart(events: MultipartEvent[]): string | null {
    if (this.value !== null) {
      let text: string;
      try {
        text = decoder.decode(Buffer.concat(this.value));
      } catch {
        return `The form field "${this.current!.name}" is not valid UTF-8.`;
      }
      if (this.current!.name === 'model' && (text === '' || text.length > MAX_MODEL_LENGTH)) {
        return `The "model" form field must be 1 to ${MAX_MODEL_LENGTH} characters.`;
      }
      events.push({ type: 'field', name: this.current!.name, value: text });
    }
    this.value = null;
    this.current = null;
    return null;
  }
}

/** A form field's name less any `[...]` suffix: the field an array element belongs to. */
export function fieldBase(name: string): string {
  const bracket = name.indexOf('[');
  return bracket === -1 ? name : name.slice(0, bracket);
}

/** A form field that selects models appeared where it is not allowed, mid-stream. */
export class LateFieldError extends Error {
  readonly code = 'KW_BODY_REJECTED';
}

/**
 * Checks the streamed rest of a multipart body with the reader that read its head. A
 * chunk in which a problem shows is never passed on, and the body's end is held back
 * until the closing delimiter was seen, so the upstream never reads a complete body
 * keyward refused; the error destroys whatever the stream is piped into. `toCome` is
 * what a Content-Length says is still to arrive (null when chunked, whose end the pipe
 * holds back): its last chunk is passed on only once the closing delimiter is in it, since
 * with that byte the upstream has a complete body.
 */
export function createMultipartGuard(reader: MultipartReader, toCome: number | null): Transform {
  let left = toCome;
  return new Transform({
    transform(chunk: Buffer, _enc, cb) {
      const r = reader.push(chunk);
      if (!Array.isArray(r)) return cb(new LateFieldError(r.problem));
      if (left !== null && (left -= chunk.length) <= 0 && !reader.closed) {
        return cb(new LateFieldError(reader.end() ?? 'The multipart body ends without its closing delimiter.'));
      }
      cb(null, chunk);
    },
    flush(cb) {
      const problem = reader.end();
      cb(problem ? new LateFieldError(problem) : null);
    },
  });
}

/**
 * Usage tap: watches the response bytes on their way to the client (never alters them) and
 * reads the token usage the upstream reported, to settle the TPM reservation.
 *
 * Memory stays bounded whatever the response size:
 *  - JSON: the body is kept whole up to HEAD_CAP and parsed; past that only its first bytes
 *    and a TAIL_CAP window are kept, and the last `"usage": {...}` in the tail is read
 *    (every supported format puts usage at or near the end of the body).
 *  - SSE: processed line by line; only `data:` lines are kept, per event, under the same
 *    head/tail bounds, so an endless stream costs one event at most.
 *  - gzip, deflate, br: kept compressed up to a bound and inflated at end()
 *    (usage-encoding.ts). Other encodings: no tap.
 */
import { bodyText, eventText } from './text.js';
import { compressedTap, type Tap } from './encoding.js';
import { topLevelSpans } from './scan.js';
import { given, isObj, normalize, type Obj, type Usage } from './usage-object.js';
import { EMPTY, Window } from './window.js';

export type { Usage } from './usage-object.js';

/** What a response showed of its usage. */
export interface Tapped {
  /** the usage it reported, or null */
  usage: Usage | null;
  /**
   * characters of generated text seen; null when the response could not be read (too large,
   * cut JSON), and for a whole JSON body that reported its usage (billed by that instead)
   */
  textChars: number | null;
  /**
   * the usage gives the input alone (a messages stream that ended before its final counts):
   * its output is the estimate from the text seen
   */
  inputOnly?: boolean;
}

/** Fed the response body chunk by chunk; end() reports what it showed. */
export type UsageTap = Tap<Tapped>;

/** A response whose body could not be read: no usage, no text seen. */
const UNREADABLE: Tapped = { usage: null, textChars: null };

export interface UsageTapOptions {
  contentType?: string;
  contentEncoding?: string;
}

/** Null when the response carries nothing readable (not JSON/SSE, or an unknown encoding). */
export function createUsageTap(opts: UsageTapOptions): UsageTap | null {
  const type = (opts.contentType ?? '').split(';')[0]!.trim().toLowerCase();
  let make: () => UsageTap;
  if (type === 'text/event-stream') make = createSseTap;
  else if (type === 'application/json' || type.endsWith('+json')) make = createJsonTap;
  else return null;

  const encoding = (opts.contentEncoding ?? '').trim().toLowerCase();
  if (encoding === '' || encoding === 'identity') return make();
  return compressedTap(encoding, make, UNREADABLE);
}

// ---- JSON -------------------------------------------------------------------------------

/**
 * The usage a whole JSON body reports at its top level (or in `response`), read without
 * parsing the rest, and whether that usage names an output figure at all (embeddings name
 * none); null: parse it whole.
 */
function reportedUsage(whole: Buffer): { usage: Usage; namesOutput: boolean } | null {
  const spans = topLevelSpans(whole);
  if (spans === null) return null;
  const span = spans.usage ?? spans.response;
  if (span === null) return null;
  try {
    const v: unknown = JSON.parse(whole.toString('utf8', span[0], span[1]));
    const u = spans.usage !== null ? v : isObj(v) ? v.usage : undefined;
    const usage = normalize(u);
    return usage && { usage, namesOutput: isObj(u) && ('completion_tokens' in u || 'output_tokens' in u) };
  } catch {
    return null; // not JSON after all: the whole parse says what it is
  }
}

const TEXT_FIELDS = ['"choices"', '"content"', '"output"', '"text"'].map((f) => Buffer.from(f));

/** Whether a body names a field that carries generated text in any supported API (bodyText reads those). */
const mayHoldText = (whole: Buffer): boolean => TEXT_FIELDS.some((f) => whole.includes(f));

/** A JSON response: its bytes in a Window, read once at the end. */
class JsonTap implements UsageTap {
  private readonly body = new Window();

  push(chunk: Buffer): void {
    this.body.push(chunk);
  }

  end(): Tapped {
    const body = this.body;
    const whole = body.whole();
    const reported = whole === null ? null : reportedUsage(whole);
    // Reported usage is what is billed: the generated text is counted only without it, or
    // beside a reported output of zero (which the text may contradict: policy/estimate.ts),
    // or beside usage that names no output figure in a body that may hold generated text
    // (embeddings name none and hold none).
    if (reported !== null && (reported.usage.output_tokens > 0 || (!reported.namesOutput && !mayHoldText(whole!)))) {
      return { usage: reported.usage, textChars: null };
    }
    const v = body.value(whole);
    const usage = isObj(v) ? normalize(isObj(v.response) && !('usage' in v) ? v.response.usage : v.usage) : null;
    // Past the window only the usage survives; a body that does not parse was cut or is not JSON.
    const readable = !body.overflowed && v !== undefined;
    return { usage, textChars: readable ? bodyText(v) : null };
  }
}

function createJsonTap(): UsageTap {
  return new JsonTap();
}

// ---- SSE --------------------------------------------------------------------------------

const DATA = Buffer.from('data:');
const CR = 0x0d;
const LF = 0x0a;
const BOM = Buffer.from([0xef, 0xbb, 0xbf]);

/**
 * A server-sent event stream, read line by line: only `data:` lines are kept, one event at
 * a time, and each complete event is read for its usage and generated text.
 */
class SseTap implements UsageTap {
  private final: Usage | null = null; // chat/completions usage chunk, responses events
  private started: Obj | null = null; // messages: message_start's usage
  private delta: Obj | null = null; // messages: the message_delta usage fields given so far (cumulative)
  /** bytes of a leading byte order mark matched so far; BOM.length once past the stream's start */
  private bomAt = 0;
  private textChars = 0;
  /** an event past the window's bounds showed neither text nor usage: the text seen is not all there was */
  private textLost = false;
  private event = new Window();
  private eventHasData = false;
  // The line being read: its first bytes until we know whether it is a data line.
  private lineHead = EMPTY;
  private lineKind: 'unknown' | 'data' | 'other' = 'unknown';
  private skipSpace = false;
  /** the last chunk ended with a CR: a LF first in the next is that line end's */
  private afterCr = false;

  push(chunk: Buffer): void {
    if (this.bomAt < BOM.length) chunk = this.skipBom(chunk);
    // The LF of a CRLF split across chunks ends no second line.
    let start = this.afterCr && chunk[0] === LF ? 1 : 0;
    this.afterCr = false;
    // A line ends at CR, LF or CRLF (the SSE standard). The next of each is searched once
    // and again only when passed, so a chunk of many lines is walked once.
    let cr = chunk.indexOf(CR, start);
    let lf = chunk.indexOf(LF, start);
    while (cr >= 0 || lf >= 0) {
      const end = cr >= 0 && (lf < 0 || cr < lf) ? cr : lf;
      this.segment(chunk.subarray(start, end));
      this.endLine();
      start = end + 1;
      if (end === cr) {
        if (start === chunk.length) this.afterCr = true;
        else if (chunk[start] === LF) start++;
      }
      if (cr >= 0 && cr < start) cr = chunk.indexOf(CR, start);
      if (lf >= 0 && lf < start) lf = chunk.indexOf(LF, start);
    }
    if (start < chunk.length) this.segment(chunk.subarray(start));
  }

  /** An event stream may open with a byte order mark, which readers skip (the SSE standard). */
  private skipBom(chunk: Buffer): Buffer {
    let i = 0;
    while (this.bomAt < BOM.length && i < chunk.length) {
      if (chunk[i] !== BOM[this.bomAt]) {
        // not a mark after all: what looked like its start is the stream's
        const seen = this.bomAt;
        this.bomAt = BOM.length;
        return seen === 0 ? chunk.subarray(i) : Buffer.concat([BOM.subarray(0, seen), chunk.subarray(i)]);
      }
      this.bomAt++;
      i++;
    }
    return chunk.subarray(i);
  }

  end(): Tapped {
    // An event missing only its blank line still counts if its JSON is complete.
    this.endLine();
    this.dispatch();
    const { final, delta } = this;
    // Text that could not be read bills the whole reservation (DESIGN section 6), not what was seen.
    const textChars = this.textLost ? null : this.textChars;
    if (final) return { usage: final, textChars };
    if (!delta) {
      // A messages stream that ended before its final counts still reported its input.
      const input = this.started && normalize(this.started);
      return input ? { usage: input, textChars, inputOnly: true } : { usage: null, textChars };
    }
    // Each figure the deltas gave replaces message_start's, as the official SDK reads them.
    return { usage: normalize({ ...this.started, ...delta }), textChars };
  }

  private onEvent(o: unknown): void {
    if (!isObj(o)) return;
    this.textChars += eventText(o);
    const type = typeof o.type === 'string' ? o.type : '';
    if (type === 'message_start' && isObj(o.message)) this.started = isObj(o.message.usage) ? o.message.usage : this.started;
    else if (type === 'message_delta' && isObj(o.usage)) this.delta = { ...this.delta, ...given(o.usage) };
    else if (type.startsWith('response.') && isObj(o.response)) this.final = normalize(o.response.usage) ?? this.final;
    else if (isObj(o.usage)) this.final = normalize(o.usage) ?? this.final;
  }

  private dispatch(): void {
    if (this.eventHasData) {
      const value = this.event.value();
      if (value === undefined && this.event.overflowed) this.textLost = true;
      this.onEvent(value);
    }
    this.event = new Window();
    this.eventHasData = false;
  }

  private data(b: Buffer): void {
    if (b.length === 0) return;
    if (this.skipSpace) {
      this.skipSpace = false;
      if (b[0] === 0x20) b = b.subarray(1);
    }
    // Copied, so the event does not pin the network chunk it was cut from.
    this.event.push(Buffer.from(b));
  }

  private endLine(): void {
    // A blank line ends the event.
    if (this.lineKind === 'unknown' && this.lineHead.length === 0) this.dispatch();
    this.lineHead = EMPTY;
    this.lineKind = 'unknown';
  }

  private segment(b: Buffer): void {
    if (this.lineKind === 'unknown') {
      // Only the first bytes are kept until the line shows what it is.
      const need = DATA.length - this.lineHead.length;
      this.lineHead = Buffer.concat([this.lineHead, b.subarray(0, need)]);
      b = b.subarray(need);
      if (this.lineHead.length < DATA.length) return;
      if (!this.lineHead.equals(DATA)) {
        this.lineKind = 'other';
        return;
      }
      this.lineKind = 'data';
      this.skipSpace = true;
      // Several data lines of one event are joined with a newline.
      if (this.eventHasData) this.event.push(Buffer.from('\n'));
      this.eventHasData = true;
    }
    if (this.lineKind === 'data') this.data(b);
  }
}

function createSseTap(): UsageTap {
  return new SseTap();
}

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
import { lastUsageObject, topLevelSpans } from './scan.js';
import { given, isObj, normalize, type Obj, type Usage } from './usage-object.js';

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
}

/** Fed the response body chunk by chunk; end() reports what it showed. */
export type UsageTap = Tap<Tapped>;

/** A response whose body could not be read: no usage, no text seen. */
const UNREADABLE: Tapped = { usage: null, textChars: null };

export interface UsageTapOptions {
  contentType?: string;
  contentEncoding?: string;
}

const HEAD_CAP = 1 << 20;
const TAIL_CAP = 64 << 10;
const PREFIX_CAP = 4 << 10;

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

// ---- bounded text -----------------------------------------------------------------------

/** Never written to: buffers here are replaced, not filled, so one empty buffer serves all. */
const EMPTY = Buffer.alloc(0);

/** Keeps a byte stream whole up to HEAD_CAP; past that, its first bytes and a tail window. */
class Window {
  private head: Buffer[] = [];
  private headLen = 0;
  private prefix = EMPTY;
  private tail = EMPTY;
  overflowed = false;

  push(b: Buffer): void {
    if (b.length === 0) return;
    if (!this.overflowed && this.headLen + b.length <= HEAD_CAP) {
      this.head.push(b);
      this.headLen += b.length;
      return;
    }
    const joined = Buffer.concat(this.overflowed ? [this.tail, b] : [...this.head, b]);
    if (!this.overflowed) this.prefix = Buffer.from(joined.subarray(0, PREFIX_CAP));
    // Copy, so the window does not pin the larger buffers it was cut from.
    this.tail = Buffer.from(joined.subarray(Math.max(0, joined.length - TAIL_CAP)));
    this.head = [];
    this.headLen = 0;
    this.overflowed = true;
  }

  /** The whole body, when it was kept whole (most arrive in one chunk: no copy then). */
  whole(): Buffer | null {
    if (this.overflowed) return null;
    return this.head.length === 1 ? this.head[0]! : Buffer.concat(this.head);
  }

  /** The parsed value when complete, else a stand-in built from the prefix and the tail. */
  value(whole: Buffer | null = this.whole()): unknown {
    if (whole !== null) {
      try {
        return JSON.parse(whole.toString('utf8'));
      } catch {
        return undefined; // cut short or not JSON
      }
    }
    const type = /"type"\s*:\s*"([^"\\]{1,100})"/.exec(this.prefix.toString('utf8'))?.[1];
    const usage = lastUsageObject(this.tail.toString('utf8'));
    if (usage === undefined) return undefined;
    // Shaped like the small events, so one reader handles both.
    if (type?.startsWith('response.')) return { type, response: { usage } };
    return { type, usage };
  }
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
    // beside a reported output of zero (which the text may contradict: policy/estimate.ts).
    if (reported !== null && (reported.usage.output_tokens > 0 || !reported.namesOutput)) return { usage: reported.usage, textChars: null };
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

  push(chunk: Buffer): void {
    if (this.bomAt < BOM.length) chunk = this.skipBom(chunk);
    let start = 0;
    for (let nl = chunk.indexOf(0x0a); nl >= 0; nl = chunk.indexOf(0x0a, start)) {
      this.segment(chunk.subarray(start, nl));
      this.endLine();
      start = nl + 1;
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
    if (!delta) return { usage: null, textChars }; // messages stream cut before its final counts
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
    if (this.lineKind === 'unknown') {
      const text = this.lineHead.toString('latin1');
      if (text === '' || text === '\r') this.dispatch();
    }
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

/**
 * The snapshot reader (DESIGN section 7), written once for every place a snapshot is
 * read: `keyward import`, the sync client's snapshot (on the worker thread) and tests.
 * Pure and streaming: bytes go in as they arrive, numbered lines come out, and the
 * first non-empty line must be the meta record, each later one a record. A bad line
 * throws SnapshotError naming it, so a caller that validates before it commits rejects
 * a bad snapshot whole.
 */
import { isOtherRecordType, parseMeta, parseRecord, type ParsedRecord } from './records.js';

export class SnapshotError extends Error {
  constructor(
    message: string,
    readonly line: number,
  ) {
    super(`line ${line}: ${message}`);
    this.name = 'SnapshotError';
  }
}

export interface NumberedLine {
  text: string;
  line: number;
}

/**
 * Splits a byte stream into numbered lines, decoding UTF-8 across chunk boundaries
 * (invalid UTF-8 is an error, never silently replaced).
 */
export class LineSplitter {
  private readonly decoder = new TextDecoder('utf-8', { fatal: true });
  private rest = '';
  private n = 0;

  constructor(private readonly maxLineBytes = Infinity) {}

  /** The complete lines this chunk finished. */
  push(chunk: Uint8Array): NumberedLine[] {
    return this.split(this.rest + this.decoder.decode(chunk, { stream: true }), false);
  }

  /** The last line, when the input did not end with a newline. */
  end(): NumberedLine[] {
    return this.split(this.rest + this.decoder.decode(), true);
  }

  private split(text: string, final: boolean): NumberedLine[] {
    const out: NumberedLine[] = [];
    let start = 0;
    for (let nl = text.indexOf('\n'); nl !== -1; nl = text.indexOf('\n', start)) {
      out.push({ text: text.slice(start, nl), line: ++this.n });
      start = nl + 1;
    }
    this.rest = text.slice(start);
    if (this.rest.length > this.maxLineBytes) throw new SnapshotError(`line longer than ${this.maxLineBytes} bytes`, this.n + 1);
    if (final && this.rest.trim() !== '') out.push({ text: this.rest, line: ++this.n });
    return out;
  }
}

/** `tag`: the console history the snapshot's version belongs to, null when it sent none */
export type SnapshotItem = { type: 'meta'; version: number; tag: string | null } | { type: 'record'; line: number; record: ParsedRecord };

function decode(text: string, line: number): unknown {
  try {
    return JSON.parse(text);
  } catch {
    throw new SnapshotError('not valid JSON', line);
  }
}

/**
 * Reads numbered lines as a snapshot: yields the meta record first, then every record.
 * Blank lines, and records of a type this version does not know, are skipped. Throws SnapshotError at the first bad line, and at the end
 * when there was no meta record at all.
 */
export function* readSnapshot(lines: Iterable<NumberedLine>): Generator<SnapshotItem> {
  let sawMeta = false;
  let last = 0;
  for (const { text, line } of lines) {
    last = line;
    if (text.trim() === '') continue;
    const value = decode(text, line);
    if (!sawMeta) {
      const meta = parseMeta(value);
      if (!meta.ok) throw new SnapshotError(`expected the meta record first: ${meta.error}`, line);
      sawMeta = true;
      yield { type: 'meta', version: meta.value.version, tag: meta.value.tag ?? null };
      continue;
    }
    if (isOtherRecordType(value)) continue;
    const rec = parseRecord(value);
    if (!rec.ok) throw new SnapshotError(rec.error, line);
    yield { type: 'record', line, record: rec.value };
  }
  if (!sawMeta) throw new SnapshotError('empty snapshot: no meta record', Math.max(last, 1));
}

export interface SnapshotRecords {
  version: number;
  tag: string | null;
  records: { line: number; record: ParsedRecord }[];
}

/** Drains a snapshot reader into memory (small snapshots, files): validated whole before anyone writes. */
export function collectSnapshot(items: Iterable<SnapshotItem>): SnapshotRecords {
  let version = -1;
  let tag: string | null = null;
  const records: SnapshotRecords['records'] = [];
  for (const item of items) {
    if (item.type === 'meta') ({ version, tag } = item);
    else records.push({ line: item.line, record: item.record });
  }
  return { version, tag, records };
}

/** A whole snapshot given as text (a file, a test). */
export function parseSnapshotText(text: string): SnapshotRecords {
  const splitter = new LineSplitter();
  return collectSnapshot(readSnapshot([...splitter.push(Buffer.from(text)), ...splitter.end()]));
}

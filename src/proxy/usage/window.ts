/**
 * A response body, or one event of a stream, kept within bounds for the usage tap (tap.ts):
 * whole up to HEAD_CAP; past that, its first bytes and a TAIL_CAP window, from which the
 * last `"usage": {...}` is read (every supported format puts usage at or near the end).
 */
import { lastUsageObject } from './scan.js';

const HEAD_CAP = 1 << 20;
const TAIL_CAP = 64 << 10;
const PREFIX_CAP = 4 << 10;

/** Never written to: buffers here are replaced, not filled, so one empty buffer serves all. */
export const EMPTY = Buffer.alloc(0);

/** Keeps a byte stream whole up to HEAD_CAP; past that, its first bytes and a tail window. */
export class Window {
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

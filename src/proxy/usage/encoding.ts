/**
 * The usage tap of a compressed response (gzip, deflate, br): there is no synchronous
 * streaming zlib API, and end() must answer synchronously, so the compressed bytes are kept
 * up to MAX_COMPRESSED and inflated in one call at end() (output capped at MAX_INFLATED),
 * then fed to the tap of the plain body. A larger compressed response is unreadable.
 */
import * as zlib from 'node:zlib';

/** A body tap over what its end() reports (usage.ts: UsageTap = Tap<Tapped>; generic so this module imports nothing back). */
export interface Tap<R> {
  push(chunk: Buffer): void;
  end(): R;
}

const MAX_COMPRESSED = 1 << 20;
const MAX_INFLATED = 16 << 20;
const INFLATED_SLICE = 64 << 10;

type Inflate = (b: Buffer) => Buffer;
const zopts = { finishFlush: zlib.constants.Z_SYNC_FLUSH, maxOutputLength: MAX_INFLATED };
const inflaters: Record<string, Inflate> = {
  gzip: (b) => zlib.gunzipSync(b, zopts),
  'x-gzip': (b) => zlib.gunzipSync(b, zopts),
  // `deflate` is meant to be zlib-wrapped; some servers send it raw.
  deflate: (b) => {
    try {
      return zlib.inflateSync(b, zopts);
    } catch {
      return zlib.inflateRawSync(b, zopts);
    }
  },
  br: (b) =>
    zlib.brotliDecompressSync(b, {
      finishFlush: zlib.constants.BROTLI_OPERATION_FLUSH,
      maxOutputLength: MAX_INFLATED,
    }),
};

function createCompressedTap<R>(inner: Tap<R>, inflate: Inflate, unreadable: R): Tap<R> {
  let chunks: Buffer[] | null = [];
  let size = 0;
  return {
    push(chunk) {
      if (!chunks) return;
      size += chunk.length;
      if (size > MAX_COMPRESSED) chunks = null; // too large to inflate at once: give up
      else chunks.push(chunk);
    },
    end() {
      if (!chunks) return unreadable;
      let plain: Buffer;
      try {
        plain = inflate(Buffer.concat(chunks));
      } catch {
        return unreadable;
      }
      chunks = null;
      for (let i = 0; i < plain.length; i += INFLATED_SLICE) inner.push(plain.subarray(i, i + INFLATED_SLICE));
      return inner.end();
    },
  };
}

/**
 * The tap for a response in `encoding` around the plain body's tap; null for an encoding it
 * cannot read. `unreadable`: what end() reports when the body cannot be inflated.
 */
export function compressedTap<R>(encoding: string, plain: () => Tap<R>, unreadable: R): Tap<R> | null {
  const inflate = inflaters[encoding];
  return inflate ? createCompressedTap(plain(), inflate, unreadable) : null;
}

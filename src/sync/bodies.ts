/**
 * Reading the console's answers: a snapshot passed through with a stall timer, a change
 * page read only up to a size the event loop can take.
 */

/** Passes a snapshot body through, refreshing the stall timer on every chunk. */
export async function* watched(stream: ReadableStream<Uint8Array>, idle: NodeJS.Timeout): AsyncGenerator<Uint8Array> {
  for await (const chunk of stream) {
    idle.refresh();
    yield chunk;
  }
}

/**
 * A change page larger than this is not read: a snapshot, streamed to a worker, replaces
 * it. A page is read and handed over on the event loop, which DESIGN section 7 lets a
 * sync stall for no more than 50 ms.
 */
export const MAX_CHANGES_BYTES = 8 * 1024 * 1024;

/** The body as text, or null (and the rest not read) when it is longer than `limit` bytes. */
export async function textUpTo(res: Response, limit: number): Promise<string | null> {
  if (Number(res.headers.get('content-length')) > limit) {
    await res.body?.cancel().catch(() => {});
    return null;
  }
  const chunks: Uint8Array[] = [];
  let bytes = 0;
  // leaving the loop early cancels the stream
  for await (const chunk of res.body ?? []) {
    bytes += chunk.length;
    if (bytes > limit) return null;
    chunks.push(chunk);
  }
  return Buffer.concat(chunks, bytes).toString('utf8');
}

/** A log destination that keeps every write, for tests that read the lines a logger wrote. */
import { Writable } from 'node:stream';
import type pino from 'pino';

export function capture(): { writes: string[]; destination: pino.DestinationStream } {
  const writes: string[] = [];
  const destination = new Writable({
    write(chunk: Buffer, _enc, cb) {
      writes.push(chunk.toString('utf8'));
      cb();
    },
  });
  return { writes, destination: destination as unknown as pino.DestinationStream };
}

/** A log destination that keeps every write, for tests that read the lines a logger wrote. */
import { Writable } from 'node:stream';
import type pino from 'pino';
import type { LogSink } from '../../src/log.js';

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

export interface LoggedLine {
  level: string;
  fields: Record<string, unknown>;
  msg: string;
}

/** A LogSink that keeps every line, with its level. */
export function recordingLog(): { lines: LoggedLine[]; log: LogSink } {
  const lines: LoggedLine[] = [];
  const at = (level: string) => (fields: object, msg = '') => void lines.push({ level, fields: fields as Record<string, unknown>, msg });
  return { lines, log: { debug: at('debug'), info: at('info'), warn: at('warn'), error: at('error') } };
}

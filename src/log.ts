/**
 * The logger shape every module takes (pino's, narrowed to what they call), so pure
 * code, adapters and the console depend on this and not on each other or on pino.
 * Callers never pass it a key or a token.
 */
export interface LogSink {
  debug(obj: object, msg?: string): void;
  info(obj: object, msg?: string): void;
  warn(obj: object, msg?: string): void;
  error(obj: object, msg?: string): void;
}

export const quiet: LogSink = { debug() {}, info() {}, warn() {}, error() {} };

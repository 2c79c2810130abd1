/** The logger shape the sync pieces take (pino's); they never pass it a token. */
export interface SyncLogger {
  debug(obj: object, msg?: string): void;
  info(obj: object, msg?: string): void;
  warn(obj: object, msg?: string): void;
  error(obj: object, msg?: string): void;
}

export const quiet: SyncLogger = { debug() {}, info() {}, warn() {}, error() {} };

/**
 * A process that logs and exits as keyward's shutdown does: `n` access lines, then one pino
 * line, to stdout, then `flushed(logger)` and process.exit(0). Says `flushing` on stderr
 * just before the wait, so a test can hold stdout's reader until then.
 *   node --import tsx test/helpers/log-exit-main.ts <n>
 */
import { createLogger, flushed, type AccessLine } from '../../src/obs/logger.js';

const n = Number(process.argv[2]);
const logger = createLogger({ level: 'info' });
const line = (i: number): AccessLine => ({
  req_id: `req-${i}`, method: 'POST', path: '/v1/chat/completions', route: 'chat.completions', status: 200, code: null,
  key_id: 'k_1', key_kind: 'personal', project_id: null, user_id: 'u_1', model: 'gpt-4o-mini', routing: null,
  app_name: null, app_url: null, input_tokens: 10, output_tokens: 5, usage_estimated: false, client_ip: null, api_version: null, duration_ms: 1, upstream_ms: 1, shadow: [],
});
for (let i = 0; i < n; i++) {
  logger.access(line(i));
  // Batches leave as they would under load: a turn of the event loop now and then.
  if (i % 500 === 499) await new Promise((r) => setImmediate(r));
}
logger.access.flush();
logger.info('last line');
process.stderr.write('flushing\n');
await flushed(logger);
process.exit(0);

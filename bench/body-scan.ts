/**
 * Throughput of the strict body readers (`tsx bench/body-scan.ts`): the JSON scan on a
 * small and a large chat body, and the multipart reader on a 100 MB file part, in one
 * process, no I/O. Median of 5 runs.
 */
import { inspectJson } from '../src/proxy/body/json-scan.js';
import { MultipartReader } from '../src/proxy/body/multipart.js';

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)]!;
}

function chat(messages: number): Buffer {
  return Buffer.from(JSON.stringify({ model: 'gpt-4o-mini', max_tokens: 100, messages: Array.from({ length: messages }, (_, i) => ({ role: 'user', content: `hello ${i} `.repeat(20) })) }));
}

for (const [name, body, n] of [['json 2 KB', chat(10), 20_000], ['json 1 MB', chat(5000), 40]] as const) {
  for (let i = 0; i < n / 10; i++) inspectJson(body);
  const runs: number[] = [];
  for (let r = 0; r < 5; r++) {
    const t0 = performance.now();
    for (let i = 0; i < n; i++) inspectJson(body);
    runs.push((performance.now() - t0) / n);
  }
  const ms = median(runs);
  console.log(`${name.padEnd(16)} ${body.length} B  ${(ms * 1000).toFixed(1)} us/body  ${(body.length / ms / 1000).toFixed(0)} MB/s`);
}

const B = '----WebKitFormBoundary7MA4YWxkTrZu0gW';
const chunk = Buffer.alloc(64 * 1024, 0x2d); // '-' bytes: the worst case for the delimiter search
const runs: number[] = [];
for (let r = 0; r < 5; r++) {
  const reader = new MultipartReader(B);
  reader.push(Buffer.from(`--${B}\r\nContent-Disposition: form-data; name="model"\r\n\r\nwhisper-1\r\n--${B}\r\nContent-Disposition: form-data; name="file"; filename="a"\r\n\r\n`));
  const t0 = performance.now();
  for (let i = 0; i < 1600; i++) reader.push(chunk);
  runs.push(performance.now() - t0);
}
console.log(`multipart file   100 MB  ${(100 / (median(runs) / 1000)).toFixed(0)} MB/s`);

#!/usr/bin/env node
// The image's HEALTHCHECK, for both verbs it runs: healthy when the sidecar's admin /healthz
// (admin.port) or the console's /healthz (its listen port) answers 200. KEYWARD_HEALTH_URL
// names the one URL to ask instead, for ports other than the defaults.
import http from 'node:http';

const urls = process.env.KEYWARD_HEALTH_URL
  ? [process.env.KEYWARD_HEALTH_URL]
  : [`http://127.0.0.1:${process.env.KEYWARD_ADMIN_PORT ?? 9090}/healthz`, `http://127.0.0.1:${process.env.KEYWARD_CONSOLE_PORT ?? 7000}/healthz`];

const healthy = (url) =>
  new Promise((resolve) => {
    const req = http.get(url, { timeout: 2_000 }, (res) => {
      res.resume();
      resolve(res.statusCode === 200);
    });
    req.on('timeout', () => req.destroy());
    req.on('error', () => resolve(false));
  });

const answers = await Promise.all(urls.map(healthy));
process.exit(answers.some(Boolean) ? 0 : 1);

# syntax=docker/dockerfile:1
# Build stage: compiles TypeScript to dist/. better-sqlite3 13 ships N-API prebuilds for
# linux x64 and arm64 (glibc and musl) and loads them without an install script, so
# scripts are skipped: npm would otherwise run node-gyp for its binding.gyp, which needs
# Python and make, and the slim image has neither.
FROM node:24-bookworm-slim AS build
WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci --no-audit --no-fund --ignore-scripts
COPY tsconfig.json tsconfig.build.json ./
COPY scripts ./scripts
COPY src ./src
RUN npm run build \
 && npm prune --omit=dev --no-audit --no-fund

# Runtime stage: compiled JavaScript and production dependencies only (no tsx, no
# compiler), a non-root user, health from the admin listener. Runs with a read-only root
# filesystem given a writable volume for the replica (/app/data by default).
FROM node:24-bookworm-slim
# Both listeners on every interface, so the published ports answer (the example config
# keeps them on loopback outside the image).
ENV NODE_ENV=production KEYWARD_HOST=0.0.0.0 KEYWARD_ADMIN_HOST=0.0.0.0 KEYWARD_CONSOLE_HOST=0.0.0.0
WORKDIR /app
COPY --from=build --chown=node:node /app/package.json ./
COPY --from=build --chown=node:node /app/node_modules ./node_modules
COPY --from=build --chown=node:node /app/dist ./dist
COPY --chown=node:node bin ./bin
COPY --chown=node:node config ./config
RUN mkdir -p /app/data && chown node:node /app/data
USER node
EXPOSE 8080 9090 7000
# Healthy when the sidecar's admin /healthz (admin.port, default 9090) or the console's
# (default 7000) answers: the image runs both verbs. Other ports: KEYWARD_ADMIN_PORT,
# KEYWARD_CONSOLE_PORT, or the whole URL in KEYWARD_HEALTH_URL.
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
  CMD ["node", "bin/healthcheck.mjs"]
ENTRYPOINT ["node", "bin/keyward.mjs"]
CMD ["serve", "--config", "/app/config/keyward.example.yaml"]

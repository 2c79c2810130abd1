# syntax=docker/dockerfile:1
# Build stage: compiles better-sqlite3's native addon against this Node version.
FROM node:20-bookworm-slim AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 make g++ \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci --omit=dev --no-audit --no-fund
COPY bin ./bin
COPY src ./src
COPY config ./config
COPY tsconfig.json ./

# Runtime stage: no compiler, a non-root user, health from the admin listener.
FROM node:20-bookworm-slim
ENV NODE_ENV=production KEYWARD_HOST=0.0.0.0
WORKDIR /app
COPY --from=build --chown=node:node /app /app
RUN mkdir -p /app/data && chown node:node /app/data
USER node
EXPOSE 8080 9090
# The admin port is configured under admin.port (default 9090); keep them in step.
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
  CMD node -e "require('http').get('http://127.0.0.1:'+(process.env.KEYWARD_ADMIN_PORT||9090)+'/healthz',r=>process.exit(r.statusCode===200?0:1)).on('error',()=>process.exit(1))"
ENTRYPOINT ["node", "bin/keyward.mjs"]
CMD ["serve", "--config", "/app/config/keyward.example.yaml"]

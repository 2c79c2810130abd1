/**
 * deploy/kubernetes: every manifest validates against the Kubernetes schemas
 * (kubernetes-models), and the properties operators rely on hold: the sidecar shape,
 * probes on the admin port, secrets only by reference, non-root and read-only containers,
 * a volume for the replica, a grace period above the drain, a PodDisruptionBudget,
 * configs that keyward's own validation accepts, a config mount that ConfigMap edits reach
 * (live reload), and the collector its traces go to.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parse, parseAllDocuments } from 'yaml';
import { Deployment } from 'kubernetes-models/apps/v1';
import { ConfigMap, PersistentVolumeClaim, Service } from 'kubernetes-models/v1';
import { PodDisruptionBudget } from 'kubernetes-models/policy/v1';
import { loadConfigFile } from '../../src/config/file.js';
import { configSchema, type Config } from '../../src/config/schema.js';
import { consoleConfigSchema, type ConsoleConfig } from '../../src/console/config.js';

const DIR = join(import.meta.dirname, '../../deploy/kubernetes');
const MODELS: Record<string, new (data: any) => { validate(): void }> = {
  'v1/ConfigMap': ConfigMap,
  'v1/Service': Service,
  'v1/PersistentVolumeClaim': PersistentVolumeClaim,
  'apps/v1/Deployment': Deployment,
  'policy/v1/PodDisruptionBudget': PodDisruptionBudget,
};

type Doc = Record<string, any>;
const files = readdirSync(DIR).filter((f) => f.endsWith('.yaml') && f !== 'kustomization.yaml');
const docs: (Doc & { file: string })[] = files.flatMap((file) =>
  parseAllDocuments(readFileSync(join(DIR, file), 'utf8')).map((d) => {
    assert.deepEqual(d.errors, [], `${file} parses`);
    return { ...(d.toJS() as Doc), file };
  }));
const find = (kind: string, name: string) => {
  const d = docs.find((x) => x.kind === kind && x.metadata?.name === name);
  assert.ok(d, `${kind} ${name} exists`);
  return d;
};
const container = (dep: Doc, name: string) => {
  const c = (dep.spec.template.spec.containers as Doc[]).find((x) => x.name === name);
  assert.ok(c, `container ${name} in ${dep.metadata.name}`);
  return c;
};
/** The container port a probe or Service names, as a number. */
const portOf = (c: Doc, port: string | number) => (typeof port === 'number' ? port : (c.ports as Doc[]).find((p) => p.name === port)?.containerPort);

/** Loads a config from a ConfigMap through keyward's own loader, with stand-ins for the secrets it references. */
function loadFromConfigMap<T>(cm: Doc, key: string, schema: any, c: Doc): T {
  const text: string = cm.data[key];
  const refs = [...text.matchAll(/\$\{([A-Za-z_][A-Za-z0-9_]*)(:-[^}]*)?\}/g)].map((m) => m[1]!);
  const env: Record<string, string> = {};
  for (const name of refs) {
    const e = (c.env as Doc[] | undefined)?.find((x) => x.name === name);
    assert.ok(e, `${cm.metadata.name}: \${${name}} is set in container ${c.name}`);
    assert.ok(e.valueFrom?.secretKeyRef, `${name} comes from a Secret, not a literal`);
    env[name] = name.includes('REDIS') ? 'redis://redis.example:6379' : `stand-in-${name.toLowerCase()}-0123456789abcdef`;
  }
  const dir = mkdtempSync(join(tmpdir(), 'kw-k8s-'));
  try {
    const file = join(dir, key);
    writeFileSync(file, text);
    return loadConfigFile({ file, schema, env }) as T;
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

test('every manifest validates against the Kubernetes schemas, and kustomization lists them all', () => {
  assert.ok(docs.length >= 7);
  for (const d of docs) {
    const Model = MODELS[`${d.apiVersion}/${d.kind}`];
    assert.ok(Model, `${d.file}: ${d.apiVersion} ${d.kind} is one of the kinds this test knows`);
    const { file: _f, ...manifest } = d;
    assert.doesNotThrow(() => new Model(manifest).validate(), `${d.file}: ${d.kind} ${d.metadata?.name}`);
  }
  const kustomization = parse(readFileSync(join(DIR, 'kustomization.yaml'), 'utf8')) as { resources: string[] };
  assert.deepEqual([...kustomization.resources].sort(), [...files].sort());
});

test('the schema check itself catches a broken manifest', () => {
  const dep = find('Deployment', 'model-gateway');
  const { file: _f, ...broken } = structuredClone(dep);
  broken.spec.template.spec.terminationGracePeriodSeconds = '45s';
  assert.throws(() => new Deployment(broken).validate(), /terminationGracePeriodSeconds/);
});

test('secrets are referenced, never written down', () => {
  assert.equal(docs.filter((d) => d.kind === 'Secret').length, 0, 'no Secret manifest with values');
  for (const dep of docs.filter((d) => d.kind === 'Deployment')) {
    for (const c of dep.spec.template.spec.containers as Doc[]) {
      for (const e of (c.env ?? []) as Doc[]) {
        if (/TOKEN|PEPPER|MASTER|PASSWORD|SECRET|REDIS_URL/.test(e.name)) assert.ok(e.valueFrom?.secretKeyRef && e.value === undefined, `${c.name} ${e.name} from a Secret`);
      }
    }
  }
  for (const cm of docs.filter((d) => d.kind === 'ConfigMap')) {
    for (const text of Object.values(cm.data as Record<string, string>)) {
      for (const m of text.matchAll(/^\s*-?\s*"?(token|pepper|syncTokens|adminTokens)"?\s*:\s*(.+)$/gm)) {
        assert.match(m[2]!, /\$\{[A-Z_]+\}/, `${cm.metadata.name}: ${m[1]} is a \${VAR} reference`);
      }
    }
  }
});

test('gateway pod: the gateway and keyward side by side, probes on the admin port, hardened, drained in time', () => {
  const dep = find('Deployment', 'model-gateway');
  const pod = dep.spec.template.spec;
  assert.deepEqual((pod.containers as Doc[]).map((c) => c.name).sort(), ['gateway', 'keyward']);
  const kw = container(dep, 'keyward');
  const config = loadFromConfigMap<Config>(find('ConfigMap', 'keyward-config'), 'keyward.yaml', configSchema, kw);
  assert.ok(kw.args.includes('/etc/keyward/keyward.yaml'));
  assert.ok((kw.volumeMounts as Doc[]).some((m) => m.mountPath === '/etc/keyward' && (pod.volumes as Doc[]).find((v) => v.name === m.name)?.configMap?.name === 'keyward-config'));

  // Probes: readiness /readyz and liveness /healthz on the admin listener, never the proxy port.
  assert.equal(kw.readinessProbe.httpGet.path, '/readyz');
  assert.equal(kw.livenessProbe.httpGet.path, '/healthz');
  assert.equal(portOf(kw, kw.readinessProbe.httpGet.port), config.admin.port);
  assert.equal(portOf(kw, kw.livenessProbe.httpGet.port), config.admin.port);
  assert.equal(portOf(kw, 'proxy'), config.server.port);
  assert.equal(config.admin.host, '0.0.0.0', 'the kubelet reaches the admin port');
  // The gateway is reached over the pod's loopback only.
  assert.match(config.upstreams.default!.url, /^http:\/\/127\.0\.0\.1:/);
  assert.equal(container(dep, 'gateway').ports, undefined, 'the gateway exposes no port');

  // Non-root, read-only root filesystem, resources, for every container.
  assert.equal(pod.securityContext.runAsNonRoot, true);
  assert.ok(pod.securityContext.runAsUser > 0);
  for (const c of pod.containers as Doc[]) {
    assert.equal(c.securityContext?.readOnlyRootFilesystem, true, `${c.name} read-only root`);
    assert.equal(c.securityContext?.allowPrivilegeEscalation, false, c.name);
    assert.deepEqual(c.securityContext?.capabilities?.drop, ['ALL'], c.name);
    assert.ok(c.resources?.requests?.cpu && c.resources?.requests?.memory && c.resources?.limits?.memory, `${c.name} resources`);
  }
  // The replica lives on a writable volume.
  const replicaMount = (kw.volumeMounts as Doc[]).find((m) => config.replica.path.startsWith(`${m.mountPath}/`));
  assert.ok(replicaMount && !replicaMount.readOnly, 'replica.path is on a mounted volume');
  assert.ok((pod.volumes as Doc[]).find((v) => v.name === replicaMount.name)?.emptyDir);

  // Grace: keyward's preStop pause plus its drain fit inside the pod's grace period, and the
  // gateway stays up at least as long as keyward drains.
  const pause = kw.lifecycle?.preStop?.sleep?.seconds ?? 0;
  assert.ok(pod.terminationGracePeriodSeconds * 1000 > pause * 1000 + config.server.shutdownGraceMs, 'terminationGracePeriodSeconds above the drain');
  assert.ok(container(dep, 'gateway').lifecycle.preStop.sleep.seconds * 1000 >= pause * 1000 + config.server.shutdownGraceMs, 'the gateway outlives the drain');

  // Service and PDB select these pods; the Service reaches the proxy port.
  const labels = dep.spec.template.metadata.labels;
  const svc = find('Service', 'model-gateway');
  for (const [k, v] of Object.entries(svc.spec.selector)) assert.equal(labels[k], v);
  assert.equal(portOf(kw, svc.spec.ports[0].targetPort), config.server.port);
  const pdb = find('PodDisruptionBudget', 'model-gateway');
  for (const [k, v] of Object.entries(pdb.spec.selector.matchLabels)) assert.equal(labels[k], v);
  assert.ok(pdb.spec.minAvailable >= 1 && pdb.spec.minAvailable < dep.spec.replicas, 'a drain can proceed and never empties the service');
  // Several replicas share one Redis, so limits hold across them.
  assert.ok(config.redis, 'redis configured');
  assert.match(config.console!.url, /^http:\/\/keyward-console:/);
});

test('the config reaches running pods: the ConfigMap is mounted as a directory, without subPath, under a fixed name', () => {
  const dep = find('Deployment', 'model-gateway');
  const pod = dep.spec.template.spec;
  const kw = container(dep, 'keyward');
  const file: string = kw.args[kw.args.indexOf('--config') + 1];
  const mount = (kw.volumeMounts as Doc[]).find((m) => file.startsWith(`${m.mountPath}/`));
  assert.ok(mount, `${file} is on a mounted volume`);
  // A subPath mount is a copy made at start: the kubelet never updates it, so a reload would never see an edit.
  assert.equal(mount.subPath, undefined, 'no subPath on the config mount');
  assert.equal(mount.subPathExpr, undefined, 'no subPathExpr on the config mount');
  const volume = (pod.volumes as Doc[]).find((v) => v.name === mount.name);
  assert.ok(volume?.configMap, 'the config mount is a ConfigMap volume');
  // The file is the ConfigMap key under the mount (no items remapping it away), and the
  // ConfigMap has a fixed name: an edit updates this one rather than rolling out a new one.
  assert.equal(volume.configMap.items, undefined);
  const cm = find('ConfigMap', volume.configMap.name);
  assert.ok(file.slice(mount.mountPath.length + 1) in cm.data, `${file} is a key of ${cm.metadata.name}`);
  assert.equal(cm.immutable, undefined, 'an immutable ConfigMap could not be edited');
  const kustomization = parse(readFileSync(join(DIR, 'kustomization.yaml'), 'utf8')) as Doc;
  assert.equal(kustomization.configMapGenerator, undefined, 'generated (hash-suffixed) ConfigMaps would roll pods instead of reloading them');
});

test('console: its own Deployment and Service, config accepted, store on a persistent volume', () => {
  const dep = find('Deployment', 'keyward-console');
  const pod = dep.spec.template.spec;
  const c = container(dep, 'console');
  const config = loadFromConfigMap<ConsoleConfig>(find('ConfigMap', 'keyward-console-config'), 'console.yaml', consoleConfigSchema, c);
  const master = (c.env as Doc[]).find((e) => e.name === config.masterKeyEnv);
  assert.ok(master?.valueFrom?.secretKeyRef, 'the master key comes from a Secret');
  assert.equal(config.listen.host, '0.0.0.0');
  assert.equal(portOf(c, 'http'), config.listen.port);
  assert.equal(c.readinessProbe.httpGet.path, '/healthz');
  assert.equal(portOf(c, c.readinessProbe.httpGet.port), config.listen.port);
  assert.equal(dep.spec.replicas, 1);
  assert.equal(dep.spec.strategy.type, 'Recreate', 'one writer on the SQLite store');
  assert.equal(pod.securityContext.runAsNonRoot, true);
  assert.equal(c.securityContext.readOnlyRootFilesystem, true);
  const store = (c.volumeMounts as Doc[]).find((m) => config.store.path.startsWith(`${m.mountPath}/`));
  assert.ok(store, 'store.path is on a mounted volume');
  const claim = (pod.volumes as Doc[]).find((v) => v.name === store.name)?.persistentVolumeClaim?.claimName;
  find('PersistentVolumeClaim', claim);
  const svc = find('Service', 'keyward-console');
  for (const [k, v] of Object.entries(svc.spec.selector)) assert.equal(dep.spec.template.metadata.labels[k], v);
  assert.equal(portOf(c, svc.spec.ports[0].targetPort), config.listen.port);
  // Sidecars and console hash keys the same way, or no key authenticates.
  const gw = loadFromConfigMap<Config>(find('ConfigMap', 'keyward-config'), 'keyward.yaml', configSchema, container(find('Deployment', 'model-gateway'), 'keyward'));
  assert.equal(gw.keys.hash, config.keys.hash);
  assert.equal(`${svc.metadata.name}:${svc.spec.ports[0].port}`, new URL(gw.console!.url).host);
});

test('traces: keyward exports to the collector Service, which runs deploy/collector/otel-collector.yaml', () => {
  const gw = loadFromConfigMap<Config>(find('ConfigMap', 'keyward-config'), 'keyward.yaml', configSchema, container(find('Deployment', 'model-gateway'), 'keyward'));
  assert.ok(gw.tracing, 'the gateway pods trace');
  const svc = find('Service', 'otel-collector');
  const port = svc.spec.ports.find((p: Doc) => p.name === 'otlp-http');
  assert.equal(new URL(gw.tracing.otlpUrl).host, `${svc.metadata.name}:${port.port}`);
  const dep = find('Deployment', 'otel-collector');
  const c = container(dep, 'otel-collector');
  for (const [k, v] of Object.entries(svc.spec.selector)) assert.equal(dep.spec.template.metadata.labels[k], v);
  assert.equal(portOf(c, port.targetPort), 4318);

  // The ConfigMap's config is the example file, and the container reads it from its mount.
  const cm = find('ConfigMap', 'otel-collector-config');
  const example = parse(readFileSync(join(DIR, '../collector/otel-collector.yaml'), 'utf8'));
  assert.deepEqual(parse(cm.data['config.yaml']), example);
  const mount = (c.volumeMounts as Doc[]).find((m) => (dep.spec.template.spec.volumes as Doc[]).find((v) => v.name === m.name)?.configMap?.name === cm.metadata.name);
  assert.ok(mount && c.args.includes(`--config=${mount.mountPath}/config.yaml`), 'the collector runs the ConfigMap');

  // OTLP/HTTP on 4318 on every interface, batched, to the debug exporter, for traces.
  assert.equal(example.receivers.otlp.protocols.http.endpoint, '0.0.0.0:4318');
  assert.equal(example.receivers.otlp.protocols.grpc, undefined, 'keyward speaks OTLP/HTTP only');
  const pipeline = example.service.pipelines.traces;
  assert.deepEqual(pipeline.receivers, ['otlp']);
  assert.ok(pipeline.processors.includes('batch') && 'batch' in example.processors);
  assert.ok(pipeline.exporters.includes('debug') && 'debug' in example.exporters);
  for (const name of [...pipeline.processors, ...pipeline.exporters]) assert.ok(name in { ...example.processors, ...example.exporters }, `${name} is defined`);

  const pod = dep.spec.template.spec;
  assert.equal(pod.securityContext.runAsNonRoot, true);
  assert.equal(c.securityContext.readOnlyRootFilesystem, true);
  assert.equal(c.securityContext.allowPrivilegeEscalation, false);
  assert.ok(c.resources?.requests?.memory && c.resources?.limits?.memory);
});

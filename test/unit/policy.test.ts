import { test } from 'node:test';
import assert from 'node:assert/strict';
import { checkKey, checkModel, checkStanding, modelInScope, type PolicyFacts, type PolicyKey, type PolicyProject } from '../../src/policy/decide.js';
import { STATUS, type Denial } from '../../src/errors.js';
import type { RouteClass } from '../../src/routes.js';

const key = (over: Partial<PolicyKey> = {}): PolicyKey => ({ id: 'k_1', kind: 'team', status: 'active', budget: null, spent: 0, models: null, ...over });
const project = (over: Partial<PolicyProject> = {}): PolicyProject => ({ status: 'enabled', budget: null, spent: 0, ...over });
const team = (k: Partial<PolicyKey> = {}, p: Partial<PolicyProject> | null = {}): PolicyFacts => ({
  key: key({ kind: 'team', ...k }),
  project: p === null ? null : project(p),
  walletBalance: null,
});
const personal = (balance: number | null, k: Partial<PolicyKey> = {}): PolicyFacts => ({ key: key({ kind: 'personal', ...k }), project: null, walletBalance: balance });

const statusOf = (d: Denial) => d.status ?? STATUS[d.code];
const summary = (d: Denial | null) => (d === null ? null : `${statusOf(d)} ${d.code}`);

test('checkKey: unknown key is the caller-supplied invalid_api_key denial', () => {
  let calls = 0;
  const d = checkKey(null, () => {
    calls++;
    return { code: 'invalid_api_key', message: 'custom unknown message' };
  });
  assert.equal(summary(d), '401 invalid_api_key');
  assert.equal(d?.message, 'custom unknown message');
  assert.equal(calls, 1);
});

test('checkKey: deleted is api_key_deleted whatever the standing; active passes without building the unknown message', () => {
  const never = () => assert.fail('unknown-key message built for a known key');
  const worst: PolicyFacts = team({ status: 'deleted', budget: 1, spent: 5 }, { status: 'disabled', budget: 1, spent: 5 });
  assert.equal(summary(checkKey(worst, never)), '401 api_key_deleted');
  assert.equal(summary(checkKey(personal(0, { status: 'deleted' }), never)), '401 api_key_deleted');
  assert.equal(checkKey(team(), never), null);
  assert.equal(checkKey(personal(0), never), null);
  assert.equal(checkKey(team({}, { status: 'disabled' }), never), null);
});

// [description, facts, route class, expected "status code" or null]
const STANDING: [string, PolicyFacts, RouteClass, string | null][] = [
  // listing: only steps 1-3
  ['listing, team, disabled project', team({}, { status: 'disabled' }), 'listing', null],
  ['listing, team, missing project', team({}, null), 'listing', null],
  ['listing, team, budgets spent', team({ budget: 1, spent: 1 }, { budget: 1, spent: 1 }), 'listing', null],
  ['listing, personal, empty wallet', personal(0), 'listing', null],
  ['listing, personal, no wallet', personal(null), 'listing', null],
  // files: step 4 only
  ['files, team, enabled', team(), 'files', null],
  ['files, team, disabled project', team({}, { status: 'disabled' }), 'files', '403 project_disabled'],
  ['files, team, project missing from replica', team({}, null), 'files', '403 project_disabled'],
  ['files, team, budgets spent', team({ budget: 1, spent: 2 }, { budget: 1, spent: 2 }), 'files', null],
  ['files, personal, zero balance', personal(0), 'files', null],
  ['files, personal, negative balance', personal(-3), 'files', null],
  ['files, personal, no wallet', personal(null), 'files', null],
  // model: step 5
  ['model, team, all fine', team({ budget: 10, spent: 9.99 }, { budget: 100, spent: 99.5 }), 'model', null],
  ['model, team, null budgets with huge spend', team({ budget: null, spent: 1e9 }, { budget: null, spent: 1e9 }), 'model', null],
  ['model, team, disabled project', team({}, { status: 'disabled' }), 'model', '402 project_disabled'],
  ['model, team, project missing from replica', team({}, null), 'model', '402 project_disabled'],
  ['model, team, disabled beats both budgets', team({ budget: 1, spent: 1 }, { status: 'disabled', budget: 1, spent: 1 }), 'model', '402 project_disabled'],
  ['model, team, key budget spent == budget', team({ budget: 10, spent: 10 }), 'model', '402 key_budget_exhausted'],
  ['model, team, key budget overspent', team({ budget: 10, spent: 12.5 }), 'model', '402 key_budget_exhausted'],
  ['model, team, key budget zero', team({ budget: 0, spent: 0 }), 'model', '402 key_budget_exhausted'],
  ['model, team, key budget beats project budget', team({ budget: 5, spent: 5 }, { budget: 1, spent: 1 }), 'model', '402 key_budget_exhausted'],
  ['model, team, project spent == budget', team({ budget: 10, spent: 1 }, { budget: 100, spent: 100 }), 'model', '402 project_budget_exhausted'],
  ['model, team, project overspent, key unlimited', team({}, { budget: 100, spent: 150 }), 'model', '402 project_budget_exhausted'],
  ['model, team, project budget zero', team({}, { budget: 0, spent: 0 }), 'model', '402 project_budget_exhausted'],
  ['model, team, just under both budgets', team({ budget: 1, spent: 0.999999 }, { budget: 1, spent: 0.999999 }), 'model', null],
  ['model, personal, positive balance', personal(0.01), 'model', null],
  ['model, personal, zero balance', personal(0), 'model', '402 insufficient_balance'],
  ['model, personal, negative balance', personal(-1), 'model', '402 insufficient_balance'],
  ['model, personal, no wallet counts as zero', personal(null), 'model', '402 insufficient_balance'],
];

for (const [name, facts, cls, want] of STANDING) {
  test(`checkStanding: ${name} -> ${want ?? 'allowed'}`, () => {
    const d = checkStanding(facts, cls);
    assert.equal(summary(d), want);
    if (d) assert.ok(d.message.length > 0);
  });
}

test('checkStanding: a team key with a wallet still uses the project; a personal key with a wallet ignores key budgets', () => {
  assert.equal(summary(checkStanding({ ...team({}, { status: 'disabled' }), walletBalance: 100 }, 'model')), '402 project_disabled');
  assert.equal(checkStanding(personal(5, { budget: null, spent: 3 }), 'model'), null);
});

// [scope, model, in scope?]
const SCOPE: [string[] | null, string, boolean][] = [
  [null, 'anything', true],
  [[], 'anything', true],
  [['gpt-4o*'], 'gpt-4o', true],
  [['gpt-4o*'], 'gpt-4o-mini', true],
  [['gpt-4o*'], 'gpt-4o-2024-08-06', true],
  [['gpt-4o*'], 'xgpt-4o', false],
  [['gpt-4o*'], 'gpt-4', false],
  [['gpt-4o*'], 'GPT-4o', false],
  [['claude-*'], 'claude-3-5-sonnet-latest', true],
  [['claude-*'], 'claude-', true],
  [['claude-*'], 'claude', false],
  [['claude-*'], 'anthropic/claude-3', false],
  [['gpt-4o'], 'gpt-4o', true],
  [['gpt-4o'], 'gpt-4o-mini', false],
  [['gpt-4o'], 'my-gpt-4o', false],
  [['gpt-4.1'], 'gpt-4.1', true],
  [['gpt-4.1'], 'gpt-4x1', false],
  [['gpt-4.1*'], 'gpt-4-1-mini', false],
  [['*'], 'whatever/model:v1', true],
  [['*-mini'], 'gpt-4o-mini', true],
  [['*-mini'], 'gpt-4o-mini-2', false],
  [['a*b*c'], 'aXXbYYc', true],
  [['a*b*c'], 'abc', true],
  [['a*b*c'], 'acb', false],
  [['a+b'], 'a+b', true],
  [['a+b'], 'aab', false],
  [['m(1)'], 'm(1)', true],
  [['m(1)'], 'm1', false],
  [['x?'], 'x?', true],
  [['x?'], 'x', false],
  [['[ab]'], '[ab]', true],
  [['[ab]'], 'a', false],
  [['a|b'], 'a', false],
  [['a|b'], 'a|b', true],
  [['^a$'], '^a$', true],
  [['^a$'], 'a', false],
  [['a\\d'], 'a1', false],
  [['a\\d'], 'a\\d', true],
  [['a{2}'], 'aa', false],
  [['a{2}'], 'a{2}', true],
  [['org/model:v1*'], 'org/model:v1.2', true],
  [['gpt-4o*', 'claude-*'], 'claude-opus', true],
  [['gpt-4o*', 'claude-*'], 'gemini-pro', false],
  [[''], '', true],
  [[''], 'x', false],
];

for (const [scope, model, want] of SCOPE) {
  test(`modelInScope(${JSON.stringify(scope)}, ${JSON.stringify(model)}) = ${want}`, () => {
    assert.equal(modelInScope(scope, model), want);
    const d = checkModel(key({ models: scope }), model);
    assert.equal(summary(d), want ? null : '403 model_not_allowed');
  });
}

test('checkModel: no model passes an unrestricted key, not a restricted one', () => {
  assert.equal(checkModel(key({ models: null }), null), null);
  assert.equal(checkModel(key({ models: [] }), null), null);
  assert.equal(summary(checkModel(key({ models: ['gpt-*'] }), null)), '403 model_not_allowed');
  assert.equal(summary(checkModel(key({ models: ['*'] }), null)), '403 model_not_allowed');
});

test('checkModel: the denial names the model, bounded and without control characters', () => {
  const d = checkModel(key({ models: ['gpt-*'] }), 'claude-3\u0000\n');
  assert.ok(d);
  assert.match(d.message, /claude-3/);
  assert.doesNotMatch(d.message, /\p{Cc}/u);
  const long = checkModel(key({ models: ['gpt-*'] }), 'x'.repeat(10_000));
  assert.ok(long && long.message.length < 300);
});

test('glob results do not depend on evaluation order (cache)', () => {
  for (let i = 0; i < 3; i++) {
    assert.equal(modelInScope(['gpt-4o*'], 'gpt-4o-mini'), true);
    assert.equal(modelInScope(['gpt-4o*'], 'xgpt-4o'), false);
  }
});

// A literal between two stars is found in characters of its own: reusing the anchored
// suffix's characters would admit models the scope does not name.
const OVERLAP: [string[], string, boolean][] = [
  [['a*b*bc'], 'abc', false],
  [['a*b*bc'], 'abbc', true],
  [['*mini*mini'], 'gpt-4o-mini', false],
  [['*mini*mini'], 'mini-mini', true],
  [['gpt-*4o*4o'], 'gpt-4o', false],
  [['gpt-*4o*4o'], 'gpt-4o-4o', true],
  [['*o1*o1-mini'], 'o1-mini', false],
  [['*o1*o1-mini'], 'ft:o1:o1-mini', true],
];

test('modelInScope: a middle literal never borrows the suffix\'s characters', () => {
  for (const [scope, model, want] of OVERLAP) {
    assert.equal(modelInScope(scope, model), want, `${scope[0]} ~ ${model}`);
    assert.equal(summary(checkModel(key({ models: scope }), model)), want ? null : '403 model_not_allowed', `${scope[0]} ~ ${model}`);
  }
});

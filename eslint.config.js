// Lint: typescript-eslint's recommended rules plus the type-aware ones that catch
// what the compiler does not: promises nobody awaits or handles, and async callbacks
// passed where nothing waits for them.
import js from '@eslint/js';
import tseslint from 'typescript-eslint';

// DESIGN section 1, "Public interfaces only": src/ uses Node and its dependencies through
// what they document. These catch the usual ways of reaching inside them
// (test/unit/public-interfaces.test.ts shows each one firing).
export const publicInterfacesOnly = [
  { selector: 'MemberExpression[computed=false][property.name=/^_/]', message: 'A `_` field is private to its owner: use a documented interface (DESIGN section 1).' },
  { selector: 'CallExpression[callee.property.name="getOwnPropertySymbols"]', message: "Finding another module's symbols reaches into its internals (DESIGN section 1)." },
  { selector: 'BinaryExpression > MemberExpression[property.name="description"]', message: 'A symbol found by its description is a private member (DESIGN section 1).' },
  { selector: 'AssignmentExpression > MemberExpression.left[object.property.name="prototype"]', message: 'Replacing a prototype method changes code keyward does not own (DESIGN section 1).' },
  {
    selector: 'MemberExpression[property.name=/^(webPasses|wsPasses|hashMap|freeSockets|toWritable|addRequest|async_id_symbol)$/]',
    message: 'An internal of Node or of a dependency: use its documented interface (DESIGN section 1).',
  },
];

export default tseslint.config(
  { ignores: ['dist/**', 'node_modules/**', 'coverage/**', '.bench/**'] },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    languageOptions: {
      parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname },
    },
    rules: {
      // node:test's test() and describe() return promises the runner itself tracks.
      '@typescript-eslint/no-floating-promises': [
        'error',
        { allowForKnownSafeCalls: [{ from: 'package', package: 'node:test', name: ['test', 'describe', 'it', 'suite', 'before', 'after', 'beforeEach', 'afterEach'] }] },
      ],
      '@typescript-eslint/no-misused-promises': ['error', { checksVoidReturn: { arguments: false } }],
      '@typescript-eslint/await-thenable': 'error',
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', varsIgnorePattern: '^_', caughtErrors: 'none' }],
      '@typescript-eslint/no-non-null-assertion': 'off',
      '@typescript-eslint/no-empty-function': 'off',
    },
  },
  {
    files: ['src/**/*.ts'],
    rules: {
      'no-restricted-syntax': ['error', ...publicInterfacesOnly],
    },
  },
  {
    // commander's option bags and raw JSON answers in tests and the admin CLI are untyped by nature
    files: ['test/**/*.ts', 'src/console/cli*.ts', 'src/app/console-cli.ts'],
    rules: { '@typescript-eslint/no-explicit-any': 'off' },
  },
  {
    files: ['**/*.js', '**/*.mjs'],
    extends: [tseslint.configs.disableTypeChecked],
    languageOptions: { globals: { process: 'readonly', console: 'readonly', URL: 'readonly' } },
  },
  {
    // the console's web page runs in the browser
    files: ['src/console/web/**/*.js'],
    languageOptions: {
      globals: Object.fromEntries(
        ['document', 'window', 'navigator', 'sessionStorage', 'fetch', 'Node', 'URL', 'setTimeout', 'clearTimeout', 'console'].map((g) => [g, 'readonly']),
      ),
    },
  },
);

// Lint: typescript-eslint's recommended rules plus the type-aware ones that catch
// what the compiler does not: promises nobody awaits or handles, and async callbacks
// passed where nothing waits for them.
import js from '@eslint/js';
import tseslint from 'typescript-eslint';

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
    // commander's option bags and raw JSON answers in tests and the admin CLI are untyped by nature
    files: ['test/**/*.ts', 'src/console/cli*.ts'],
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

/**
 * A stand-alone entry with just the console's CLI verbs, so tests can run
 * `keyward console --config FILE` as a real process (signals, exit code, stdout).
 */
import { Command } from 'commander';
import { registerConsoleCommands } from '../../src/app/console-cli.js';

const program = new Command('keyward');
registerConsoleCommands(program);
await program.parseAsync(process.argv);

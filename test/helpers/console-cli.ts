/** The console's CLI verbs run in-process, with what they print captured. */
import { Command } from 'commander';
import { registerConsoleCommands, type CliIO } from '../../src/app/console-cli.js';

/** Runs one CLI invocation in-process (argv without `node script`); returns what it printed and its exit code. */
export async function runConsoleCli(argv: string[], io: Partial<Omit<CliIO, 'stdout' | 'stderr' | 'setExitCode'>> = {}): Promise<{ code: number; stdout: string; stderr: string }> {
  let stdout = '';
  let stderr = '';
  let code = 0;
  const program = new Command('keyward').exitOverride().configureOutput({ writeOut: (t) => void (stdout += t), writeErr: (t) => void (stderr += t) });
  registerConsoleCommands(program, { ...io, stdout: (t) => void (stdout += t), stderr: (t) => void (stderr += t), setExitCode: (c) => void (code = c) });
  try {
    await program.parseAsync(argv, { from: 'user' });
  } catch (err) {
    const exit = (err as { exitCode?: number }).exitCode;
    if (exit === undefined) throw err;
    code = exit;
  }
  return { code, stdout, stderr };
}

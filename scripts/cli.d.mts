export interface Flag {
  type: 'string' | 'boolean';
  short?: string;
  multiple?: boolean;
  /** The value's placeholder in the help, e.g. HOST:PORT. */
  value?: string;
  help: string;
}

export interface Verb {
  name: string;
  /** Its positional arguments, e.g. `<run>`: each `<…>` is one required argument. */
  args: string;
  help: string;
}

export interface EnvVar {
  name: string;
  help: string;
}

/** A command's whole interface: what its help shows and what parseCommandLine accepts. */
export interface CommandSpec<F extends Record<string, Flag> = Record<string, Flag>> {
  /** Prefix of usage errors, e.g. `run`. */
  name: string;
  /** How a user runs it, e.g. `npm run run`. */
  invocation: string;
  /** Synopsis lines. */
  usage: string[];
  summary: string;
  verbs?: Verb[];
  flags: F;
  env: EnvVar[];
  /** Shown instead of the environment list when it is empty. */
  noEnv?: string;
  notes?: string[];
}

type FlagValue<T extends Flag> = T['type'] extends 'string' ? (T['multiple'] extends true ? string[] : string) : boolean;
export type FlagValues<F extends Record<string, Flag>> = { [K in keyof F]?: FlagValue<F[K]> };

export function defineCommand<const F extends Record<string, Flag>>(spec: CommandSpec<F>): CommandSpec<F>;
export function usageText(spec: CommandSpec<Record<string, Flag>>): string;
export function helpText(spec: CommandSpec<Record<string, Flag>>): string;
export function exitWithUsageError(spec: CommandSpec<Record<string, Flag>>, message: string): never;
export function parseCommandLine<F extends Record<string, Flag>>(
  spec: CommandSpec<F>,
  argv: readonly string[],
): { values: FlagValues<F>; positionals: string[]; verb: string | undefined; args: string[] };

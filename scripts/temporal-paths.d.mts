export interface ResolvedBinary {
  /** Absolute path of the executable. */
  path: string;
  /** e.g. "1.9.1"; "unknown" for a test server found outside the venv (it has no --version). */
  version: string;
  source: 'env' | 'PATH' | 'venv';
  size: number;
  mtimeMs: number;
  versionText?: string;
}

export interface TemporalPaths {
  cli: ResolvedBinary;
  testServer: ResolvedBinary;
  venv?: { requirementsSha256: string };
}

export const projectRoot: string;
export const temporalJsonPath: string;
/** Throws a "run npm run bootstrap" error when .tools/temporal.json is missing. */
export function readTemporalPaths(): TemporalPaths;

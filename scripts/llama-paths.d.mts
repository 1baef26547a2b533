export interface LlamaStatus {
  state: 'building' | 'ready' | 'failed';
  pid: number;
  started_at: string;
  finished_at?: string;
  /** Wall time of the build (ready or failed). */
  seconds?: number;
  log: string;
  requirements_sha256: string;
  /** When ready: the venv's python (run `python -m llama_cpp.server`) and the GGUF model file. */
  python?: string;
  model?: string;
  llama_cpp_version?: string;
  error?: string;
}

export interface LlamaPaths {
  toolsDir: string;
  venvDir: string;
  statusFile: string;
  logFile: string;
  lockFile: string;
  requirementsFile: string;
  depsFile: string;
  buildScript: string;
}

export function llamaPaths(): LlamaPaths;
export function llamaDigest(): string;
export function readLlamaStatus(): LlamaStatus | undefined;
export function writeLlamaStatus(status: LlamaStatus): void;
/** Starts scripts/llama-build.mjs detached unless it is done for these pins or already running. */
export function startLlamaBuild(): 'ready' | 'building' | 'started';
/** The installed server once its build is ready; rejects (with the log's tail) when it failed or died. */
export function waitForLlama(opts?: { timeoutMs?: number; onWait?: (message: string) => void }): Promise<{ python: string; model: string; seconds: number }>;
export const LLAMA_MODEL_ALIAS: string;
/** `python -m llama_cpp.server` arguments as the project runs it (see llama-paths.mjs). */
export function llamaServerArgs(o: { model: string; port: number; apiKey?: string; threads?: number; contextSize?: number }): string[];

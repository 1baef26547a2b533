// The llama.cpp server of the tests: where scripts/llama-build.mjs puts it, its state
// (.tools/llama.json), starting that build in the background (scripts/bootstrap.mjs) and waiting
// for it (the tests and configs that use llama.cpp; nothing else ever waits). Builtins only.
import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { closeSync, existsSync, mkdirSync, openSync, readFileSync, renameSync, unlinkSync, writeFileSync, writeSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');

export function llamaPaths() {
  const toolsDir = join(root, '.tools');
  return {
    toolsDir,
    venvDir: join(toolsDir, 'llama-venv'),
    statusFile: join(toolsDir, 'llama.json'),
    logFile: join(toolsDir, 'llama-build.log'),
    lockFile: join(toolsDir, 'llama.lock'),
    requirementsFile: join(root, 'scripts', 'llama-requirements.txt'),
    depsFile: join(root, 'scripts', 'llama-deps.txt'),
    buildScript: join(root, 'scripts', 'llama-build.mjs'),
  };
}

/** What the build installs and how: a change of a pin file or of the build script means building again. */
export function llamaDigest() {
  const p = llamaPaths();
  const h = createHash('sha256');
  for (const f of [p.requirementsFile, p.depsFile, p.buildScript]) h.update(readFileSync(f));
  return h.digest('hex');
}

/** @returns {import('./llama-paths.d.mts').LlamaStatus | undefined} */
export function readLlamaStatus() {
  try {
    return JSON.parse(readFileSync(llamaPaths().statusFile, 'utf8'));
  } catch {
    return undefined;
  }
}

export function writeLlamaStatus(status) {
  const file = llamaPaths().statusFile;
  const tmp = `${file}.${process.pid}.tmp`;
  writeFileSync(tmp, `${JSON.stringify(status, null, 2)}\n`);
  renameSync(tmp, file);
}

function alive(pid) {
  if (!Number.isInteger(pid) || pid <= 0) return false;
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return err.code === 'EPERM';
  }
}

function isReady(s, digest) {
  return s?.state === 'ready' && s.requirements_sha256 === digest && existsSync(s.python) && existsSync(s.model);
}

/** One builder at a time: the lock file names its pid; a dead holder's lock is taken over. */
function takeLock(lockFile) {
  for (let i = 0; i < 2; i++) {
    try {
      const fd = openSync(lockFile, 'wx');
      writeSync(fd, String(process.pid));
      closeSync(fd);
      return true;
    } catch (err) {
      if (err.code !== 'EEXIST') throw err;
      const holder = Number(readFileSync(lockFile, 'utf8').trim());
      if (alive(holder)) return false;
      unlinkSync(lockFile);
    }
  }
  return false;
}

/**
 * Starts the build in the background unless it is done for these pins or running. Returns what it
 * found or did, for the bootstrap's log line.
 * @returns {'ready' | 'building' | 'started'}
 */
export function startLlamaBuild() {
  const p = llamaPaths();
  const digest = llamaDigest();
  if (isReady(readLlamaStatus(), digest)) return 'ready';
  mkdirSync(p.toolsDir, { recursive: true });
  if (!takeLock(p.lockFile)) return 'building';
  const log = openSync(p.logFile, 'w');
  const child = spawn(process.execPath, [p.buildScript], { detached: true, stdio: ['ignore', log, log], cwd: root });
  closeSync(log);
  writeFileSync(p.lockFile, String(child.pid));
  writeLlamaStatus({ state: 'building', pid: child.pid, started_at: new Date().toISOString(), log: p.logFile, requirements_sha256: digest });
  child.unref();
  return 'started';
}

function logTail(file, lines = 30) {
  try {
    return readFileSync(file, 'utf8').trim().split('\n').slice(-lines).join('\n');
  } catch {
    return '(no log)';
  }
}

/**
 * Resolves with the installed server once the build is ready; rejects with the reason (and the
 * log's tail) when it failed, died, or takes longer than `timeoutMs`.
 * @param {{ timeoutMs?: number, onWait?: (message: string) => void }} [opts]
 * @returns {Promise<{ python: string, model: string, seconds: number }>}
 */
export async function waitForLlama(opts = {}) {
  const p = llamaPaths();
  const digest = llamaDigest();
  const deadline = Date.now() + (opts.timeoutMs ?? 60 * 60_000);
  let lastNote = 0;
  for (;;) {
    const s = readLlamaStatus();
    if (isReady(s, digest)) return { python: s.python, model: s.model, seconds: s.seconds };
    if (!s || s.requirements_sha256 !== digest) {
      throw new Error(`the llama.cpp server is not built for the current pins (${p.statusFile}): run \`npm run bootstrap\` (npm test does it for you)`);
    }
    if (s.state === 'failed') throw new Error(`the llama.cpp server build failed: ${s.error}\n--- ${p.logFile} (tail)\n${logTail(p.logFile)}`);
    if (s.state === 'ready') throw new Error(`${p.statusFile} says ready, but ${s.python} or ${s.model} is missing: delete it and run \`npm run bootstrap\``);
    if (!alive(s.pid))
      throw new Error(
        `the llama.cpp server build (pid ${s.pid}) stopped without finishing: run \`npm run bootstrap\` to start it again\n--- ${p.logFile} (tail)\n${logTail(p.logFile, 10)}`,
      );
    if (Date.now() > deadline) throw new Error(`the llama.cpp server build (pid ${s.pid}, started ${s.started_at}) is still running; see ${p.logFile}`);
    if (Date.now() - lastNote >= 60_000) {
      lastNote = Date.now();
      const min = ((Date.now() - Date.parse(s.started_at)) / 60_000).toFixed(1);
      (opts.onWait ?? ((m) => process.stderr.write(`${m}\n`)))(`waiting for the llama.cpp server build (running ${min} min, log ${p.logFile})`);
    }
    await new Promise((r) => setTimeout(r, 2_000));
  }
}

/** The name the llama.cpp server serves the model under (`served_model` in the deployment). */
export const LLAMA_MODEL_ALIAS = 'smollm2';

/**
 * The arguments of `python -m llama_cpp.server` as the project runs it: the SmolLM2 model under
 * LLAMA_MODEL_ALIAS with the chat template of its GGUF file, requests served one after another
 * (instead of a new one interrupting a running stream), a fixed seed, quiet logs. `apiKey` makes
 * it require `Authorization: Bearer <key>`. With this template llama.cpp makes a tool call when the
 * request names the function (`tool_choice: {"type": "function", ...}`: arguments decoded under the
 * tool's JSON schema, bounded by `max_tokens`); with `auto` the model answers in text. (Its
 * `chatml-function-calling` format lets the model choose, but decodes arguments without
 * `max_tokens`, and a 135M model can run on to the end of the context.)
 * @param {{ model: string, port: number, apiKey?: string, threads?: number, contextSize?: number }} o
 */
export function llamaServerArgs(o) {
  const args = ['-m', 'llama_cpp.server', '--model', o.model, '--model_alias', LLAMA_MODEL_ALIAS, '--host', '127.0.0.1', '--port', String(o.port)];
  args.push('--interrupt_requests', 'false', '--n_ctx', String(o.contextSize ?? 2048));
  args.push('--n_threads', String(o.threads ?? 2), '--seed', '7', '--verbose', 'false');
  if (o.apiKey) args.push('--api_key', o.apiKey);
  return args;
}

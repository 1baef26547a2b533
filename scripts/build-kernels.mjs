// Builds protocol/json-kernels.wasm from its source, protocol/json-kernels.wat, with wabt's
// wat2wasm (the npm package, pinned in package.json). Run by the bootstrap when the .wasm is
// missing or older than the .wat; `node scripts/build-kernels.mjs` builds it by hand.
import { readFileSync, renameSync, statSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');
export const KERNELS_SOURCE = join(root, 'protocol', 'json-kernels.wat');
export const KERNELS_BINARY = join(root, 'protocol', 'json-kernels.wasm');

/** Whether the binary is missing or older than its source. */
export function kernelsStale() {
  try {
    return statSync(KERNELS_BINARY).mtimeMs < statSync(KERNELS_SOURCE).mtimeMs;
  } catch {
    return true;
  }
}

/** The module's bytes, from the .wat text. */
export async function compileKernels(text = readFileSync(KERNELS_SOURCE, 'utf8')) {
  const { default: initWabt } = await import('wabt');
  const wabt = await initWabt();
  const module = wabt.parseWat('json-kernels.wat', text, { simd: true, multi_value: true });
  try {
    module.validate();
    return Buffer.from(module.toBinary({ log: false, write_debug_names: false }).buffer);
  } finally {
    module.destroy();
  }
}

export async function buildKernels() {
  const bytes = await compileKernels();
  const tmp = `${KERNELS_BINARY}.${process.pid}.tmp`;
  writeFileSync(tmp, bytes);
  renameSync(tmp, KERNELS_BINARY);
  return bytes.length;
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const size = await buildKernels();
  process.stderr.write(`build-kernels: ${KERNELS_BINARY} (${size} bytes)\n`);
}

// Reads the binaries resolved by scripts/bootstrap.mjs, so tests and scripts share one answer.
import { readFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

export const projectRoot = resolve(dirname(fileURLToPath(import.meta.url)), '..');
export const temporalJsonPath = join(projectRoot, '.tools', 'temporal.json');

/** @returns {import('./temporal-paths.d.mts').TemporalPaths} */
export function readTemporalPaths() {
  let text;
  try {
    text = readFileSync(temporalJsonPath, 'utf8');
  } catch {
    throw new Error(`${temporalJsonPath} is missing: run \`npm run bootstrap\` first (npm test and npm run demo do it for you)`);
  }
  const paths = JSON.parse(text);
  if (!paths.cli?.path || !paths.testServer?.path) {
    throw new Error(`${temporalJsonPath} is incomplete: run \`npm run bootstrap\` again`);
  }
  return paths;
}

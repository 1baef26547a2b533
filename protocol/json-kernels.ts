// The WebAssembly kernels of the records hot paths (source and contract: json-kernels.wat, built
// into json-kernels.wasm by scripts/build-kernels.mjs, which the bootstrap runs). Two loops V8
// has no fast native for: JSON.stringify escapes text with any non-ASCII at a fraction of
// memory speed, and so does its UTF-8 decoder; docs/performance.md (storage) has the
// before/after figures. Without the built file (or WebAssembly SIMD) the JS paths give the same
// bytes, slower.
import { readFileSync } from 'node:fs';

/** The kernels' own tables sit below this offset of their memory. */
export const KERNEL_RESERVED_BYTES = 1024;
export const WASM_PAGE_BYTES = 65536;

// Typed locally: the project's lib (ES2023, no DOM) does not declare the WebAssembly JS API.
interface WasmMemory {
  readonly buffer: ArrayBuffer;
  grow(pages: number): number;
}
interface WasmApi {
  Module: new (bytes: Uint8Array) => object;
  Instance: new (module: object, imports: object) => { exports: Record<string, unknown> };
  Memory: new (descriptor: { initial: number }) => WasmMemory;
}
const wasmApi = (globalThis as unknown as { WebAssembly?: WasmApi }).WebAssembly;

export interface JsonKernels {
  memory: WasmMemory;
  /** UTF-16 units at `src` → the UTF-8 body of their JSON string literal at `dst`; returns its end. */
  escape(src: number, units: number, dst: number): number;
  /** UTF-8 JSON text at `src` → the same JSON in ASCII (\uXXXX) at `dst`; its end, or -1 past `limit`. */
  asciify(src: number, len: number, dst: number, limit: number): number;
}

let compiled: object | null | undefined;

function kernelModule(): object | null {
  if (compiled === undefined) {
    try {
      compiled = wasmApi ? new wasmApi.Module(readFileSync(new URL('./json-kernels.wasm', import.meta.url))) : null;
    } catch {
      compiled = null; // not built (no bootstrap) or no WebAssembly SIMD: the JS paths do everything
    }
  }
  return compiled;
}

/** A kernel instance over a fresh memory of at least `bytes`; undefined where the kernels are unavailable. */
export function instantiateJsonKernels(bytes: number): JsonKernels | undefined {
  const module = kernelModule();
  if (!module || !wasmApi) return undefined;
  const memory = new wasmApi.Memory({ initial: Math.ceil(bytes / WASM_PAGE_BYTES) });
  const exports = new wasmApi.Instance(module, { k: { memory } }).exports as unknown as Omit<JsonKernels, 'memory'>;
  return { memory, escape: exports.escape, asciify: exports.asciify };
}

/** Whether the kernels run here (otherwise the same bytes come from the JS paths). */
export function jsonKernelsAvailable(): boolean {
  return kernelModule() !== null;
}

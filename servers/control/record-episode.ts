// How a records line names its episode (control-plane.md §9.4, §2.3): shared by the storage
// reader and its worker thread.
export { decodeEpisodeId } from '../../protocol/episode-id.js';

export function isPlainObject(v: unknown): v is Record<string, unknown> {
  if (typeof v !== 'object' || v === null || Array.isArray(v)) return false;
  const proto: unknown = Object.getPrototypeOf(v);
  return proto === Object.prototype || proto === null;
}

// Hop-by-hop headers (RFC 9110 §7.6.1, and RFC 2616's proxy-authentication pair) belong to one
// connection: a server that passes a request or a reply on to another connection drops them.
const HOP_BY_HOP = new Set([
  'connection',
  'keep-alive',
  'proxy-connection',
  'transfer-encoding',
  'te',
  'trailer',
  'upgrade',
  'proxy-authenticate',
  'proxy-authorization',
]);

/** Whether a header (any case) belongs to its connection only. */
export function isHopByHop(name: string): boolean {
  return HOP_BY_HOP.has(name.toLowerCase());
}

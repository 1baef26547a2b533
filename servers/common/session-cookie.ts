// Signed cookie sessions (`session=<base64url JSON>.<HMAC>`). The key comes from the deployment,
// so a handle restored into a fresh process still carries a cookie that process accepts.
import { createHmac, timingSafeEqual } from 'node:crypto';

export const SESSION_COOKIE = 'session';

export function signSession(secret: string, data: Record<string, unknown>): string {
  const body = Buffer.from(JSON.stringify(data), 'utf8').toString('base64url');
  const mac = createHmac('sha256', secret).update(body).digest('base64url');
  return `${body}.${mac}`;
}

/** The session data of a valid signed value; undefined for a missing, forged or malformed one. */
export function verifySession(secret: string, value: string | undefined): Record<string, unknown> | undefined {
  if (!value) return undefined;
  const dot = value.lastIndexOf('.');
  if (dot <= 0) return undefined;
  const body = value.slice(0, dot);
  const want = Buffer.from(createHmac('sha256', secret).update(body).digest('base64url'));
  const got = Buffer.from(value.slice(dot + 1));
  if (got.length !== want.length || !timingSafeEqual(got, want)) return undefined;
  try {
    const data: unknown = JSON.parse(Buffer.from(body, 'base64url').toString('utf8'));
    return data && typeof data === 'object' && !Array.isArray(data) ? (data as Record<string, unknown>) : undefined;
  } catch {
    return undefined;
  }
}

/** Parses a `Cookie` request header into name → value. */
export function parseCookieHeader(header: string | undefined): Record<string, string> {
  const out: Record<string, string> = {};
  if (!header) return out;
  for (const part of header.split(';')) {
    const eq = part.indexOf('=');
    if (eq <= 0) continue;
    const name = part.slice(0, eq).trim();
    const value = part.slice(eq + 1).trim();
    if (name) out[name] = decodeURIComponent(value);
  }
  return out;
}

/** Renders cookies (name → value) as a `Cookie` request header. */
export function cookieHeader(cookies: Record<string, string> | null | undefined): string | undefined {
  if (!cookies) return undefined;
  const parts = Object.entries(cookies).map(([k, v]) => `${k}=${encodeURIComponent(v)}`);
  return parts.length ? parts.join('; ') : undefined;
}

/** The cookies a reply sets (`Set-Cookie` values → name → value). */
export function parseSetCookies(setCookie: string | string[] | undefined): Record<string, string> {
  const out: Record<string, string> = {};
  for (const line of Array.isArray(setCookie) ? setCookie : setCookie ? [setCookie] : []) {
    const first = line.split(';')[0]!;
    const eq = first.indexOf('=');
    if (eq > 0) out[first.slice(0, eq).trim()] = decodeURIComponent(first.slice(eq + 1).trim());
  }
  return out;
}

export function setCookieValue(name: string, value: string): string {
  return `${name}=${encodeURIComponent(value)}; Path=/; HttpOnly; SameSite=Lax`;
}

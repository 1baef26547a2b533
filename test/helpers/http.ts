// One JSON-over-HTTP call for the test harnesses (each passes its own connection pool).
import { type Dispatcher, request } from 'undici';

export interface HttpReply {
  status: number;
  body: any;
}

/** Sends `body` as JSON (when given); the reply body is parsed JSON, or its text when it is not JSON. */
export async function httpJson(
  dispatcher: Dispatcher,
  method: 'GET' | 'POST',
  url: string,
  body?: unknown,
  headers: Record<string, string> = {},
): Promise<HttpReply> {
  let res: Dispatcher.ResponseData;
  try {
    res = await request(url, {
      method,
      headers: body === undefined ? headers : { 'content-type': 'application/json', ...headers },
      body: body === undefined ? undefined : JSON.stringify(body),
      dispatcher,
    });
  } catch (err) {
    throw new Error(`${method} ${url}: ${(err as Error).message}`, { cause: err });
  }
  const text = await res.body.text();
  let parsed: unknown = text;
  try {
    parsed = text ? JSON.parse(text) : undefined;
  } catch {
    /* not JSON: the text */
  }
  return { status: res.statusCode, body: parsed };
}

import { describe, expect, it } from 'vitest';
import { ResponseStartDetector } from '../../servers/model/response-start.js';

const b = (s: string): Uint8Array => Buffer.from(s);

describe('ResponseStartDetector', () => {
  it('a JSON body starts at its first non-empty chunk', () => {
    const d = new ResponseStartDetector(false);
    expect(d.push(b(''))).toBe(false);
    expect(d.push(b('{'))).toBe(true);
    expect(d.hasStarted).toBe(true);
  });

  it('SSE comments and blank lines do not start a response; a data line does', () => {
    const d = new ResponseStartDetector(true);
    expect(d.push(b(': keep-alive\n\n'))).toBe(false);
    expect(d.push(b('\r\n'))).toBe(false);
    expect(d.push(b(':ping\n'))).toBe(false);
    expect(d.push(b('data: {}\n\n'))).toBe(true);
    expect(d.push(b(': later comment\n'))).toBe(true);
  });

  it('keeps its place across chunks that split a line', () => {
    const d = new ResponseStartDetector(true);
    expect(d.push(b(': keep'))).toBe(false);
    expect(d.push(b('alive, still a comment'))).toBe(false);
    expect(d.push(b('\n'))).toBe(false);
    expect(d.push(b('d'))).toBe(true);
  });
});

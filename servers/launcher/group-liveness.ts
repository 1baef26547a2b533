// Whether a server's process group still has a live member. The launcher's children outlive the
// CLI that started them, so later commands only have the recorded group ID. Zombies do not count:
// in containers whose init does not reap orphans, a SIGKILLed server stays a zombie forever.
// On Linux the members are read from /proc (which also guards against a recycled group ID);
// elsewhere `kill(-pgid, 0)` is the best we can do.
import { readdirSync, readFileSync } from 'node:fs';
import { setTimeout as delay } from 'node:timers/promises';

const HAS_PROC = (() => {
  try {
    readFileSync('/proc/self/stat');
    return true;
  } catch {
    return false;
  }
})();

interface Member {
  pid: number;
  cmdline: string[];
}

/** Live (non-zombie) members of a process group; undefined when /proc is not available. */
function membersOf(pgid: number): Member[] | undefined {
  if (!HAS_PROC) return undefined;
  const out: Member[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    let stat: string;
    try {
      stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
    } catch {
      continue; // exited while we looked
    }
    // `pid (comm) state ppid pgrp ...`; comm may hold spaces and parentheses.
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    if (Number(fields[2]) !== pgid || fields[0] === 'Z' || fields[0] === 'X') continue;
    let cmdline: string[] = [];
    try {
      cmdline = readFileSync(`/proc/${entry}/cmdline`, 'utf8').split('\0');
    } catch {
      /* gone */
    }
    out.push({ pid: Number(entry), cmdline });
  }
  return out;
}

function anyInGroup(pgid: number): boolean {
  try {
    process.kill(-pgid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/**
 * True while the group has a live member. When its leader is alive it must be the named Gym
 * server (`--name <name>` on its command line), so a group ID recycled by an unrelated program is
 * never taken for ours; a group whose leader died keeps its ID reserved, so its members are ours.
 */
export function groupAlive(pgid: number | null | undefined, name: string): boolean {
  if (!pgid || pgid <= 1) return false;
  if (!anyInGroup(pgid)) return false;
  const members = membersOf(pgid);
  if (!members) return true;
  if (members.length === 0) return false;
  const leader = members.find((m) => m.pid === pgid);
  // An exiting process has an empty command line before it becomes a zombie: still alive.
  if (!leader || leader.cmdline.join('') === '') return true;
  return leader.cmdline.some((arg, i) => arg === '--name' && leader.cmdline[i + 1] === name);
}

/** Signals the group if it is still the named server's; false when there was nothing to signal. */
export function signalGroup(pgid: number | null | undefined, name: string, sig: NodeJS.Signals): boolean {
  if (!groupAlive(pgid, name)) return false;
  try {
    process.kill(-pgid!, sig);
    return true;
  } catch {
    return false;
  }
}

/** Waits until no live member is left; false on timeout. */
export async function waitGroupGone(pgid: number | null | undefined, name: string, timeoutMs: number): Promise<boolean> {
  const deadline = Date.now() + timeoutMs;
  while (groupAlive(pgid, name)) {
    if (Date.now() >= deadline) return false;
    await delay(25);
  }
  return true;
}

/** SIGTERM, up to `graceMs` to exit, then SIGKILL and wait for the group to be gone. */
export async function stopGroup(pgid: number | null | undefined, name: string, graceMs: number): Promise<void> {
  if (!signalGroup(pgid, name, 'SIGTERM')) return;
  if (await waitGroupGone(pgid, name, graceMs)) return;
  await killGroup(pgid, name);
}

/** SIGKILL and wait until the group is gone (its sockets are closed then). */
export async function killGroup(pgid: number | null | undefined, name: string): Promise<void> {
  signalGroup(pgid, name, 'SIGKILL');
  if (!(await waitGroupGone(pgid, name, 10_000))) throw new Error(`process group ${pgid} (${name}) survived SIGKILL`);
}

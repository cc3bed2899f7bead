// Starts a real `attnres serve` on a free loopback port (--port 0: the server prints the port
// it bound) and waits for /health to say ready. Used by the openai-client tests.
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export const sourceDir = process.env.ATTNRES_SOURCE_DIR ?? path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');
export const cli = process.env.ATTNRES_CLI ?? path.join(sourceDir, 'build/release/attnres');
export const kjv = path.join(sourceDir, 'models/kjv');

export async function startServer(args = [], { env = {}, timeoutMs = 60000, model = kjv } = {}) {
  const proc = spawn(cli, ['serve', '--model', model, '--port', '0', '--quiet', ...args], {
    env: { ...process.env, ...env },
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  let log = '';
  const port = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`serve did not listen in time:\n${log}`)), timeoutMs);
    proc.stderr.on('data', (d) => {
      log += d.toString();
      const m = log.match(/listening on http:\/\/[^:]+:(\d+)/);
      if (m) {
        clearTimeout(timer);
        resolve(Number(m[1]));
      }
    });
    proc.on('exit', (code) => reject(new Error(`serve exited with ${code}:\n${log}`)));
  });
  const base = `http://127.0.0.1:${port}`;
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    const r = await fetch(`${base}/health`).catch(() => null);
    if (r && r.status === 200) break;
    await new Promise((res) => setTimeout(res, 50));
  }
  const stop = async () => {
    if (proc.exitCode !== null) return proc.exitCode;
    const exited = new Promise((res) => proc.on('exit', (code, sig) => res(code ?? sig)));
    proc.kill('SIGTERM');
    const t = setTimeout(() => proc.kill('SIGKILL'), 20000);
    const code = await exited;
    clearTimeout(t);
    return code;
  };
  return { port, base, baseURL: `${base}/v1`, proc, stop, log: () => log };
}

// A metric's value from /metrics (the first sample of that name).
export async function metric(base, name, headers = {}) {
  const text = await (await fetch(`${base}/metrics`, { headers })).text();
  for (const line of text.split('\n')) {
    if (line.startsWith(name + ' ')) return Number(line.slice(name.length + 1));
  }
  throw new Error(`no metric ${name}`);
}

export async function eventually(pred, ms = 20000) {
  const deadline = Date.now() + ms;
  while (Date.now() < deadline) {
    if (await pred()) return true;
    await new Promise((res) => setTimeout(res, 20));
  }
  return pred();
}

// VmRSS of a process in KiB (Linux).
export function rssKiB(pid) {
  const s = fs.readFileSync(`/proc/${pid}/status`, 'utf8');
  return Number(s.match(/VmRSS:\s+(\d+)/)[1]);
}

// A synthetic model (random weights, byte-level tokenizer with the Kimi control tokens, 1M
// positions) for tests that need a longer context than kjv's 256 positions.
export function makeTinyModel() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'attnres-tiny-'));
  const r = spawnSync(cli, ['make-model', '--preset', 'tiny', '--out', dir], { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`make-model failed: ${r.stderr}`);
  return dir;
}

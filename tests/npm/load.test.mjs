// Load and faults, bounded: 16 concurrent openai clients send 200 requests with random prompts,
// seeds, lengths, routes, stream or not, and 20% of them are aborted at a random point. Then:
// none lost (each either completed or was aborted by us), none answered with another's text
// (every completed response equals the same request run alone afterwards: the engine is batch
// invariant, so this is exact), /health answered within 100 ms throughout, the server's
// resident memory at the end within 10% of what it was after the first 20 requests, and the
// server's books balance (nothing running or queued, no stream open, every cancellation
// within one step). The request mix is drawn from a fixed seed, so a failure reproduces.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Worker } from 'node:worker_threads';
import OpenAI from 'openai';
import { eventually, metric, rssKiB, startServer } from './lib/server.mjs';

const CLIENTS = 16;
const REQUESTS = Number(process.env.ATTNRES_LOAD_REQUESTS ?? 200);
const ABORT_SHARE = 0.2;

// xorshift32: the request mix.
function rng(seed) {
  let x = seed >>> 0 || 1;
  return () => {
    x ^= x << 13;
    x >>>= 0;
    x ^= x >>> 17;
    x ^= x << 5;
    x >>>= 0;
    return x / 4294967296;
  };
}

const WORDS = ('and the LORD said unto Moses God created heaven earth light darkness waters day night '
  + 'Israel king David Jerusalem people land children house father son shepherd behold spake saying '
  + 'thou shalt not he she they went came upon before after city temple sea fire').split(' ');

function makeRequests(n, seed) {
  const r = rng(seed);
  const pick = (a) => a[Math.floor(r() * a.length)];
  const out = [];
  for (let i = 0; i < n; i++) {
    const words = [];
    const len = 2 + Math.floor(r() * 20);
    for (let k = 0; k < len; k++) words.push(pick(WORDS));
    const chat = r() < 0.6;
    const temperature = pick([0, 0.7, 1.0]);
    const params = {
      model: 'kjv',
      max_tokens: 2 + Math.floor(r() * 15),
      temperature,
      seed: Math.floor(r() * 1e9),
    };
    if (temperature > 0) params.top_p = pick([1, 0.9]);
    if (chat) {
      params.messages = [{ role: 'user', content: words.join(' ') }];
      params.chat_template_kwargs = { thinking: r() < 0.5, thinking_effort: null };
    } else {
      params.prompt = words.join(' ');
    }
    const stream = r() < 0.5;
    const abort = r() < ABORT_SHARE;
    out.push({ i, chat, stream, params, abort, abortAfterChunks: 1 + Math.floor(r() * 4), abortAfterMs: Math.floor(r() * 80) });
  }
  return out;
}

// Sends one request; returns {completed, content, reasoning, text, finish, completion_tokens}.
async function run(client, req, { allowAbort = true } = {}) {
  const controller = new AbortController();
  const api = req.chat ? client.chat.completions : client.completions;
  const abort = allowAbort && req.abort;
  let timer = null;
  if (abort && !req.stream) timer = setTimeout(() => controller.abort(), req.abortAfterMs);
  const result = { completed: false, content: '', reasoning: '', text: '', finish: null, completion_tokens: null };
  try {
    if (!req.stream) {
      const r = await api.create(req.params, { signal: controller.signal });
      const c = r.choices[0];
      if (req.chat) {
        result.content = c.message.content ?? '';
        result.reasoning = c.message.reasoning_content ?? '';
      } else {
        result.text = c.text;
      }
      result.finish = c.finish_reason;
      result.completion_tokens = r.usage.completion_tokens;
      result.completed = true;
      return result;
    }
    const s = await api.create({ ...req.params, stream: true, stream_options: { include_usage: true } },
      { signal: controller.signal });
    let chunks = 0;
    for await (const chunk of s) {
      if (chunk.usage) result.completion_tokens = chunk.usage.completion_tokens;
      const c = chunk.choices[0];
      if (!c) continue;
      if (req.chat) {
        result.content += c.delta.content ?? '';
        result.reasoning += c.delta.reasoning_content ?? '';
      } else {
        result.text += c.text ?? '';
      }
      if (c.finish_reason) result.finish = c.finish_reason;
      if (abort && ++chunks >= req.abortAfterChunks) {
        controller.abort();
        return result;
      }
    }
    result.completed = result.finish !== null && result.completion_tokens !== null;
    return result;
  } catch (e) {
    if (abort && (e instanceof OpenAI.APIUserAbortError || e.name === 'AbortError')) return result;
    throw e;
  } finally {
    if (timer) clearTimeout(timer);
  }
}

test('16 clients, 200 requests, 20% aborted: none lost, each equal to its run alone', { timeout: 1_100_000 }, async () => {
  const srv = await startServer(['--parallel', '8', '--queue', '64', '--prefix-cache-mb', '0', '--threads', '1']);
  try {
    const client = new OpenAI({ baseURL: srv.baseURL, apiKey: 'unused', maxRetries: 0, timeout: 600_000 });
    const requests = makeRequests(REQUESTS, 20261201);
    await client.completions.create({ model: 'kjv', prompt: 'warm up', max_tokens: 2 });
    const results = new Array(requests.length);

    // /health throughout, from a worker thread: its own event loop, so the load generator's
    // work in this one does not count against the server.
    const monitor = new Worker(`
      const { parentPort, workerData } = require('node:worker_threads');
      let stop = false, max = 0, worst = '', checks = 0;
      parentPort.on('message', () => { stop = true; });
      (async () => {
        await (await fetch(workerData + '/health')).text();  // fetch's first use loads undici
        parentPort.postMessage('ready');
        const t00 = performance.now();
        while (!stop) {
          const t0 = performance.now();
          const r = await fetch(workerData + '/health');
          await r.text();
          const dt = performance.now() - t0;
          if (r.status !== 200) worst = 'status ' + r.status;
          if (dt > max) { max = dt; worst = dt.toFixed(1) + ' ms at ' + ((t0 - t00) / 1000).toFixed(2) + ' s'; }
          checks++;
          await new Promise((res) => setTimeout(res, 25));
        }
        parentPort.postMessage({ max, worst, checks });
      })();
    `, { eval: true, workerData: srv.base });
    await new Promise((res) => monitor.once('message', res));  // ready
    const health = new Promise((res) => monitor.once('message', res));

    let next = 0;
    let done = 0;
    let rssEarly = null;
    const worker = async () => {
      while (next < requests.length) {
        const req = requests[next++];
        results[req.i] = await run(client, req);
        if (++done === 20) rssEarly = rssKiB(srv.proc.pid);
      }
    };
    const t0 = performance.now();
    await Promise.all(Array.from({ length: CLIENTS }, worker));
    const loadSeconds = (performance.now() - t0) / 1000;
    monitor.postMessage('stop');
    const { max: healthMax, worst: healthWorst, checks: healthChecks } = await health;
    await monitor.terminate();

    // Nothing lost: every request completed, or was one we aborted.
    const completed = requests.filter((q) => results[q.i].completed);
    const aborted = requests.filter((q) => q.abort && !results[q.i].completed);
    for (const q of requests) assert.ok(results[q.i].completed || q.abort, `request ${q.i} neither completed nor aborted`);
    assert.ok(aborted.length >= REQUESTS * 0.1, `only ${aborted.length} aborted`);
    // The server's books once every aborted stream's cancel went through.
    assert.ok(await eventually(async () => (await metric(srv.base, 'attnres_requests_running')) === 0
      && (await metric(srv.base, 'attnres_requests_waiting')) === 0
      && (await metric(srv.base, 'attnres_streams_active')) === 0, 30000), 'requests left in the server');
    assert.ok(await metric(srv.base, 'attnres_cancel_max_steps_after') <= 1);
    assert.equal(await metric(srv.base, 'attnres_requests_failed_total'), 0);
    const rssEnd = rssKiB(srv.proc.pid);

    // Each completed response equals the same request run alone (non-streaming, one at a time).
    for (const q of completed) {
      const alone = await run(client, { ...q, stream: false }, { allowAbort: false });
      const got = results[q.i];
      const what = `request ${q.i} ${JSON.stringify(q.params)} (stream ${q.stream})`;
      assert.equal(got.content, alone.content, what);
      assert.equal(got.reasoning, alone.reasoning, what);
      assert.equal(got.text, alone.text, what);
      assert.equal(got.finish, alone.finish, what);
      assert.equal(got.completion_tokens, alone.completion_tokens, what);
    }
    console.log(`# load: ${requests.length} requests (${completed.length} completed, ${aborted.length} aborted) by ${CLIENTS} clients in ${loadSeconds.toFixed(1)} s; `
      + `/health max ${healthMax.toFixed(1)} ms over ${healthChecks} checks; RSS ${rssEarly} KiB after 20, ${rssEnd} KiB at the end`);
    assert.ok(healthChecks > 10);
    assert.ok(healthMax < 100, `/health took ${healthWorst}`);
    assert.ok(rssEnd <= rssEarly * 1.1, `RSS grew from ${rssEarly} to ${rssEnd} KiB`);
  } finally {
    assert.equal(await srv.stop(), 0);
  }
});

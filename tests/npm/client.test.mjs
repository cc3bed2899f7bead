// `attnres serve` driven by the official openai client (the pinned version in package-lock.json)
// over models/kjv, a small trained model: what real clients see on the wire.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import OpenAI from 'openai';
import { eventually, makeTinyModel, metric, startServer } from './lib/server.mjs';

let srv;
let client;
before(async () => {
  srv = await startServer(['--parallel', '4', '--test-forced-output']);
  client = new OpenAI({ baseURL: srv.baseURL, apiKey: 'unused', maxRetries: 0 });
});
after(async () => {
  assert.equal(await srv.stop(), 0, 'serve exits 0 on SIGTERM');
});

const user = (content) => [{ role: 'user', content }];
const noThinking = { chat_template_kwargs: { thinking: false } };

async function streamed(params) {
  const stream = await client.chat.completions.create({ ...params, stream: true });
  let content = '';
  let reasoning = '';
  let finish = null;
  let chunks = 0;
  for await (const chunk of stream) {
    chunks++;
    const c = chunk.choices[0];
    if (!c) continue;
    content += c.delta.content ?? '';
    reasoning += c.delta.reasoning_content ?? '';
    if (c.finish_reason) finish = c.finish_reason;
  }
  return { content, reasoning, finish, chunks };
}

describe('openai client', () => {
  test('lists the model', async () => {
    const models = await client.models.list();
    const ids = [];
    for await (const m of models) ids.push(m.id);
    assert.deepEqual(ids, ['kjv']);
  });

  test('chat non-stream and stream give the same text (greedy and seeded)', async () => {
    for (const sampling of [{ temperature: 0 }, { temperature: 1, top_p: 0.95, seed: 42 }]) {
      const params = { model: 'kjv', messages: user('And God said'), max_tokens: 24, ...noThinking, ...sampling };
      const a = await client.chat.completions.create(params);
      assert.equal(a.object, 'chat.completion');
      assert.ok(a.choices[0].message.content.length > 0);
      assert.equal(a.usage.completion_tokens, 24);
      assert.equal(typeof a.usage.prompt_tokens_details.cached_tokens, 'number');
      const b = await streamed(params);
      assert.equal(b.content, a.choices[0].message.content);
      assert.equal(b.finish, a.choices[0].finish_reason);
    }
  });

  test('completions with a string and with token ids', async () => {
    const text = 'In the beginning God created';
    const a = await client.completions.create({ model: 'kjv', prompt: text, max_tokens: 16, temperature: 0 });
    assert.equal(a.object, 'text_completion');
    assert.equal(a.choices[0].finish_reason, 'length');
    const ids = (await (await fetch(`${srv.base}/tokenize`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ content: text }),
    })).json()).tokens;
    const b = await client.completions.create({ model: 'kjv', prompt: ids, max_tokens: 16, temperature: 0 });
    assert.equal(b.choices[0].text, a.choices[0].text);
    const stream = await client.completions.create({ model: 'kjv', prompt: text, max_tokens: 16, temperature: 0, stream: true });
    let s = '';
    for await (const chunk of stream) s += chunk.choices[0]?.text ?? '';
    assert.equal(s, a.choices[0].text);
  });

  test('reasoning split: thinking on puts the trained model\'s marker-free text in reasoning', async () => {
    const params = { model: 'kjv', messages: user('Who begat Enos?'), max_tokens: 10, temperature: 0 };
    const a = await client.chat.completions.create(params);
    const m = a.choices[0].message;
    assert.equal(m.content, null);
    assert.ok(m.reasoning_content.length > 0);
    assert.equal(a.choices[0].finish_reason, 'length');
    const b = await streamed(params);
    assert.equal(b.reasoning, m.reasoning_content);
    assert.equal(b.content, '');
  });

  test('reasoning then content then a tool call, split by the parser (forced output)', async () => {
    const forced = '<|open|>think<|sep|>Hm.<|close|>think<|sep|><|open|>response<|sep|>Ok.<|close|>response<|sep|>'
      + '<|open|>tools<|sep|><|open|>call tool="lookup"<|sep|><|open|>argument key="q" type="string"<|sep|>a & "b"'
      + '<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|><|end_of_msg|>';
    const params = {
      model: 'kjv', messages: user('Look it up'), max_tokens: 150, temperature: 0,
      chat_template_kwargs: { thinking: true, thinking_effort: null }, attnres_forced_output: forced,
    };
    const a = await client.chat.completions.create(params);
    const m = a.choices[0].message;
    assert.equal(m.reasoning_content, 'Hm.');
    assert.equal(m.content, 'Ok.');
    assert.equal(a.choices[0].finish_reason, 'tool_calls');
    assert.equal(m.tool_calls.length, 1);
    assert.equal(m.tool_calls[0].function.name, 'lookup');
    assert.deepEqual(JSON.parse(m.tool_calls[0].function.arguments), { q: 'a & "b"' });
    // The SDK's stream helper rebuilds the message from the deltas (a strict check of their shape).
    const runner = client.chat.completions.stream(params);
    const final = await runner.finalChatCompletion();
    const fm = final.choices[0].message;
    assert.equal(fm.content, 'Ok.');
    // (The SDK's helper keeps only the last delta of fields it does not know, such as
    // reasoning_content, so reasoning is compared through a plain stream.)
    assert.equal((await streamed(params)).reasoning, 'Hm.');
    assert.equal(final.choices[0].finish_reason, 'tool_calls');
    assert.equal(fm.tool_calls.length, 1);
    assert.match(fm.tool_calls[0].id, /^call_/);  // ids are unique per response
    assert.notEqual(fm.tool_calls[0].id, m.tool_calls[0].id);
    assert.equal(fm.tool_calls[0].type, 'function');
    assert.deepEqual(fm.tool_calls[0].function, m.tool_calls[0].function);
  });

  test('runTools drives a tool loop: the result goes back with its tool_call_id', async () => {
    // Each round's output is dictated by the request: a tool call first, then an answer.
    let round = 0;
    const seen = [];
    const forcedFetch = async (url, init) => {
      const body = JSON.parse(init.body);
      seen.push(body);
      body.attnres_forced_output = round++ === 0
        ? '<|open|>tools<|sep|><|open|>call tool="add"<|sep|><|open|>argument key="a" type="number"<|sep|>2'
          + '<|close|>argument<|sep|><|open|>argument key="b" type="number"<|sep|>3<|close|>argument<|sep|>'
          + '<|close|>call<|sep|><|close|>tools<|sep|><|end_of_msg|>'
        : 'Five.<|close|>response<|sep|><|end_of_msg|>';
      return fetch(url, { ...init, body: JSON.stringify(body) });
    };
    // A tool declaration and a tool round do not fit kjv's 256 positions: a synthetic model.
    const tiny = await startServer(['--ctx-size', '4096', '--test-forced-output'], { model: makeTinyModel() });
    after(() => tiny.stop());
    const c = new OpenAI({ baseURL: tiny.baseURL, apiKey: 'unused', maxRetries: 0, fetch: forcedFetch });
    const calls = [];
    const runner = c.chat.completions.runTools({
      model: 'kjv', messages: user('2+3?'), max_tokens: 400, temperature: 0, ...noThinking,
      tools: [{
        type: 'function',
        function: {
          name: 'add', parameters: { type: 'object', properties: { a: { type: 'number' }, b: { type: 'number' } } },
          function: (args) => { calls.push(args); return String(args.a + args.b); },
          parse: JSON.parse,
        },
      }],
    });
    const content = await runner.finalContent();
    assert.equal(content, 'Five.');
    assert.deepEqual(calls, [{ a: 2, b: 3 }]);
    assert.equal(seen.length, 2);
    const tool = seen[1].messages.find((msg) => msg.role === 'tool');
    const assistant = seen[1].messages.find((msg) => msg.role === 'assistant');
    assert.equal(tool.tool_call_id, assistant.tool_calls[0].id);
    assert.equal(tool.content, '5');
  });

  test('logprobs of each token', async () => {
    const a = await client.chat.completions.create({
      model: 'kjv', messages: user('The LORD is my shepherd'), max_tokens: 8, temperature: 0,
      logprobs: true, top_logprobs: 2, ...noThinking,
    });
    const lp = a.choices[0].logprobs.content;
    assert.equal(lp.length, a.usage.completion_tokens);
    for (const e of lp) {
      assert.ok(e.logprob <= 0);
      assert.equal(e.top_logprobs.length, 2);
      assert.equal(e.token, e.top_logprobs[0].token);
    }
  });

  test('stop strings end the text and are not returned', async () => {
    const base = { model: 'kjv', messages: user('And God said'), max_tokens: 30, temperature: 0, ...noThinking };
    const full = (await client.chat.completions.create(base)).choices[0].message.content;
    const stop = full.slice(Math.floor(full.length / 2), Math.floor(full.length / 2) + 3);
    const cut = await client.chat.completions.create({ ...base, stop: [stop] });
    assert.equal(cut.choices[0].message.content ?? '', full.slice(0, full.indexOf(stop)));
    assert.equal(cut.choices[0].finish_reason, 'stop');
    const s = await streamed({ ...base, stop });
    assert.equal(s.content, full.slice(0, full.indexOf(stop)));
  });

  test('aborting mid-stream frees the slot', async () => {
    const before = await metric(srv.base, 'attnres_client_aborts_total');
    const controller = new AbortController();
    const stream = await client.chat.completions.create(
      { model: 'kjv', messages: user('And God said'), max_tokens: 200, temperature: 0, ignore_eos: true, stream: true, ...noThinking },
      { signal: controller.signal },
    );
    let n = 0;
    try {
      for await (const chunk of stream) {
        if (chunk.choices[0]?.delta?.content && ++n === 3) {
          controller.abort();
          break;
        }
      }
    } catch (e) {
      assert.ok(e.name === 'AbortError' || e instanceof OpenAI.APIUserAbortError, String(e));
    }
    assert.equal(n, 3);
    assert.ok(await eventually(async () => (await metric(srv.base, 'attnres_client_aborts_total')) === before + 1));
    assert.ok(await eventually(async () => (await metric(srv.base, 'attnres_requests_running')) === 0));
    assert.ok(await metric(srv.base, 'attnres_cancel_max_steps_after') <= 1);
  });

  test('client mistakes surface as the SDK\'s error classes', async () => {
    await assert.rejects(
      client.chat.completions.create({ model: 'kjv', messages: user('x'), temperature: 5 }),
      (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && /temperature/.test(e.message),
    );
    await assert.rejects(
      client.chat.completions.create({ model: 'kjv', messages: [] }),
      (e) => e instanceof OpenAI.BadRequestError && /messages/.test(e.message),
    );
    await assert.rejects(
      client.chat.completions.create({ model: 'kjv', messages: user('x'), max_tokens: 5000 }),
      (e) => e instanceof OpenAI.BadRequestError && e.code === 'context_length_exceeded',
    );
    await assert.rejects(
      client.chat.completions.create({ model: 'kjv', messages: user('x'.repeat(9 << 20)) }),
      (e) => e instanceof OpenAI.APIError && e.status === 413,
    );
  });
});

describe('openai client against a server with limits', () => {
  test('401 without the key, 503 beyond the queue', async () => {
    const s = await startServer(['--api-key', 'sk-secret', '--parallel', '1', '--queue', '0', '--test-step-delay-ms', '20']);
    try {
      const bad = new OpenAI({ baseURL: s.baseURL, apiKey: 'sk-wrong', maxRetries: 0 });
      await assert.rejects(bad.models.list(), (e) => e instanceof OpenAI.AuthenticationError && e.status === 401);
      assert.equal((await fetch(`${s.base}/health`)).status, 200);
      const good = new OpenAI({ baseURL: s.baseURL, apiKey: 'sk-secret', maxRetries: 0 });
      const controller = new AbortController();
      const busy = await good.chat.completions.create(
        { model: 'kjv', messages: user('And God said'), max_tokens: 150, ignore_eos: true, stream: true, ...noThinking },
        { signal: controller.signal },
      );
      const it = busy[Symbol.asyncIterator]();
      await it.next();
      await assert.rejects(
        good.chat.completions.create({ model: 'kjv', messages: user('x'), max_tokens: 2 }),
        (e) => e instanceof OpenAI.InternalServerError && e.status === 503 && e.headers.get('retry-after') === '1',
      );
      controller.abort();
      await it.return?.();
    } finally {
      await s.stop();
    }
  });
});

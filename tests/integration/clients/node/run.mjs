// Real Node clients against an OpenAI-compatible base URL, one scenario per run:
//   BASE_URL=http://127.0.0.1:8000/v1 API_KEY=gw-... node run.mjs SCENARIO
// prints one JSON object: {"result": ..., "wire": [{method, url, status, contentType, sent, body}]}.
// "wire" is every HTTP exchange the client made, bodies as it read them (recorded by a fetch wrapper
// handed to each client), so tests/integration/clients/test_node_clients.py can validate them against the
// official OpenAI schema. Clients: openai-node, and the Vercel AI SDK (ai) with @ai-sdk/openai
// (chat and Responses models) and @ai-sdk/openai-compatible.
import OpenAI from "openai";
import { generateObject, generateText, stepCountIs, streamText, tool } from "ai";
import { createOpenAI } from "@ai-sdk/openai";
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";
import { z } from "zod";

const { BASE_URL, API_KEY } = process.env;
if (!BASE_URL || !API_KEY) throw new Error("BASE_URL and API_KEY must be set");

const wire = [];
const pending = [];

// fetch that records each exchange: the response is cloned so the client reads it as it streams.
async function tapFetch(input, init = {}) {
  const res = await fetch(input, init);
  const entry = {
    method: init.method ?? (input instanceof Request ? input.method : "GET"),
    url: String(input instanceof Request ? input.url : input),
    status: res.status,
    contentType: res.headers.get("content-type"),
    headers: Object.fromEntries(res.headers.entries()),
    sent: typeof init.body === "string" ? init.body : null,
    body: null,
  };
  wire.push(entry);
  pending.push(res.clone().text().then((t) => { entry.body = t; }));
  return res;
}

const weatherTool = tool({
  description: "Current weather in a city",
  inputSchema: z.object({ city: z.string(), unit: z.enum(["c", "f"]) }),
  execute: async ({ city, unit }) => ({ city, unit, temp: 18 }),
});

const openaiNode = () => new OpenAI({ baseURL: BASE_URL, apiKey: API_KEY, maxRetries: 0, fetch: tapFetch });
const aiOpenAI = () => createOpenAI({ baseURL: BASE_URL, apiKey: API_KEY, fetch: tapFetch });
const aiCompatible = () =>
  createOpenAICompatible({ name: "gateway", baseURL: BASE_URL, apiKey: API_KEY, fetch: tapFetch, includeUsage: true });

const stepsOf = (r) =>
  r.steps.map((s) => ({
    finishReason: s.finishReason,
    text: s.text,
    toolCalls: s.toolCalls.map((c) => ({ id: c.toolCallId, name: c.toolName, input: c.input })),
    toolResults: s.toolResults.map((t) => ({ id: t.toolCallId, output: t.output })),
  }));

const scenarios = {
  // openai-node
  async openai_chat() {
    const r = await openaiNode().chat.completions.create({
      model: "gpt-4.1",
      messages: [{ role: "user", content: "hello" }],
      seed: 7,
    });
    return { content: r.choices[0].message.content, model: r.model, usage: r.usage, fingerprint: r.system_fingerprint };
  },
  async openai_tools() {
    const client = openaiNode();
    const tools = [{
      type: "function",
      function: {
        name: "get_weather",
        parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
      },
    }];
    const messages = [{ role: "user", content: "Weather in Paris?" }];
    const first = await client.chat.completions.create({ model: "gpt-4.1", messages, tools });
    const msg = first.choices[0].message;
    const call = msg.tool_calls[0];
    messages.push({ role: "assistant", content: null, tool_calls: msg.tool_calls });
    messages.push({ role: "tool", tool_call_id: call.id, content: JSON.stringify({ temp: 18 }) });
    const second = await client.chat.completions.create({ model: "gpt-4.1", messages, tools });
    return {
      finish: first.choices[0].finish_reason,
      call: { id: call.id, name: call.function.name, arguments: JSON.parse(call.function.arguments) },
      final: second.choices[0].message.content,
    };
  },
  async openai_stream() {
    const stream = await openaiNode().chat.completions.create({
      model: "gpt-4.1",
      messages: [{ role: "user", content: "hello" }],
      tools: [{ type: "function", function: { name: "get_weather", parameters: { type: "object" } } }],
      stream: true,
      stream_options: { include_usage: true },
    });
    const calls = {};
    let chunks = 0;
    let usage = null;
    for await (const chunk of stream) {
      chunks += 1;
      if (chunk.usage) usage = chunk.usage;
      for (const d of chunk.choices[0]?.delta?.tool_calls ?? []) {
        calls[d.index] ??= { id: null, name: null, arguments: "" };
        if (d.id) calls[d.index].id = d.id;
        if (d.function?.name) calls[d.index].name = d.function.name;
        calls[d.index].arguments += d.function?.arguments ?? "";
      }
    }
    return { chunks, usage, calls: Object.values(calls).map((c) => ({ ...c, arguments: JSON.parse(c.arguments) })) };
  },

  // Vercel AI SDK over @ai-sdk/openai's chat-completions model
  async ai_generate_text_tools() {
    const r = await generateText({
      model: aiOpenAI().chat("gpt-4.1"),
      tools: { get_weather: weatherTool },
      stopWhen: stepCountIs(3),
      prompt: "Weather in Paris?",
    });
    return { text: r.text, steps: stepsOf(r), usage: r.totalUsage };
  },
  async ai_stream_text_tools() {
    const r = streamText({
      model: aiOpenAI().chat("gpt-4.1"),
      tools: { get_weather: weatherTool },
      stopWhen: stepCountIs(3),
      prompt: "Weather in Oslo?",
    });
    const deltas = [];
    for await (const part of r.fullStream) {
      if (part.type === "text-delta") deltas.push(part.text);
      if (part.type === "error") throw part.error;
    }
    return { text: await r.text, deltas, steps: stepsOf({ steps: await r.steps }) };
  },
  async ai_generate_object() {
    const r = await generateObject({
      model: aiOpenAI().chat("gpt-4.1"),
      schema: z.object({ city: z.string(), temp_c: z.number(), conditions: z.array(z.string()) }),
      schemaName: "CityWeather",
      prompt: "Weather in Paris as an object",
    });
    return { object: r.object, finishReason: r.finishReason };
  },
  // The provider's default model is the Responses API: createOpenAI(...)("gpt-4.1") -> POST /responses
  async ai_responses_generate() {
    const r = await generateText({ model: aiOpenAI()("gpt-4.1"), prompt: "Say hello in Spanish" });
    return { text: r.text, finishReason: r.finishReason, usage: r.usage };
  },
  async ai_responses_stream() {
    const r = streamText({ model: aiOpenAI()("gpt-4.1"), prompt: "Say hello in Spanish" });
    const deltas = [];
    for await (const part of r.fullStream) {
      if (part.type === "text-delta") deltas.push(part.text);
      if (part.type === "error") throw part.error;
    }
    return { text: await r.text, deltas, finishReason: await r.finishReason };
  },
  async ai_responses_tools() {
    const r = await generateText({
      model: aiOpenAI()("gpt-4.1"),
      tools: { get_weather: weatherTool },
      stopWhen: stepCountIs(3),
      prompt: "Weather in Kyiv?",
    });
    return { text: r.text, steps: stepsOf(r) };
  },

  // @ai-sdk/openai-compatible (any OpenAI-compatible chat endpoint)
  async compat_generate_text_tools() {
    const r = await generateText({
      model: aiCompatible().chatModel("gpt-4.1"),
      tools: { get_weather: weatherTool },
      stopWhen: stepCountIs(3),
      prompt: "Weather in Rome?",
    });
    return { text: r.text, steps: stepsOf(r) };
  },
  async compat_stream_text() {
    const r = streamText({ model: aiCompatible().chatModel("gpt-4.1"), prompt: "Count to three" });
    const deltas = [];
    for await (const part of r.fullStream) {
      if (part.type === "text-delta") deltas.push(part.text);
      if (part.type === "error") throw part.error;
    }
    return { text: await r.text, deltas, usage: await r.usage };
  },
};

const name = process.argv[2];
if (!scenarios[name]) {
  console.error(`unknown scenario ${name}; one of: ${Object.keys(scenarios).join(", ")}`);
  process.exit(2);
}
let result;
let failure = null;
try {
  result = await scenarios[name]();
} catch (e) {
  failure = { name: e?.name, message: String(e?.message ?? e), status: e?.status ?? e?.statusCode ?? null };
}
await Promise.all(pending);
process.stdout.write(JSON.stringify({ result, failure, wire }) + "\n");

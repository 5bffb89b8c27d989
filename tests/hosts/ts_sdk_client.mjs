// A host built on the MCP TypeScript SDK (the client the MCP Inspector and many hosts use), driving
// the gateway through every tool's success and error paths and letting the SDK validate each
// result against the tool's outputSchema, as it does for real hosts.
//
// The same run serves both SDK majors: 1.x is one package (`@modelcontextprotocol/sdk`, deep
// imports, `callTool(params, resultSchema, options)`); 2.x is split into packages, the client being
// `@modelcontextprotocol/client` (exports `.` and `./stdio`, `callTool(params, options)`).
//
// Inputs (environment): SDK_DIR (an npm prefix holding @modelcontextprotocol/sdk 1.x or
// @modelcontextprotocol/client 2.x), GATEWAY_BIN, GATEWAY_CWD, GATEWAY_ENV (a JSON object: the
// gateway's whole environment).
// Output: one JSON line on stdout, {sdkPackage, sdkVersion, tools, calls: [{name, case, ok,
// isError, text, error}]}. Exit code 0 unless the harness itself broke.
import { join } from "node:path";
import { existsSync, readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";

const modules = join(process.env.SDK_DIR, "node_modules/@modelcontextprotocol");
const v2 = existsSync(join(modules, "client/package.json"));
const pkgDir = join(modules, v2 ? "client" : "sdk");
const load = (file) => import(pathToFileURL(join(pkgDir, file)).href);
const { Client } = await load(v2 ? "dist/index.mjs" : "dist/esm/client/index.js");
const { StdioClientTransport } = await load(v2 ? "dist/stdio.mjs" : "dist/esm/client/stdio.js");
const manifest = JSON.parse(readFileSync(join(pkgDir, "package.json"), "utf8"));
const sdkPackage = manifest.name;
const sdkVersion = manifest.version;
// A task's answer may take a while; both majors take the request timeout in the options.
const callOptions = { timeout: 120000 };
const callTool = v2
  ? (params) => client.callTool(params, callOptions)
  : (params) => client.callTool(params, undefined, callOptions);

const transport = new StdioClientTransport({
  command: process.env.GATEWAY_BIN,
  args: [],
  cwd: process.env.GATEWAY_CWD,
  env: JSON.parse(process.env.GATEWAY_ENV),
  stderr: "ignore",
});
const client = new Client({ name: "ts-sdk-host", version: "1.0.0" });
await client.connect(transport);

const calls = [];
async function call(name, kase, args) {
  try {
    const r = await callTool({ name, arguments: args });
    const text = r.content?.find((c) => c.type === "text")?.text ?? "";
    calls.push({ name, case: kase, ok: true, isError: r.isError === true, text });
    return r;
  } catch (e) {
    calls.push({ name, case: kase, ok: false, error: String(e) });
    return null;
  }
}

const tools = (await client.listTools()).tools.map((t) => t.name);

// Success paths, in the order a host delegates.
const server = await call("opencode_start_server", "success", {});
const serverId = server?.structuredContent?.server_id;
await call("opencode_list_agents", "success", { server_id: serverId });
const started = await call("opencode_start_task", "success", {
  server_id: serverId,
  prompt: "hello from the TypeScript SDK",
});
const taskId = started?.structuredContent?.task_id;
await call("opencode_wait_for_task", "success", { task_ids: [taskId], timeout_ms: 60000 });
await call("opencode_get_task_status", "success", { task_id: taskId, include_progress: true });
await call("opencode_get_task_result", "success", { task_id: taskId });
await call("opencode_continue_task", "success", { task_id: taskId, prompt: "once more" });
await call("opencode_cancel_task", "success", { task_id: taskId });
await call("opencode_list_tasks", "success", {});
await call("opencode_usage", "success", {});

// Error paths: every tool, with arguments of the right shape naming nothing that exists.
const missing = {
  opencode_start_server: { directory: "/nonexistent/opencode-mcp-ts-sdk" },
  opencode_stop_server: { server_id: "srv_nope" },
  opencode_list_agents: { server_id: "srv_nope" },
  opencode_start_task: { server_id: "srv_nope", prompt: "x" },
  opencode_continue_task: { task_id: "tsk_nope", prompt: "x" },
  opencode_cancel_task: { task_id: "tsk_nope" },
  opencode_get_task_status: { task_id: "tsk_nope" },
  opencode_get_task_result: { task_id: "tsk_nope" },
  opencode_wait_for_task: { task_ids: ["tsk_nope"] },
  opencode_reply_permission: { task_id: "tsk_nope", reply: "once" },
  opencode_list_tasks: { status: "no_such_status" },
  opencode_usage: { since: "not a duration" },
  opencode_apply_task: { task_id: "tsk_nope" },
  opencode_discard_task: { task_id: "tsk_nope" },
};
for (const name of tools) {
  await call(name, "error", missing[name] ?? {});
}
await call("opencode_stop_server", "success", { server_id: serverId });

await client.close();
process.stdout.write(JSON.stringify({ sdkPackage, sdkVersion, tools, calls }) + "\n");

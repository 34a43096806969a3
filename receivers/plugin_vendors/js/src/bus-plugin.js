// aep-collector plugin for @@TITLE@@: forwards plugin moments to the collector's `@@AGENT@@` receiver.
// GENERATED from receivers/plugin_vendors/js/src/ by `python -m aep_collector.receivers.plugin_vendors.js.build`;
// edit the sources there, not this file (a test checks the two agree).
//
// @only opencode
// Install: copy this file into `.opencode/plugins/` (project) or `~/.config/opencode/plugins/`
// (global); `aep-collector hooks opencode` prints the exact command. Plain ESM for Bun: global
// `fetch`, `AbortController`, `TextEncoder`, `setTimeout`; no Node built-ins, no imports.
//
// Vendor API (facts, cited): the plugin function receives PluginInput and returns Hooks
// (`@opencode-ai/plugin` packages/plugin/src/index.ts: `event({event})`,
// `"tool.execute.before"(input, output)`, `"tool.execute.after"(input, output)`,
// `"permission.ask"(input: Permission, output: {status: "ask" | "deny" | "allow"})`). The module
// default-exports `{ id, server }`, the shape OpenCode's path-plugin loader reads
// (packages/opencode/src/plugin/shared.ts `readV1Plugin`) and that the older loader, which walks
// every export for a function or an object with `.server`, accepts too.
//
// Contract (receivers/plugin_vendors/README.md): every moment is POSTed as the mapping's moment
// shape ({kind: "bus", event} | {kind: "tool.before" | "tool.after", input, output} |
// {kind: "permission.ask", permission}), several together as {batch: [...]}, each POST with the
// headers `X-AEP-Server-Url` and `X-AEP-Directory` (percent-encoded): OpenCode 1.18 asks on the
// bus, and the collector answers those over this server's own routes. `permission.ask` reads the
// reply: it sets `output.status` to "allow" or "deny" when, and only when, the collector answered
// exactly that.
// @end
// @only kilocode
// Install: list this file in the `plugin` array of Kilo's config (`.kilo/kilo.jsonc` in a project,
// `~/.config/kilo/kilo.jsonc` globally), optionally with options:
//   "plugin": [["file:///ABS/PATH/kilocode-plugin.js", { "url": "http://127.0.0.1:@@PORT@@/hook" }]]
// (kilo.ai/docs/automate/extending/plugins); `aep-collector hooks kilocode` prints the entry. Plain
// ESM for Bun: global `fetch`, `AbortController`, `TextEncoder`, `setTimeout`; no Node built-ins.
//
// Vendor API (facts, cited): `@kilocode/plugin` packages/plugin/src/index.ts (Kilo-Org/kilocode):
// `PluginModule = { id?, server: Plugin }`, `Plugin = (input: PluginInput, options?) => Promise<Hooks>`,
// `PluginInput.serverUrl: URL`, `PluginInput.directory`, and the Hooks `event`,
// `"tool.execute.before"`, `"tool.execute.after"`, `"permission.ask"(input, output: {status})`.
// Only those four are registered, all observation except the permission decision; no hook that
// rewrites agent output (chat.*, shell.env, experimental.*) is ever registered.
//
// Contract (receivers/plugin_vendors/README.md): moments are POSTed as the mapping's moment shapes
// ({kind: "bus", event} | {kind: "tool.before" | "tool.after", input, output} |
// {kind: "permission.ask", permission}), several together as {batch: [...]}, each POST with the
// headers `X-AEP-Server-Url` and `X-AEP-Directory` (percent-encoded): Kilo >=7.4.6 asks on the
// bus, and the collector answers those over this server's own routes. The <=7.4.5
// `permission.ask` hook reads the reply and sets `output.status` only to an exact "allow" or "deny".
// @end
// Nothing here ever throws into @@TITLE@@: every handler is wrapped, every request is bounded by
// an AbortController, and a collector that is down costs one refused connection, then nothing for
// `retryMs` (moments in that window are dropped, the agent is never slowed).
//
// Settings (plugin options where the loader passes them, else the environment, else the default):
//   url          @@PREFIX@@URL          http://127.0.0.1:@@PORT@@/hook
//   timeoutMs    @@PREFIX@@TIMEOUT_MS   2000    bound of one observation POST
//   holdMs       @@PREFIX@@HOLD_MS      65000   bound of a held permission.ask (above the
//                                                  collector's attention_timeout, 55 s by default)
//   retryMs      @@PREFIX@@RETRY_MS     2000    pause after a failed delivery
//   maxBodyBytes @@PREFIX@@MAX_BODY     1000000 larger moments are sent slimmed (see `slim`)

const PREFIX = "@@PREFIX@@";
const DEFAULTS = { url: "http://127.0.0.1:@@PORT@@/hook", timeoutMs: 2000, holdMs: 65000, retryMs: 2000,
  maxBodyBytes: 1000000 };
// Bus moments after which the host may exit (`run` ends at idle): the handler waits until
// everything queued is delivered.
const FLUSH_ON = new Set(["session.idle", "session.deleted", "session.error", "server.instance.disposed",
  "global.disposed"@@FLUSH_EXTRA@@]);

// @include delivery.js

function primitives(obj) {
  const out = {};
  if (!obj || typeof obj !== "object") return out;
  for (const [k, v] of Object.entries(obj)) {
    if (typeof v === "number" || typeof v === "boolean" || (typeof v === "string" && v.length <= 512)) out[k] = v;
  }
  return out;
}

// A moment too large for the collector keeps its identity (kind, type, ids) and loses its bulk:
// the mapping then emits the event without the digests it cannot compute.
function slim(moment) {
  const m = moment || {};
  if (m.kind === "bus") {
    const ev = m.event || {};
    const props = ev.properties || {};
    const small = primitives(props);
    if (props.info && typeof props.info === "object") small.info = primitives(props.info);
    if (props.status && typeof props.status === "object") small.status = primitives(props.status);
    if (props.error && typeof props.error === "object") small.error = { name: props.error.name };
    return { kind: "bus", event: { type: ev.type, properties: small } };
  }
  if (m.kind === "permission.ask") return { kind: m.kind, permission: primitives(m.permission) };
  const out = {};
  if (m.kind === "tool.after" && m.output && typeof m.output.title === "string") out.title = m.output.title.slice(0, 512);
  return { kind: m.kind, input: primitives(m.input), output: out };
}

// -- the plugin -----------------------------------------------------------------------------------

// Where the collector can answer a bus ask: this host's own server (percent-encoded headers).
function vendorHeaders(input) {
  const out = {};
  try {
    if (input && input.serverUrl) out["X-AEP-Server-Url"] = encodeURIComponent(String(input.serverUrl));
    if (input && typeof input.directory === "string") out["X-AEP-Directory"] = encodeURIComponent(input.directory);
  } catch { /* the answer routes are then unavailable; observation still works */ }
  return out;
}

async function AepCollector(input, options) {
  let send;
  try {
    send = sender(delivery(options, environment()), vendorHeaders(input));
  } catch {
    return {};
  }
  return {
    event: async (arg) => {
      try {
        const event = arg && arg.event;
        send.observe({ kind: "bus", event });
        if (event && FLUSH_ON.has(event.type)) await send.flush();
      } catch { /* fail open */ }
    },
    "tool.execute.before": async (input, output) => {
      try {
        send.observe({ kind: "tool.before", input, output });
      } catch { /* fail open */ }
    },
    "tool.execute.after": async (input, output) => {
      try {
        send.observe({ kind: "tool.after", input, output });
      } catch { /* fail open */ }
    },
    "permission.ask": async (input, output) => {
      try {
        const reply = await send.hold({ kind: "permission.ask", permission: input });
        const status = reply && typeof reply === "object" ? reply.status : undefined;
        // Only a valid answer changes anything; {} (timeout, no operator, any failure) leaves
        // output untouched and @@TITLE_SHORT@@ asks the user itself.
        if ((status === "allow" || status === "deny") && output && typeof output === "object") output.status = status;
      } catch { /* fail open */ }
    },
  };
}

export default { id: "aep-collector", server: AepCollector };

// aep-collector plugin for OpenCode: forwards plugin moments to the collector's `opencode` receiver.
// GENERATED from receivers/plugin_vendors/js/src/ by `python -m aep_collector.receivers.plugin_vendors.js.build`;
// edit the sources there, not this file (a test checks the two agree).
//
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
// Nothing here ever throws into OpenCode: every handler is wrapped, every request is bounded by
// an AbortController, and a collector that is down costs one refused connection, then nothing for
// `retryMs` (moments in that window are dropped, the agent is never slowed).
//
// Settings (plugin options where the loader passes them, else the environment, else the default):
//   url          AEP_OPENCODE_URL          http://127.0.0.1:8390/hook
//   timeoutMs    AEP_OPENCODE_TIMEOUT_MS   2000    bound of one observation POST
//   holdMs       AEP_OPENCODE_HOLD_MS      65000   bound of a held permission.ask (above the
//                                                  collector's attention_timeout, 55 s by default)
//   retryMs      AEP_OPENCODE_RETRY_MS     2000    pause after a failed delivery
//   maxBodyBytes AEP_OPENCODE_MAX_BODY     1000000 larger moments are sent slimmed (see `slim`)

const PREFIX = "AEP_OPENCODE_";
const DEFAULTS = { url: "http://127.0.0.1:8390/hook", timeoutMs: 2000, holdMs: 65000, retryMs: 2000,
  maxBodyBytes: 1000000 };
// Bus moments after which the host may exit (`run` ends at idle): the handler waits until
// everything queued is delivered.
const FLUSH_ON = new Set(["session.idle", "session.deleted", "session.error", "server.instance.disposed",
  "global.disposed"]);

// -- settings -------------------------------------------------------------------------------------

function environment() {
  try {
    const env = globalThis.process && globalThis.process.env;
    return env && typeof env === "object" ? env : {};
  } catch {
    return {};
  }
}

// A plugin option where the loader passes one, else the environment, else the default.
function pick(options, env, key, envKey, fallback) {
  const raw = options && options[key] !== undefined ? options[key] : env[PREFIX + envKey];
  if (typeof fallback === "number") {
    const n = Number(raw);
    return raw !== undefined && raw !== "" && Number.isFinite(n) && n > 0 ? n : fallback;
  }
  return typeof raw === "string" && raw.trim() ? raw.trim() : fallback;
}

function delivery(options, env) {
  const cfg = {
    url: pick(options, env, "url", "URL", DEFAULTS.url),
    timeoutMs: pick(options, env, "timeoutMs", "TIMEOUT_MS", DEFAULTS.timeoutMs),
    holdMs: pick(options, env, "holdMs", "HOLD_MS", DEFAULTS.holdMs),
    retryMs: pick(options, env, "retryMs", "RETRY_MS", DEFAULTS.retryMs),
    maxBodyBytes: pick(options, env, "maxBodyBytes", "MAX_BODY", DEFAULTS.maxBodyBytes),
  };
  try {
    const u = new URL(cfg.url);
    if (u.pathname === "/" || u.pathname === "") u.pathname = "/hook";
    cfg.url = u.toString();
  } catch {
    cfg.url = DEFAULTS.url;
  }
  return cfg;
}

// -- serialization: a snapshot taken when the hook fires, never a live object ---------------------

function stringify(value) {
  try {
    return JSON.stringify(value);
  } catch {
    const seen = new WeakSet();
    try {
      return JSON.stringify(value, (_k, v) => {
        if (typeof v === "bigint") return String(v);
        if (v && typeof v === "object") {
          if (seen.has(v)) return undefined; // a cycle: drop the back edge
          seen.add(v);
        }
        return v;
      });
    } catch {
      return undefined;
    }
  }
}

function bytes(text) {
  try {
    return new TextEncoder().encode(text).length;
  } catch {
    return text.length * 3;
  }
}

// [text, size] of the moment, slimmed (see `slim`) when the whole is over `max`; undefined if even
// the slim one is.
function fit(moment, max) {
  const whole = stringify(moment);
  const size = whole === undefined ? Infinity : bytes(whole);
  if (size <= max) return [whole, size];
  const small = stringify(slim(moment));
  const smallSize = small === undefined ? Infinity : bytes(small);
  return smallSize <= max ? [small, smallSize] : undefined;
}

// -- delivery -------------------------------------------------------------------------------------
//
// Observation moments are queued in firing order and the handler returns at once; one delivery
// loop POSTs the queue, everything that piled up while a POST was out going together as one
// `{"batch": [...]}` body (a lone moment goes as itself). So a burst of start-up moments costs one
// request, and a lifecycle moment behind it waits one round trip, not one per moment. The host's
// shutdown moments await `flush()`: everything queued is delivered before the host goes on to exit.

const MAX_QUEUE = 512; // moments waiting; beyond it a moment is dropped (a collector far behind)
const MAX_BATCH = 256; // moments in one POST

function sender(cfg, extraHeaders) {
  const headers = { "Content-Type": "application/json", ...extraHeaders };
  let downUntil = 0;
  const queue = []; // [text, size] in firing order
  let pumping; // the running delivery loop, while there is one

  async function post(text, ms) {
    if (text === undefined || Date.now() < downUntil) return undefined;
    const ctrl = typeof AbortController === "function" ? new AbortController() : undefined;
    const timer = setTimeout(() => { try { if (ctrl) ctrl.abort(); } catch { /* fail open */ } }, ms);
    try {
      const res = await fetch(cfg.url, { method: "POST", headers, body: text, signal: ctrl ? ctrl.signal : undefined });
      const raw = await res.text();
      downUntil = 0;
      if (!res.ok || !raw.trim()) return undefined;
      try {
        return JSON.parse(raw);
      } catch {
        return undefined;
      }
    } catch {
      downUntil = Date.now() + cfg.retryMs; // down, hung or refused: stop trying for a while
      return undefined;
    } finally {
      clearTimeout(timer);
    }
  }

  // The longest head of the queue that fits one body.
  function nextBody() {
    let n = 0;
    let size = 12; // {"batch":[]}
    while (n < queue.length && n < MAX_BATCH && (n === 0 || size + queue[n][1] + 1 <= cfg.maxBodyBytes)) {
      size += queue[n][1] + 1;
      n += 1;
    }
    const texts = queue.splice(0, n).map((q) => q[0]);
    return texts.length === 1 ? texts[0] : '{"batch":[' + texts.join(",") + "]}";
  }

  async function pump() {
    try {
      await null; // moments fired in this same turn join the first body
      while (queue.length) {
        if (Date.now() < downUntil) {
          queue.length = 0; // the collector is away: what waits is dropped, the agent is never slowed
          break;
        }
        await post(nextBody(), cfg.timeoutMs);
      }
    } catch { /* fail open */ } finally {
      pumping = undefined;
    }
  }

  function observe(moment) {
    if (Date.now() < downUntil || queue.length >= MAX_QUEUE) return;
    const one = fit(moment, cfg.maxBodyBytes);
    if (one === undefined) return;
    queue.push(one);
    if (!pumping) pumping = pump();
  }

  // Resolves once everything queued so far has been POSTed (each POST bounded by timeoutMs).
  function flush() {
    return pumping || Promise.resolve();
  }

  // A held moment waits (bounded) for earlier moments to be delivered, then waits alone for its
  // answer, so it never blocks the moments behind it.
  async function hold(moment) {
    const one = fit(moment, cfg.maxBodyBytes);
    let timer;
    const pause = new Promise((resolve) => { timer = setTimeout(resolve, cfg.timeoutMs); });
    try {
      await Promise.race([flush(), pause]);
    } finally {
      clearTimeout(timer);
    }
    return one === undefined ? undefined : post(one[0], cfg.holdMs);
  }

  return { observe, flush, hold };
}

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
        // output untouched and OpenCode asks the user itself.
        if ((status === "allow" || status === "deny") && output && typeof output === "object") output.status = status;
      } catch { /* fail open */ }
    },
  };
}

export default { id: "aep-collector", server: AepCollector };

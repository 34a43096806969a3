// aep-collector extension for pi: forwards extension-bus events to the collector's `pi` receiver.
//
// Install by explicit path (pi auto-discovers only `*.ts`): add the absolute path of this file to
// the `extensions` array of pi's settings.json, or run `pi -e /ABS/PATH/pi-extension.js`;
// `aep-collector hooks pi` prints both. Plain JS: global `fetch`, `AbortController`, `TextEncoder`,
// `setTimeout`; no imports.
//
// Vendor API (facts, cited): badlogic/pi-mono packages/coding-agent/docs/extensions.md: an
// extension default-exports a factory `(pi) => { pi.on(event, handler) }`; a handler gets
// `(event, ctx)` with `ctx.sessionManager.getSessionId()` / `getSessionFile()` and `ctx.cwd`; a
// handler that returns nothing leaves the moment untouched; `tool_call` "can block" by returning
// `{ block: true, reason }`, and it fires after `tool_execution_start`.
//
// Posture: observe-only BY NON-SUBSCRIPTION. By default this registers notification events only,
// and every handler returns `undefined` (also `message_end`, which could replace the message).
// `tool_call` is registered only with AEP_PI_CONTROL=1; its handler is fully try/caught (a
// throwing tool_call handler would block the tool) and returns `{block: true, reason}` only for
// an explicit collector deny; allow, timeout and every failure return `undefined` (the call runs).
// Stream updates (`message_update`, `tool_execution_update`) are subscribed only with
// AEP_PI_DELTAS=1 (the collector's `deltas` switch decides whether they are mapped).
//
// Each moment is POSTed as {session: {id, file, cwd}, event: {type, ...}}, in the order fired.
// A collector that is down costs one refused connection, then nothing for AEP_PI_RETRY_MS.
//
// Settings (environment of the pi process, else the default):
//   AEP_PI_URL         http://127.0.0.1:8396/hook
//   AEP_PI_CONTROL     0        1: register `tool_call` (the collector's gate must be on too)
//   AEP_PI_DELTAS      0        1: forward stream updates
//   AEP_PI_TIMEOUT_MS  2000     bound of one observation POST
//   AEP_PI_HOLD_MS     65000    bound of a held tool_call (above the collector's 55 s hold)
//   AEP_PI_RETRY_MS    2000     pause after a failed delivery
//   AEP_PI_MAX_BODY    1000000  larger moments are sent slimmed (see `fit`)

const DEFAULTS = { url: "http://127.0.0.1:8396/hook", timeoutMs: 2000, holdMs: 65000, retryMs: 2000,
  maxBodyBytes: 1000000 };
const MAX_QUEUE = 512;
const DEFAULT_DENY = "Denied by the operator (AEP).";
// The notification events the mapping knows (processors/mapping/pi.py, fixture mappings/pi.json).
const EVENTS = ["session_start", "session_shutdown", "session_compact", "session_info_changed", "session_tree",
  "agent_start", "agent_end", "agent_settled", "turn_start", "turn_end", "message_start", "message_end",
  "tool_execution_start", "tool_execution_end", "model_select", "thinking_level_select"];
const STREAM_EVENTS = ["message_update", "tool_execution_update"];
const TRUE_WORDS = ["1", "true", "yes", "on"];

function environment() {
  try {
    const env = globalThis.process && globalThis.process.env;
    return env && typeof env === "object" ? env : {};
  } catch {
    return {};
  }
}

function number(env, key, fallback) {
  const raw = env["AEP_PI_" + key];
  const n = Number(raw);
  return raw !== undefined && raw !== "" && Number.isFinite(n) && n > 0 ? n : fallback;
}

function flag(env, key) {
  return TRUE_WORDS.includes(String(env["AEP_PI_" + key] || "").trim().toLowerCase());
}

function settings() {
  const env = environment();
  const cfg = {
    url: typeof env.AEP_PI_URL === "string" && env.AEP_PI_URL.trim() ? env.AEP_PI_URL.trim() : DEFAULTS.url,
    control: flag(env, "CONTROL"),
    deltas: flag(env, "DELTAS"),
    timeoutMs: number(env, "TIMEOUT_MS", DEFAULTS.timeoutMs),
    holdMs: number(env, "HOLD_MS", DEFAULTS.holdMs),
    retryMs: number(env, "RETRY_MS", DEFAULTS.retryMs),
    maxBodyBytes: number(env, "MAX_BODY", DEFAULTS.maxBodyBytes),
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

// -- the moment: the session read in-process, the event as pi gave it --------------------------------

function call(fn) {
  try {
    const v = fn();
    return typeof v === "string" && v ? v : undefined;
  } catch {
    return undefined;
  }
}

function moment(name, event, ctx) {
  const sm = ctx && ctx.sessionManager;
  const session = {
    id: call(() => sm.getSessionId()),
    file: call(() => sm.getSessionFile()),
    cwd: call(() => ctx.cwd),
  };
  const ev = event && typeof event === "object" ? { ...event } : {};
  if (typeof ev.type !== "string" || !ev.type) ev.type = name;
  if (name === "message_update") delete ev.message; // the whole message so far; the delta is what maps
  return { session, event: ev };
}

// -- serialization ----------------------------------------------------------------------------------

function stringify(value) {
  try {
    return JSON.stringify(value);
  } catch {
    const seen = new WeakSet();
    try {
      return JSON.stringify(value, (_k, v) => {
        if (typeof v === "bigint") return String(v);
        if (v && typeof v === "object") {
          if (seen.has(v)) return undefined;
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

function bare(message) {
  if (!message || typeof message !== "object") return message;
  const { content: _content, ...rest } = message;
  return rest;
}

// A moment too large keeps its identity and loses its bulk (content, args, results): the mapping
// then emits the event without the digests it cannot compute.
function slim(m) {
  const ev = { ...m.event };
  if (Array.isArray(ev.messages)) {
    const last = [...ev.messages].reverse().find((x) => x && x.role === "assistant");
    ev.messages = last ? [bare(last)] : [];
  }
  if (ev.message) ev.message = bare(ev.message);
  for (const key of ["args", "input", "result", "partialResult", "toolResults", "compactionEntry"]) delete ev[key];
  return { session: m.session, event: ev };
}

function fit(m, max) {
  const whole = stringify(m);
  if (whole !== undefined && bytes(whole) <= max) return whole;
  const small = stringify(slim(m));
  return small !== undefined && bytes(small) <= max ? small : undefined;
}

// -- delivery ---------------------------------------------------------------------------------------

function sender(cfg) {
  let downUntil = 0;
  let chain = Promise.resolve();
  let depth = 0;

  async function post(text, ms) {
    if (text === undefined || Date.now() < downUntil) return undefined;
    const ctrl = typeof AbortController === "function" ? new AbortController() : undefined;
    const timer = setTimeout(() => { try { if (ctrl) ctrl.abort(); } catch { /* fail open */ } }, ms);
    try {
      const res = await fetch(cfg.url, { method: "POST", headers: { "Content-Type": "application/json" },
        body: text, signal: ctrl ? ctrl.signal : undefined });
      const raw = await res.text();
      downUntil = 0;
      if (!res.ok || !raw.trim()) return undefined;
      try {
        return JSON.parse(raw);
      } catch {
        return undefined;
      }
    } catch {
      downUntil = Date.now() + cfg.retryMs;
      return undefined;
    } finally {
      clearTimeout(timer);
    }
  }

  function observe(m) {
    const text = fit(m, cfg.maxBodyBytes);
    if (text === undefined || depth >= MAX_QUEUE || Date.now() < downUntil) return Promise.resolve();
    depth += 1;
    const done = chain.then(() => post(text, cfg.timeoutMs)).then(() => { depth -= 1; }, () => { depth -= 1; });
    chain = done;
    return done;
  }

  async function hold(m) {
    const text = fit(m, cfg.maxBodyBytes);
    let timer;
    const pause = new Promise((resolve) => { timer = setTimeout(resolve, cfg.timeoutMs); });
    try {
      await Promise.race([chain, pause]);
    } finally {
      clearTimeout(timer);
    }
    return post(text, cfg.holdMs);
  }

  return { observe, hold };
}

// -- the factory ------------------------------------------------------------------------------------

export default function aepCollector(pi) {
  try {
    const cfg = settings();
    const send = sender(cfg);
    const names = cfg.deltas ? [...EVENTS, ...STREAM_EVENTS] : EVENTS;
    for (const name of names) {
      pi.on(name, async (event, ctx) => {
        try {
          await send.observe(moment(name, event, ctx));
        } catch { /* fail open */ }
        return undefined;
      });
    }
    if (cfg.control) {
      pi.on("tool_call", async (event, ctx) => {
        try {
          const reply = await send.hold(moment("tool_call", event, ctx));
          if (reply && typeof reply === "object" && reply.block === true) {
            const reason = typeof reply.reason === "string" && reply.reason.trim() ? reply.reason : DEFAULT_DENY;
            return { block: true, reason };
          }
        } catch { /* fail open: never block on our own failure */ }
        return undefined;
      });
    }
  } catch { /* a broken extension must not break pi */ }
}

// aep-collector extension for pi: forwards extension-bus events to the collector's `pi` receiver.
// GENERATED from receivers/plugin_vendors/js/src/ by `python -m aep_collector.receivers.plugin_vendors.js.build`;
// edit the sources there, not this file (a test checks the two agree).
//
// Install: `aep-collector hooks pi --install` copies it to `~/.pi/agent/extensions/aep-collector.js`
// (pi 0.73.1 discovers `*.ts` and `*.js` there and in a project's `.pi/extensions/`); or load it by
// path, `pi -e /ABS/PATH/pi-extension.js`. Plain JS: global `fetch`, `AbortController`,
// `TextEncoder`, `setTimeout`; no imports.
//
// Vendor API (facts, cited): badlogic/pi-mono packages/coding-agent/docs/extensions.md: an
// extension default-exports a factory `(pi) => { pi.on(event, handler) }`; a handler gets
// `(event, ctx)` with `ctx.sessionManager.getSessionId()` / `getSessionFile()` and `ctx.cwd`; a
// handler that returns nothing leaves the moment untouched; `tool_call` "can block" by returning
// `{ block: true, reason }`, and it fires after `tool_execution_start`. pi runs agent events
// through one queue that awaits every handler, while `session_shutdown` is emitted beside that
// queue: so handlers return at once (a handler that waited for the collector held the queue back,
// and pi 0.73.1 exited with tool_execution_end, turn_end and agent_end still in it), and
// `session_shutdown` waits until everything queued is delivered.
//
// Posture: observe-only BY NON-SUBSCRIPTION. By default this registers notification events only,
// and every handler returns `undefined` (also `message_end`, which could replace the message).
// `tool_call` is registered only with AEP_PI_CONTROL=1; its handler is fully try/caught (a
// throwing tool_call handler would block the tool) and returns `{block: true, reason}` only for
// an explicit collector deny; allow, timeout and every failure return `undefined` (the call runs).
// Stream updates (`message_update`, `tool_execution_update`) are subscribed only with
// AEP_PI_DELTAS=1 (the collector's `deltas` switch decides whether they are mapped).
//
// Each moment is POSTed as {session: {id, file, cwd}, event: {type, ...}} in the order fired,
// several together as {batch: [...]}. A collector that is down costs one refused connection, then
// nothing for AEP_PI_RETRY_MS.
//
// Settings (environment of the pi process, else the default):
//   AEP_PI_URL         http://127.0.0.1:8396/hook
//   AEP_PI_CONTROL     0        1: register `tool_call` (the collector's gate must be on too)
//   AEP_PI_DELTAS      0        1: forward stream updates
//   AEP_PI_TIMEOUT_MS  2000     bound of one observation POST
//   AEP_PI_HOLD_MS     65000    bound of a held tool_call (above the collector's 55 s hold)
//   AEP_PI_RETRY_MS    2000     pause after a failed delivery
//   AEP_PI_MAX_BODY    1000000  larger moments are sent slimmed (see `slim`)

const PREFIX = "AEP_PI_";
const DEFAULTS = { url: "http://127.0.0.1:8396/hook", timeoutMs: 2000, holdMs: 65000, retryMs: 2000,
  maxBodyBytes: 1000000 };
const DEFAULT_DENY = "Denied by the operator (AEP).";
// The notification events the mapping knows (processors/mapping/pi.py, fixture mappings/pi.json).
const EVENTS = ["session_start", "session_shutdown", "session_compact", "session_info_changed", "session_tree",
  "agent_start", "agent_end", "agent_settled", "turn_start", "turn_end", "message_start", "message_end",
  "tool_execution_start", "tool_execution_end", "model_select", "thinking_level_select"];
const STREAM_EVENTS = ["message_update", "tool_execution_update"];
const FLUSH_ON = new Set(["session_shutdown"]); // pi disposes the session (and exits) after it
const TRUE_WORDS = ["1", "true", "yes", "on"];

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

function flag(env, key) {
  return TRUE_WORDS.includes(String(env[PREFIX + key] || "").trim().toLowerCase());
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

// -- the factory ------------------------------------------------------------------------------------

export default function aepCollector(pi) {
  try {
    const env = environment();
    const send = sender(delivery(undefined, env), {});
    const names = flag(env, "DELTAS") ? [...EVENTS, ...STREAM_EVENTS] : EVENTS;
    for (const name of names) {
      pi.on(name, async (event, ctx) => {
        try {
          send.observe(moment(name, event, ctx));
          if (FLUSH_ON.has(name)) await send.flush();
        } catch { /* fail open */ }
        return undefined;
      });
    }
    if (flag(env, "CONTROL")) {
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

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
//   AEP_PI_URL         http://127.0.0.1:@@PORT@@/hook
//   AEP_PI_CONTROL     0        1: register `tool_call` (the collector's gate must be on too)
//   AEP_PI_DELTAS      0        1: forward stream updates
//   AEP_PI_TIMEOUT_MS  2000     bound of one observation POST
//   AEP_PI_HOLD_MS     65000    bound of a held tool_call (above the collector's 55 s hold)
//   AEP_PI_RETRY_MS    2000     pause after a failed delivery
//   AEP_PI_MAX_BODY    1000000  larger moments are sent slimmed (see `slim`)

const PREFIX = "AEP_PI_";
const DEFAULTS = { url: "http://127.0.0.1:@@PORT@@/hook", timeoutMs: 2000, holdMs: 65000, retryMs: 2000,
  maxBodyBytes: 1000000 };
const DEFAULT_DENY = "Denied by the operator (AEP).";
// The notification events the mapping knows (processors/mapping/pi.py, fixture mappings/pi.json).
const EVENTS = ["session_start", "session_shutdown", "session_compact", "session_info_changed", "session_tree",
  "agent_start", "agent_end", "agent_settled", "turn_start", "turn_end", "message_start", "message_end",
  "tool_execution_start", "tool_execution_end", "model_select", "thinking_level_select"];
const STREAM_EVENTS = ["message_update", "tool_execution_update"];
const FLUSH_ON = new Set(["session_shutdown"]); // pi disposes the session (and exits) after it
const TRUE_WORDS = ["1", "true", "yes", "on"];

// @include delivery.js

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

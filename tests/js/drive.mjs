// Loads a vendor-side plugin file and calls it the way its host does (tests/test_plugin_vendors_js.py).
//
//   node drive.mjs PLUGIN_FILE < scenario.json
//
// scenario (OpenCode / Kilo Code plugin module):
//   {"host": "plugin", "input": {PluginInput fields}, "options": {...}, "steps": [{"hook": NAME, "args": [...]}]}
//   `default.server(input, options)` builds the hooks; each step awaits `hooks[NAME](...args)`
//   (a step's "cycle": [i, key] first makes args[i][key] contain itself; "detached": true calls the
//   hook without awaiting it and reports nothing for it).
// scenario (pi extension factory):
//   {"host": "pi", "steps": [{"emit": EVENT, "event": {...}, "session": {"id", "file", "cwd"}}]}
//   `default(pi)` registers handlers through a stand-in `pi.on`; each step awaits every handler of EVENT
//   with a ctx whose sessionManager answers from `session`. A step with "queued": true goes through
//   one queue instead, as pi 0.73.1 runs agent events (each awaits the one before, nobody awaits the
//   queue); the next direct step waits one event-loop turn, not for the queue (pi's session_shutdown).
//
// Either host: "exit": true ends the process right after the last step, as a host that exits once
// its shutdown moment's handlers returned; what the plugin has not delivered by then is lost.
//
// Prints one JSON object: {"registered": [...], "steps": [{"threw", "error", "ms", "args" | "returned"}]}.
// The driver itself may use Node built-ins; the plugin files under test must not (they import nothing).

import { writeSync } from "node:fs";
import { pathToFileURL } from "node:url";

async function readStdin() {
  const chunks = [];
  for await (const chunk of process.stdin) chunks.push(chunk);
  return Buffer.concat(chunks).toString("utf8");
}

function ctxFor(session) {
  const s = session || {};
  return {
    cwd: s.cwd,
    sessionManager: {
      getSessionId: () => s.id,
      getSessionFile: () => s.file,
    },
  };
}

async function timed(fn) {
  const t0 = performance.now();
  try {
    const value = await fn();
    return { threw: false, ms: performance.now() - t0, value };
  } catch (error) {
    return { threw: true, error: String(error), ms: performance.now() - t0 };
  }
}

const [file] = process.argv.slice(2);
const scenario = JSON.parse(await readStdin());
const mod = await import(pathToFileURL(file).href);
const out = { exports: Object.keys(mod), registered: [], steps: [] };

if (scenario.host === "pi") {
  const handlers = {};
  const pi = { on: (name, fn) => { (handlers[name] ||= []).push(fn); } };
  const built = await timed(() => mod.default(pi));
  out.factory = { threw: built.threw, returned: built.value === undefined ? null : built.value };
  out.registered = Object.keys(handlers);
  let queue = Promise.resolve();
  for (const step of scenario.steps) {
    const results = [];
    out.steps.push({ emit: step.emit, handlers: results });
    const fire = async () => {
      for (const fn of handlers[step.emit] || []) {
        const r = await timed(() => fn(step.event, ctxFor(step.session)));
        results.push({ threw: r.threw, error: r.error, ms: r.ms, returned: r.value === undefined ? null : r.value });
      }
    };
    if (step.queued) {
      queue = queue.then(fire);
    } else {
      await new Promise((resolve) => setImmediate(resolve));
      await fire();
    }
  }
} else {
  const plugin = mod.default;
  out.module = { id: plugin && plugin.id, server: typeof (plugin && plugin.server) };
  const hooks = await plugin.server(scenario.input || {}, scenario.options);
  out.registered = Object.keys(hooks);
  for (const step of scenario.steps) {
    const args = step.args || [];
    if (step.cycle) {
      // {"cycle": [argIndex, key]}: make args[i][key] reference itself, as live vendor objects can.
      const [i, key] = step.cycle;
      args[i][key].self = args[i][key];
    }
    const fn = hooks[step.hook];
    if (fn && step.detached) {
      fn(...args); // as a host that fires bus events without awaiting the plugin
      continue;
    }
    const r = fn ? await timed(() => fn(...args)) : { threw: false, ms: 0, value: undefined, missing: true };
    out.steps.push({ hook: step.hook, missing: !fn, threw: r.threw, error: r.error, ms: r.ms,
      args: step.cycle ? "cyclic" : args, returned: r.value === undefined ? null : r.value });
  }
}

if (scenario.exit) {
  writeSync(1, JSON.stringify(out) + "\n"); // synchronously: no event-loop turn for the plugin
  process.exit(0);
} else {
  process.stdout.write(JSON.stringify(out) + "\n");
}

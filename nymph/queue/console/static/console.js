// nymph console: the only script. It follows a running instance's log (appending the text as
// text, never as HTML), reloads the instance page when its state changes and refreshes a list
// of instances while some are live. Pages work without it; nothing here reads or writes the
// token (the cookie is HttpOnly).
"use strict";

function followLog(pre) {
  const status = document.getElementById("log-status");
  let offset = Number(pre.dataset.offset || "0");
  const decoder = new TextDecoder();
  async function run() {
    for (;;) {
      let resp;
      try {
        resp = await fetch(pre.dataset.src + "?follow=true&since=" + offset, { credentials: "same-origin" });
      } catch (err) {
        await new Promise((r) => setTimeout(r, 2000));
        continue;
      }
      if (!resp.ok || !resp.body) { if (status) status.textContent = "log not available (" + resp.status + ")"; return; }
      const reader = resp.body.getReader();
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        offset += value.byteLength;
        pre.append(document.createTextNode(decoder.decode(value, { stream: true })));
        pre.scrollTop = pre.scrollHeight;
      }
      break; // the follow ends when the log is over
    }
    if (status) status.textContent = "log complete";
  }
  run();
}

function watchInstance(card) {
  let version = Number(card.dataset.version || "0");
  async function run() {
    for (;;) {
      let resp;
      try {
        resp = await fetch(card.dataset.json + "?after=" + version + "&wait=25", { credentials: "same-origin" });
      } catch (err) {
        await new Promise((r) => setTimeout(r, 2000));
        continue;
      }
      if (!resp.ok) return;
      const inst = await resp.json();
      if (inst.version > version) {
        const stateEl = document.getElementById("state");
        if (stateEl && stateEl.textContent !== inst.state) {
          // A new state brings what the page shows with it (exit code, results): reload,
          // once the log has caught up.
          setTimeout(() => window.location.reload(), inst.state === "stopped" ? 1500 : 0);
          return;
        }
        version = inst.version;
        const reason = document.getElementById("reason");
        if (reason) reason.textContent = inst.reason || "";
        const message = document.getElementById("message");
        if (message) message.textContent = inst.message || "";
      }
    }
  }
  run();
}

function refreshList(table) {
  // A list with live instances is read again every few seconds (the same page, rendered and
  // escaped by the queue); only its rows are replaced, so a half-typed launch form stays.
  async function tick() {
    try {
      const resp = await fetch(window.location.href, { credentials: "same-origin" });
      if (!resp.ok) return;
      const doc = new DOMParser().parseFromString(await resp.text(), "text/html");
      const fresh = doc.querySelector("table.instances");
      if (!fresh) return;
      table.tBodies[0].replaceWith(document.importNode(fresh.tBodies[0], true));
      if (fresh.dataset.live !== "true") return;
    } catch (err) {
      // the queue is away for a moment: try again later
    }
    setTimeout(tick, 3000);
  }
  setTimeout(tick, 3000);
}

document.addEventListener("DOMContentLoaded", () => {
  const list = document.querySelector("table.instances");
  if (list && list.dataset.live === "true") refreshList(list);
  const pre = document.getElementById("log");
  if (pre && pre.dataset.live === "true") followLog(pre);
  const card = document.getElementById("instance");
  if (card && card.dataset.live === "true") watchInstance(card);
});

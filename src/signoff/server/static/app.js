// signoff dashboard: live queue and trace over Server-Sent Events (its forms are forms.js's).
(function () {
  "use strict";
  const prefix = document.body.dataset.prefix || "/_signoff";
  const dot = document.getElementById("live-dot");

  // Marks what a live update moved under the pointer (`aim.js`): `moved(false)`, change,
  // `moved(true)`.
  const moved = (window.signoffAim && window.signoffAim.moved) || (() => {});

  function toast(text, bad) {
    const box = document.getElementById("toasts");
    if (!box) return;
    const el = document.createElement("div");
    el.className = "toast" + (bad ? " bad" : "");
    // cut: a request named by a model's long question made a toast taller than the screen
    el.textContent = text.length > 200 ? text.slice(0, 200) + "…" : text;
    box.appendChild(el);
    setTimeout(() => el.remove(), 5000);
  }

  // What was typed is kept as the page goes once this says so (`drafts.js`).
  const keepTyped = () => window.signoffDrafts && window.signoffDrafts.keep();

  // The sign-in ended (it expired, or was signed out in another tab): say so at the page's top,
  // with a link to sign in again that comes back to this page. Without a sign-in form here (an
  // authenticator of the application's, a proxy's sign-in), the link reloads the page, which
  // goes through that sign-in.
  let signedOff = false;  // no stream is opened again: each would be refused alike
  function signInAgain(text) {
    signedOff = true;
    keepTyped();
    reconnecting(false);
    let note = document.getElementById("signed-out");
    if (!note) {
      note = document.createElement("p");
      note.id = "signed-out";
      note.className = "warning";
      note.setAttribute("role", "alert");
      moved(false);
      (document.querySelector("main") || document.body).prepend(note);
      moved(true);
    }
    note.textContent = text.charAt(0).toUpperCase() + text.slice(1) + ". ";
    const link = document.createElement("a");
    const form = document.body.dataset.signIn;
    const here = location.pathname + location.search;
    link.href = form ? form + "?next=" + encodeURIComponent(here) : here;
    link.textContent = form ? "Sign in" : "Reload";
    note.appendChild(link);
  }

  // A script's fetch answered 401: the sign-in ended. True when it did (and said so).
  async function signedOut(res) {
    if (res.status !== 401) return false;
    const data = await res.json().catch(() => ({}));
    signInAgain((data.error && data.error.message) || "you are no longer signed in");
    return true;
  }

  // A script's read of what this page shows, as the viewer it was made for: signing in as
  // someone else in another tab gives it that person's cookie, and the server refuses it (401,
  // said as a sign-in that ended) rather than answer as them.
  const viewer = document.body.dataset.viewer;
  function readAs(url) {
    const headers = { Accept: "application/json" };
    if (viewer) headers["X-Signoff-Viewer"] = viewer;
    return fetch(url, { credentials: "same-origin", headers });
  }

  function fragment(html) {
    const t = document.createElement("template");
    t.innerHTML = html;
    return t.content;
  }

  // A card leaves; the keyboard's focus in it goes on to the card after it (or before it, or
  // its list), so a reviewer tabbing through the queue goes on from where they were.
  // One listed again before it has gone (the next read, of another page, shows it) stays.
  const leaving = new WeakMap();
  function leave(card) {
    if (leaving.has(card)) return;
    card.classList.add("leaving");
    leaving.set(card, setTimeout(() => {
      leaving.delete(card);
      if (card.contains(document.activeElement)) {
        const staying = (el) => el && el.matches("[data-request-id]:not(.leaving)");
        let next = card.nextElementSibling;
        while (next && !staying(next)) next = next.nextElementSibling;
        let before = card.previousElementSibling;
        while (before && !staying(before)) before = before.previousElementSibling;
        const target = next || before || card.parentElement;
        if (target) { target.tabIndex = -1; target.focus(); }
      }
      moved(false);
      card.remove();
      moved(true);
    }, 300));
  }
  function stay(card) {
    if (!leaving.has(card)) return;
    clearTimeout(leaving.get(card));
    leaving.delete(card);
    card.classList.remove("leaving");
  }

  // A card closed elsewhere (answered in another tab or by someone else, withdrawn, expired)
  // while the reviewer wrote in it or had the focus in it vanished mid-sentence, unexplained: it
  // says so where they were, without buttons, and leaves a while later.
  // A choice made in a question's menu and not sent is work in progress too, as typed text is.
  function writing(card) {
    if (card !== document.activeElement && card.contains(document.activeElement)) return true;
    const boxes = card.querySelectorAll("form.respond input[type=text], form.respond textarea");
    const menus = card.querySelectorAll("form.respond select.choice");
    return Array.from(boxes).some((box) => box.value !== box.defaultValue) ||
      Array.from(menus).some((menu) => menu.value !== "");
  }
  function closedElsewhere(card) {
    const focused = card.contains(document.activeElement);
    card.classList.add("closed");
    card.querySelectorAll("form.respond, .moved-note").forEach((el) => el.remove());
    const note = document.createElement("p");
    note.className = "result-note barred";
    note.setAttribute("role", "status");
    note.tabIndex = -1;
    note.textContent = "Closed elsewhere (answered, withdrawn or expired) before you answered: " +
      "nothing you typed here was sent.";
    card.appendChild(note);
    if (focused) note.focus();
    setTimeout(() => leave(card), 8000);
  }

  // A card written in that left its page may only have moved to another page of the list
  // (requests before it closed): `placeOf` asks where its request is listed now. Still open,
  // it stays, its form and text kept, and says on which page it is now; closed, it says so.
  const settled = (card) => ["done", "answering", "closed"].some((c) => card.classList.contains(c));
  async function placed(card, url) {
    if (card.dataset.asking) return;
    card.dataset.asking = "1";
    let place = null;
    try {
      const res = await readAs(url);
      if (!(await signedOut(res)) && res.ok) place = await res.json();
    } catch (e) { /* not known: the next read asks again */ }
    delete card.dataset.asking;
    // Back on the page meanwhile, or answered here: nothing to say.
    if (!place || !card.dataset.away || !card.isConnected || settled(card)) return;
    moved(false);
    if (!place.open) { closedElsewhere(card); moved(true); return; }
    let note = card.querySelector(".moved-note");
    if (!note) {
      note = document.createElement("p");
      note.className = "result-note barred moved-note";
      note.setAttribute("role", "status");
      card.insertBefore(note, card.querySelector("form.respond"));
    }
    const where = document.createElement(place.url ? "a" : "span");
    if (place.url) where.href = place.url;
    where.textContent = place.page ? "page " + place.page : "another page";
    note.replaceChildren("Still open, now on ", where,
      ": what you type here is kept, and you can answer it here.");
    moved(true);
  }

  // A card kept (and what is typed in it) still shows what changed about its request, as a
  // reload would: others' votes as they come, its title's badges and its facts (escalated once
  // its deadline passed, when it no longer expires). Only its form stays as it was.
  function redraw(current, el) {
    current.querySelectorAll("[data-votes]").forEach((was) => {
      const now = el.querySelector('[data-votes="' + was.dataset.votes + '"]');
      // In place, not replaced: a screen reader announces a live region's new text only.
      if (now && was.innerHTML !== now.innerHTML) was.innerHTML = now.innerHTML;
    });
    const title = current.querySelector(".card-head .title");
    const freshTitle = el.querySelector(".card-head .title");
    if (title && freshTitle && title.innerHTML !== freshTitle.innerHTML) title.replaceWith(freshTitle);
    const facts = current.querySelector("dl.facts");
    const freshFacts = el.querySelector("dl.facts");
    if (!facts || !freshFacts) return;
    const names = (dl) => [...dl.children].map((fact) => (fact.querySelector("dt") || {}).textContent).join("\n");
    if (names(facts) !== names(freshFacts)) { facts.replaceWith(freshFacts); return; }
    [...facts.children].forEach((fact, i) => {
      const now = freshFacts.children[i];
      if (!fact.querySelector("[data-votes]") && fact.innerHTML !== now.innerHTML) fact.innerHTML = now.innerHTML;
    });
  }

  // Merge freshly rendered cards into a container without touching cards still present, so a
  // reviewer typing a reason does not lose it when another request arrives.
  function mergeCards(container, html, placeOf) {
    moved(false);  // what moved before this update is not its doing
    const incoming = fragment(html);
    const fresh = new Map();
    incoming.querySelectorAll("[data-request-id]").forEach((el) => fresh.set(el.dataset.requestId, el));
    container.querySelectorAll("[data-request-id]").forEach((el) => {
      // A card being answered here stays until its answer's note is shown (`done`): the live
      // update saying the request closed can come before the answer's own response does.
      if (fresh.has(el.dataset.requestId) || settled(el) || leaving.has(el)) return;
      el.dataset.away = "1";
      if (!writing(el)) leave(el);
      else placed(el, placeOf(el.dataset.requestId));
    });
    let previous = null;
    fresh.forEach((el, id) => {
      let current = document.getElementById(id);
      if (!current) {
        el.classList.add("new");
        current = el;
        if (previous) previous.after(current); else container.prepend(current);
      } else {
        if (!settled(current)) {
          // Listed here again: it stays, and a note that it moved goes.
          delete current.dataset.away;
          stay(current);
          const note = current.querySelector(".moved-note");
          if (note) note.remove();
        }
        redraw(current, el);
      }
      previous = current;
    });
    const empty = container.querySelector("[data-empty]");
    const incomingEmpty = incoming.querySelector("[data-empty]");
    if (fresh.size === 0 && !empty && incomingEmpty) {
      // Once: two reads that both found it empty, each a moment apart, showed it twice.
      setTimeout(() => {
        if (!container.querySelector("[data-request-id], [data-empty]")) container.appendChild(incomingEmpty);
      }, 320);
    } else if (fresh.size > 0 && empty) {
      empty.remove();
    }
    moved(true);
  }

  // The navigation's badge counts the whole queue; a page's heading counts what it lists (a
  // filtered queue: its own requests, which the fragment's X-Total-Count header gives).
  function setTotal(total) {
    const count = document.getElementById("queue-count");
    if (count) count.textContent = total ? String(total) : "";
  }

  function setShown(total) {
    document.querySelectorAll("[data-live-total]").forEach((el) => { el.textContent = String(total); });
    document.querySelectorAll("[data-live-noun]").forEach((el) => {
      el.textContent = total === 1 ? "open request" : "open requests";
    });
  }

  // Says, beside the live dot, that a stream is being opened again (or no longer is).
  function reconnecting(on) {
    const status = document.getElementById("live-status");
    if (status) status.textContent = on ? "Reconnecting…" : "";
    if (dot) dot.classList.toggle("retrying", on);
  }

  // The server cannot reach its store (a 503: its file deleted or replaced, its database down):
  // said at the page's top, with when it is tried again, until a stream opens again (`null`).
  function storeDown(text) {
    let note = document.getElementById("store-down");
    if (text === null) { if (note) note.remove(); return; }
    if (!note) {
      note = document.createElement("p");
      note.id = "store-down";
      note.className = "warning";
      note.setAttribute("role", "alert");
      moved(false);
      (document.querySelector("main") || document.body).prepend(note);
      moved(true);
    }
    note.textContent = text;
  }

  // `url` is a function: a stream opened again asks for what came after the page's last read.
  function live(url, handlers, types, ended) {
    let failures = 0;
    let over = false;
    let down = null;  // why the server cannot reach its store, while it cannot ("" unknown)
    // A hidden tab holds no stream: over HTTP/1.1 a browser opens 6 connections to a host, so
    // six tabs' streams left a seventh page (and every form's post) waiting. It is closed when
    // the tab is hidden (or not opened, `paused`) and opened again when it is shown, which
    // reads the page once as a reconnect does.
    let stream = null;
    let paused = false;
    const hidden = () => document.visibilityState === "hidden";
    document.addEventListener("visibilitychange", () => {
      if (over || signedOff) return;
      if (hidden()) {
        if (!stream) return;  // a retry's pause: its end sees the tab hidden
        stream.close();
        stream = null;
        paused = true;
        if (dot) dot.classList.remove("on");
        reconnecting(false);
      } else if (paused) {
        paused = false;
        if (ended) ended({});
        open();
      }
    });
    // After a pause that doubles from 1 s to 30 s at most (a little random, so pages refused
    // together do not come back together), a HEAD asks for the status the browser hides: 200
    // opens the stream; 404 or 410 is a stream that will never come back (the page's read shows
    // why), 401 a sign-in that ended; anything else (a 502, a 429, no answer) waits longer. A
    // store the server cannot reach (503) may be gone until the server restarts: a banner says
    // so, and the pause doubles on, to 5 minutes at most, rather than ask every 30 s forever.
    const retry = () => {
      if (over || signedOff) return;
      const most = down === null ? 30000 : 300000;
      const pause = Math.min(most, 1000 * 2 ** Math.min(failures, 9)) * (0.8 + 0.4 * Math.random());
      failures += 1;
      reconnecting(true);
      if (down !== null) {
        const wait = pause < 90000 ? Math.round(pause / 1000) + " seconds" : Math.round(pause / 60000) + " minutes";
        storeDown("The server cannot reach its store" + (down ? " (" + down + ")" : "") +
          ": this page is not updated. Trying again in about " + wait + ".");
      }
      setTimeout(async () => {
        if (over || signedOff) return;
        if (hidden()) { paused = true; reconnecting(false); return; }
        const res = await fetch(url(), { method: "HEAD", credentials: "same-origin" }).catch(() => null);
        if (over || signedOff) return;
        if (res && res.ok) open();
        else if (res && res.status === 401) signInAgain("you are no longer signed in");
        else if (res && [404, 410].includes(res.status)) {
          over = true;
          reconnecting(false);
          if (ended) ended({ status: res.status });  // the page's read shows why
        }
        else {
          if (res && res.status === 503 && down === null) down = "";
          retry();
        }
      }, pause);
    };
    const open = () => {
      if (over || signedOff) return;
      if (hidden()) { paused = true; return; }
      const es = new EventSource(url());
      stream = es;
      es.onopen = () => {
        failures = 0;
        down = null;
        storeDown(null);
        reconnecting(false);
        if (dot) dot.classList.add("on");
      };
      es.onerror = () => {
        if (dot) dot.classList.remove("on");
        // The stream dropped (the server restarting, the network): the browser reconnects by
        // itself, and the page says so until it has. A reconnect refused (the sign-in ended
        // while the stream was down, a proxy's 502 or a 429): the browser gives up; the page is
        // read once more, which says why or shows the truth, and the stream is tried again.
        if (es.readyState !== EventSource.CLOSED) { reconnecting(true); return; }
        stream = null;
        if (ended) ended({});
        retry();
      };
      // The server ended the stream for good (the session expired, the store is gone): no
      // retry; `ended` reads the page's last state (an expiry is recorded by that read).
      es.addEventListener("stream.end", (ev) => {
        es.close();
        stream = null;
        if (dot) dot.classList.remove("on");
        reconnecting(false);
        const end = JSON.parse(ev.data || "{}");
        if (end.status === 503) {
          // Its store is gone (a file deleted or replaced): only the server's restart mends it,
          // which the page cannot see but by trying again.
          down = (end.error && end.error.message) || "";
          retry();
          return;
        }
        over = true;
        if (end.status === 401) signInAgain((end.error && end.error.message) || "you are no longer signed in");
        else if (ended) ended(end);
      });
      (types || []).forEach((t) => es.addEventListener(t, handlers.any));
      Object.keys(handlers).forEach((t) => { if (t !== "any") es.addEventListener(t, handlers[t]); });
    };
    open();
  }

  // The pager says which page the cards are: the last, once the list shrank below the one shown;
  // the next reads ask for that page, and the address names it (a reload shows it). Its note
  // that the page asked is gone stays while that page is shown: the next read, asking for the
  // page shown, has none.
  function repage(pager) {
    const drawn = document.querySelector("[data-pager]");
    if (!pager || !drawn) return null;
    const was = drawn.dataset.query;
    const said = drawn.querySelector(".pager-note");
    if (said && !pager.querySelector(".pager-note") && pager.dataset.query === was) pager.append(said);
    // One dropped or shorter on a page scrolled to its bottom pulls the cards above down.
    moved(false);
    drawn.replaceWith(pager);
    moved(true);
    if (pager.dataset.query !== was) {
      const query = pager.dataset.query ? "?" + pager.dataset.query : "";
      history.replaceState(history.state, "", location.pathname + query + location.hash);
    }
    return pager;
  }

  // -- the queue ------------------------------------------------------------------------------
  const queue = document.querySelector("[data-live-queue]");
  if (queue) {
    // Without this script the page says to reload: nothing else would show a new request.
    document.querySelectorAll("[data-live-note]").forEach((el) => { el.textContent = "updates live"; });
    // Each event reads the cards anew, a stream's first too: the queue may have changed since
    // the page was made (or the stream dropped). A read answered after a later-asked one was
    // merged is dropped: it would bring back a request that one saw answered.
    let asked = 0;
    let merged = 0;
    const filtered = queue.hasAttribute("data-filtered");
    const read = async () => {
      const mine = ++asked;
      const q = queue.dataset.query;
      const res = await readAs(prefix + "/fragments/queue" + (q ? "?" + q : ""));
      if (await signedOut(res) || !res.ok) return;
      const html = await res.text();
      if (mine < merged) return;
      merged = mine;
      const shown = Number(res.headers.get("X-Total-Count"));
      if (filtered && Number.isInteger(shown)) setShown(shown);
      mergeCards(queue, html, (id) => prefix + "/requests/" + encodeURIComponent(id) + "/place" +
        (queue.dataset.query ? "?" + queue.dataset.query : ""));
      const pager = repage(fragment(html).querySelector("[data-pager]"));
      if (pager) queue.dataset.query = pager.dataset.query;
    };
    live(() => prefix + "/stream", {
      queue: (ev) => {
        const data = JSON.parse(ev.data);
        setTotal(data.total);
        if (!filtered) setShown(data.total);
        read();
      },
    }, [], read);
  }

  // -- a session ------------------------------------------------------------------------------
  let reread = null;  // a live session page's read of itself, for forms.js
  const sessionEl = document.querySelector("[data-live-session]");
  if (sessionEl) {
    const sid = sessionEl.dataset.liveSession;
    let seq = Number(sessionEl.dataset.seq || "0");
    let timer = null;
    let busy = false;
    const refresh = async () => {
      if (busy) { timer = setTimeout(refresh, 100); return; }
      busy = true;
      try {
        // The page of open requests shown (`page=`), which the pager's query names.
        const q = (document.querySelector("[data-pager]") || { dataset: {} }).dataset.query;
        const res = await readAs(prefix + "/fragments/sessions/" + encodeURIComponent(sid) + "?after=" + seq + (q ? "&" + q : ""));
        if (res.status === 404) { gone(); return; }
        if (await signedOut(res) || !res.ok) return;
        const data = await res.json();
        // Read again with nothing new (a stream reopened, the TTL passed): the header and what
        // is offered are drawn anew all the same, as a session's expiry records nothing.
        if (data.seq < seq) return;
        seq = data.seq;
        const trace = document.getElementById("trace");
        const rows = fragment(data.rows);
        rows.querySelectorAll("li").forEach((li) => li.classList.add("new"));
        const status = () => (document.querySelector("[data-session-status]") || {}).textContent;
        const was = status();
        const expired = () => Boolean(document.querySelector("[data-session-expired]"));
        const wasExpired = expired();
        moved(false);
        trace.appendChild(rows);
        document.getElementById("session-header").innerHTML = data.header;
        moved(true);
        if (status() !== was) toast("The session is now " + status());  // read out, too
        else if (expired() && !wasExpired) toast("The session expired");
        // Cancelling is offered while a turn runs or waits (for that turn), deleting once the
        // session is finished: redrawn only when what is offered changes, so a reason being
        // typed stays.
        const drawn = document.getElementById("session-delete");
        const offer = fragment(data.delete || "");
        const shape = (root) => {
          const forms = [...root.querySelectorAll("form")].map((f) => f.id + ":" + ((f.elements.namedItem("turn") || {}).value || ""));
          return forms.length ? forms.join(" ") : (root.textContent || "").trim();
        };
        if (drawn && shape(offer) !== shape(drawn)) {
          moved(false);
          drawn.replaceChildren(offer);
          moved(true);
        }
        // The message box, or why there is none (the session expired): redrawn only when which
        // of them it is changes, so a message being typed stays.
        const box = document.getElementById("session-send");
        const sendable = fragment(data.send || "");
        const which = (root) => (root.firstElementChild || {}).id || "";
        if (box && !box.hidden && which(sendable) !== which(box)) {
          moved(false);
          box.replaceChildren(sendable);
          moved(true);
        }
        mergeCards(document.getElementById("session-pending"), data.pending,
          (id) => prefix + "/requests/" + encodeURIComponent(id) + "/place?in=session");
        repage(fragment(data.pager).querySelector("[data-pager]"));
        document.querySelectorAll("[data-pending-total]").forEach((el) => { el.textContent = data.total ? String(data.total) : ""; });
        if (data.more) { clearTimeout(timer); timer = setTimeout(refresh, 0); }
      } finally {
        busy = false;
        // Looked at again after every read, a failed one too (else the page would keep its
        // message box until reloaded), unless the session was deleted.
        if (!deleted) watchExpiry();
      }
    };
    // Someone deleted the session while its page was open (its stream ended with
    // `unknown_session`, or its read is a 404): said once, at the page's top; nothing here can
    // be sent any more.
    let deleted = false;
    const gone = () => {
      deleted = true;
      clearTimeout(timer);
      clearTimeout(expiry);
      if (dot) dot.classList.remove("on");
      reconnecting(false);
      if (document.getElementById("session-deleted")) return;
      const note = document.createElement("p");
      note.id = "session-deleted";
      note.className = "warning";
      note.setAttribute("role", "alert");
      const back = document.createElement("a");
      back.href = prefix + "/sessions";
      back.textContent = "Back to Sessions";
      note.append("This session was deleted. ", back);
      ["session-send", "session-delete"].forEach((id) => {
        const el = document.getElementById(id);
        if (el) el.hidden = true;
      });
      document.querySelectorAll("#session-pending form button").forEach((b) => { b.disabled = true; });
      moved(false);
      (document.querySelector("main") || document.body).prepend(note);
      moved(true);
    };
    const types = (sessionEl.dataset.eventTypes || "").split(" ").filter(Boolean);
    const soon = () => { clearTimeout(timer); timer = setTimeout(refresh, 60); };
    // A session's TTL passing records nothing when no turn runs or waits (no event comes): the
    // page is read again once the header's expiry has passed, by the server's clock, as
    // ages.js reckons it, so it shows what a reload would (expired, no message box). A read
    // that finds it not yet expired (the clocks a little apart) waits twice as long each time.
    const served = Number(document.body.dataset.now);
    const skew = Number.isFinite(served) ? served * 1000 - Date.now() : 0;
    let expiry = null;
    let early = 0;
    function watchExpiry() {
      clearTimeout(expiry);
      const el = document.querySelector("#session-header [data-session-expires]");
      if (!el || document.querySelector("#session-header [data-session-expired]")) return;
      const left = Number(el.dataset.ts) * 1000 - (Date.now() + skew);
      early = left > 0 ? 0 : early + 1;
      const wait = Math.max(left, 0) + 500 * 2 ** Math.min(early, 7);
      // A wait past setTimeout's longest (24.8 days) would fire at once: it is looked at again.
      expiry = setTimeout(() => (Date.now() + skew < Number(el.dataset.ts) * 1000 ? watchExpiry() : soon()),
        Math.min(wait, 2 ** 31 - 1));
    }
    watchExpiry();
    reread = soon;
    // The store lost events this page shows (a crash, a restored copy) and may have written
    // others in their place: reading on after them would skip those, so the page is read anew.
    const ended = (end) => {
      if (end && end.error && end.error.code === "events_rewritten") location.reload();
      else if (end && (end.status === 404 || (end.error && end.error.code === "unknown_session"))) gone();
      else soon();
    };
    live(() => "/v1/sessions/" + encodeURIComponent(sid) + "/events?after=" + seq, { any: soon }, types, ended);
  }

  // What forms.js (loaded after this) says and does once a form is sent.
  window.signoffPage = { toast, signInAgain, keepTyped, leave, reread };
})();

// signoff dashboard: its forms, sent once (cancelling a turn, deleting a session, starting a
// conversation) or in place (a message, an answer). Toasts, the sign-in banner and a card's
// leaving are app.js's (`window.signoffPage`).
(function () {
  "use strict";
  const csrf = (document.querySelector('meta[name="csrf-token"]') || {}).content || "";
  const { toast, signInAgain, keepTyped, leave, reread } = window.signoffPage;

  // The refusals that ask for a reload (a CSRF token of an older sign-in, a form token out of
  // date or not this viewer's, a form token spent on other content): what was typed outlives it.
  const reloadAsked = ["csrf_failed", "invalid_form", "form_already_sent"];
  const keepIfReload = (data) => {
    if (data.error && reloadAsked.includes(data.error.code)) keepTyped();
  };

  // Where a removed form had the focus, its note takes it (and is read out): not the page's start.
  function noteFor(card, text, kind) {
    const note = document.createElement("p");
    note.className = "result-note " + kind;
    note.textContent = text;
    note.tabIndex = -1;
    card.appendChild(note);
    note.focus();
    return note;
  }

  // -- cancelling a turn, deleting a session: each form is sent once (a second sending would
  // find the turn cancelled, the session gone) ---------------------------------------------------
  const once = ["cancel-turn", "delete-session"];
  document.addEventListener("submit", (ev) => {
    const form = ev.target;
    if (!(form instanceof HTMLFormElement) || !once.includes(form.id)) return;
    if (form.dataset.sent) { ev.preventDefault(); return; }
    form.dataset.sent = "1";
    form.querySelector("button[type=submit]").disabled = true;
  });
  window.addEventListener("pageshow", () => {
    once.forEach((id) => {
      const form = document.getElementById(id);
      if (!form) return;
      delete form.dataset.sent;
      form.querySelector("button[type=submit]").disabled = false;
    });
  });

  // -- starting a conversation: once, however often Start is clicked --------------------------
  const started = document.getElementById("new-session");
  if (started) {
    started.addEventListener("submit", (ev) => {
      if (started.dataset.sent) { ev.preventDefault(); return; }
      started.dataset.sent = "1";
      started.querySelector("button[type=submit]").disabled = true;
    });
    // A page shown again from the back/forward cache may start another one.
    window.addEventListener("pageshow", () => {
      delete started.dataset.sent;
      started.querySelector("button[type=submit]").disabled = false;
    });
  }

  // -- sending a message from a session page (the trace follows over SSE); the form may be
  // drawn anew by a live update (app.js), so it is found by its id when sent -----------------
  // Refused as expired (the page's live updates lost, or not yet come): the form gives way to
  // the note a reload shows, and the page is read again (its header then says so).
  function expiredNote(send) {
    const note = document.createElement("p");
    note.className = "card sub";
    note.id = "send-expired";
    note.tabIndex = -1;
    note.setAttribute("role", "alert");
    const link = document.createElement("a");
    link.href = send.dataset.new;
    link.textContent = "Start a new conversation";
    note.append("This session expired: it takes no more messages (yours was not sent). ", link, ".");
    send.replaceWith(note);
    note.focus();
    if (reread) reread();
  }
  document.addEventListener("submit", async (ev) => {
    const send = ev.target;
    if (!(send instanceof HTMLFormElement) || send.id !== "send") return;
    ev.preventDefault();
    const button = send.querySelector("button");
    const error = send.querySelector(".form-error");
    const note = send.querySelector(".form-note");
    button.disabled = true;
    error.hidden = true;
    note.hidden = true;
    try {
      const res = await fetch(send.action, {
        method: "POST", body: new FormData(send), credentials: "same-origin",
        headers: { "Accept": "application/json", "X-CSRF-Token": csrf },
      });
      const data = await res.json().catch(() => ({ ok: false, error: { message: "Unexpected response (" + res.status + ")" } }));
      if (res.status === 401) signInAgain(data.error && data.error.message || "you are no longer signed in");
      keepIfReload(data);
      if (data.error && data.error.code === "session_expired" && send.dataset.new) {
        expiredNote(send);
        return;
      }
      if (!data.ok) throw new Error(data.error && data.error.message || "Sending failed");
      send.querySelector("textarea").value = "";
      // The form's token was spent on this message: the next one needs its own.
      const once = send.querySelector("input[name=form]");
      if (once && data.form) once.value = data.form;
      if (data.queued) {
        // Not the turn's person (or not now): the message starts the next turn, as its sender.
        note.textContent = "Your message waits for the current turn to end; it then starts the next turn.";
        note.hidden = false;
      }
    } catch (err) {
      error.textContent = err.message;
      error.hidden = false;
    } finally {
      button.disabled = false;
      // Disabling the button dropped the keyboard's focus: the message box takes it.
      if (send.isConnected && (!document.activeElement || document.activeElement === document.body)) {
        send.querySelector("textarea").focus();
      }
    }
  });

  // -- answering requests in place -------------------------------------------------------------
  document.addEventListener("submit", async (ev) => {
    const form = ev.target;
    if (!(form instanceof HTMLFormElement) || !form.classList.contains("respond")) return;
    ev.preventDefault();
    const card = form.closest("[data-request-id]");
    const body = new FormData(form);
    if (ev.submitter && ev.submitter.name) body.set(ev.submitter.name, ev.submitter.value);
    const buttons = Array.from(form.querySelectorAll("button:enabled"));  // not Enter's inert one
    buttons.forEach((b) => { b.disabled = true; });
    const error = form.querySelector(".form-error");
    if (error) error.hidden = true;
    card.classList.add("answering");
    try {
      const res = await fetch(form.action, {
        method: "POST", body, credentials: "same-origin",
        headers: { "Accept": "application/json", "X-CSRF-Token": csrf },
      });
      const data = await res.json().catch(() => ({ ok: false, error: { message: "Unexpected response (" + res.status + ")" } }));
      if (res.status === 401) signInAgain(data.error && data.error.message || "you are no longer signed in");
      keepIfReload(data);
      if (!data.ok) {
        const failed = new Error(data.error && data.error.message || "Request failed");
        failed.code = data.error && data.error.code;
        throw failed;
      }
      const settled = { approved: "Approved", cancelled: "Denied", answered: "Answered" };
      if (!settled[data.outcome] && data.outcome !== "counted") {
        // A response policy refused it: the request stays open, and the form keeps what was
        // typed, to be corrected (an edit) or left for someone else.
        throw new Error("Not accepted (" + data.outcome + ")" + (data.reason ? ": " + data.reason : "") + ". The request stays open.");
      }
      if (!settled[data.outcome]) {
        // A quorum vote counted: the request stays open, and one deny still closes it (a deny
        // is not a vote), so Deny stays; Approve goes where a person's vote counts once.
        if (form.hasAttribute("data-votes-once")) {
          form.querySelectorAll("button[value=approve]").forEach((b) => b.remove());
        }
        const reason = form.querySelector("input[name=text]");
        if (reason) reason.value = "";
        buttons.forEach((b) => { b.disabled = false; });
        const note = noteFor(card, "Your approval is counted (", "ok");
        const count = document.createElement("span");  // redrawn as others vote
        count.dataset.votes = "note";
        count.textContent = data.reason || "";
        note.append(count, "); waiting for more approvers. You may still deny it.");
        card.insertBefore(note, form);
        note.focus();
        return;
      }
      form.remove();
      if (data.already_by) {
        // Someone else gave this very answer first (this page was stale): it was not this one.
        const said = "Already " + settled[data.outcome].toLowerCase() + " by " + data.already_by;
        card.classList.add("done");
        noteFor(card, said + ": your answer changed nothing.", "barred");
        toast(said);
        setTimeout(() => leave(card), 2500);
      } else {
        let verb = settled[data.outcome];
        if (data.edited) verb += " with edited arguments";
        card.classList.add("done");
        noteFor(card, verb + " — the run is now " + data.status + ".", "ok");
        toast(verb + " " + card.querySelector(".tool-name").textContent.trim());
        setTimeout(() => leave(card), 2500);
      }
    } catch (err) {
      if (["conflicting_answer", "request_closed", "session_expired"].includes(err.code)) {
        // Someone else (another tab) closed it first, or it expired: say so, and offer no more
        // buttons, which could only fail alike. The card is `done`: a live update saying it
        // closed would otherwise add "closed elsewhere before you answered" beside this note.
        form.remove();
        card.classList.add("done");
        noteFor(card, err.message + ". Nothing was changed.", "bad");
        toast(err.message, true);
        setTimeout(() => leave(card), 8000);
        return;
      }
      buttons.forEach((b) => { b.disabled = false; });
      // Disabling the pressed button dropped the keyboard's focus: it goes back there.
      const lost = !document.activeElement || document.activeElement === document.body;
      if (lost && ev.submitter && !ev.submitter.hidden) ev.submitter.focus();
      if (error) { error.textContent = err.message; error.hidden = false; }
      toast(err.message, true);
    } finally {
      card.classList.remove("answering");  // a later live update may take it (unless `done`)
    }
  });
})();

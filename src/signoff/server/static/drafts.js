// signoff dashboard: what was typed and not sent outlives leaving the page (app.js says when
// it is to be kept: the sign-in ended, or a reload is asked for a fresh form token).
(function () {
  "use strict";
  // What was typed and not sent outlives leaving the page to sign in again (or a reload for a
  // fresh form token): kept in this tab as the page goes, filled in once when it comes back.
  // Only a box whose text differs from the page's own is kept (an edit box starts filled).
  const draftsKey = "signoff-drafts:" + location.pathname;
  let keepTyped = false;
  const boxes = () => document.querySelectorAll("form textarea, form input[type=text]");
  const draftKey = (el) => el.form.getAttribute("action") + " " + el.name;
  window.addEventListener("pagehide", () => {
    if (!keepTyped) return;
    const drafts = {};
    boxes().forEach((el) => { if (el.value !== el.defaultValue) drafts[draftKey(el)] = el.value; });
    try {
      if (Object.keys(drafts).length) {
        sessionStorage.setItem(draftsKey, JSON.stringify({ at: Date.now(), drafts }));
      }
    } catch (e) { /* storage off or full: nothing is kept */ }
  });
  (function restoreDrafts() {
    if (!boxes().length) return;  // a page with no box (a sign-in still refused) keeps them
    let kept = null;
    try {
      kept = JSON.parse(sessionStorage.getItem(draftsKey) || "null");
      sessionStorage.removeItem(draftsKey);
    } catch (e) { return; }
    // Text left a day ago in this tab, then this page opened again, is no longer a draft.
    if (!kept || !(Date.now() - kept.at < 86400000)) return;
    const drafts = kept.drafts || {};
    boxes().forEach((el) => {
      const text = drafts[draftKey(el)];
      if (typeof text !== "string") return;
      el.value = text;
      const folded = el.closest("details");
      if (folded) folded.open = true;
    });
  })();

  window.signoffDrafts = { keep() { keepTyped = true; } };
})();

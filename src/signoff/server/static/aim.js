// signoff dashboard: a click lands where it was aimed. A press on a button a live update moved
// under the pointer a moment before sends nothing and says so (app.js marks what it moves).
(function () {
  "use strict";
  // A live update moves buttons: a card above leaving or arriving, a banner, or a card below
  // leaving a page scrolled to its bottom (the browser pulls the scroll back, and every card
  // above slides down). A pointer resting on one request's Approve then rests on another's, and
  // a click meant for the first answered the second. A pointer's press on a button a live update
  // moved on screen (or brought in above others) less than `SETTLE` ms before sends nothing and
  // says so. What the reviewer's own doing moves (an edit box opened, their answer's note, their
  // scrolling) only updates where each button is, and so does each live change first: only what
  // it moves itself is marked (`moved(false)`, change, `moved(true)`).
  const SETTLE = 800;
  let pressedAt = -Infinity;
  // Where it is on screen, not on the page: reading it lays the page out, scroll clamp included.
  const screenAt = (el) => {
    const box = el.getBoundingClientRect();
    return box.left + "," + box.top;
  };
  function moved(live) {
    const now = String(performance.now());
    document.querySelectorAll("form.respond button").forEach((b) => {
      const at = screenAt(b);
      if (b.dataset.at === at) return;
      const card = b.closest("[data-request-id]");
      const next = card && card.nextElementSibling;
      // A card come in with older ones after it took the place one of theirs had.
      const cameAbove = b.dataset.at === undefined && next && next.querySelector("button[data-at]");
      if (live && (b.dataset.at !== undefined || cameAbove)) b.dataset.movedAt = now;
      b.dataset.at = at;
    });
  }
  moved(false);
  new MutationObserver(() => moved(false)).observe(document.body, {
    childList: true, subtree: true, attributes: true, attributeFilter: ["open", "hidden"],
  });
  window.addEventListener("resize", () => moved(false));
  // Any scroll, the page's or a box's (captured: a box's scroll does not bubble).
  window.addEventListener("scroll", () => moved(false), { capture: true, passive: true });
  document.addEventListener("pointerdown", () => { pressedAt = performance.now(); }, true);
  document.addEventListener("click", (ev) => {
    const button = ev.target instanceof Element ? ev.target.closest("form.respond button") : null;
    if (!button || ev.detail === 0) return;  // a key pressed it: the focus chose it, not a pointer
    if (!(Number(button.dataset.movedAt) > pressedAt - SETTLE)) return;
    ev.preventDefault();
    ev.stopImmediatePropagation();
    const error = button.form.querySelector(".form-error");
    if (error) {
      error.textContent = "This moved under the pointer as you clicked: nothing was sent. " +
        "Check that it is the request you mean, then click again.";
      error.hidden = false;
    }
  }, true);

  window.signoffAim = { moved };
})();

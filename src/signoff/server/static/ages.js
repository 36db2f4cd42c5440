// signoff dashboard: relative times ("3 minutes ago") stay true while the page is open (its live
// updates and forms are app.js's). They are reckoned by the server's clock (the runtime's, which
// stamped them), not this browser's, which may be off.
(function () {
  "use strict";
  const served = Number(document.body.dataset.now);
  const skew = Number.isFinite(served) ? served - Date.now() / 1000 : 0;
  function ago(ts) {
    let delta = Date.now() / 1000 + skew - ts;
    const future = delta < 0;
    delta = Math.abs(delta);
    let text;
    if (delta < 45) text = "a few seconds";
    else if (delta < 90) text = "a minute";
    else if (delta < 3600) text = Math.round(delta / 60) + " minutes";
    else if (delta < 5400) text = "an hour";
    else if (delta < 86400) text = Math.round(delta / 3600) + " hours";
    else text = Math.round(delta / 86400) + " days";
    return future ? "in " + text : text + " ago";
  }
  setInterval(() => {
    document.querySelectorAll("time[data-ts]").forEach((el) => { el.textContent = ago(Number(el.dataset.ts)); });
  }, 20000);
})();

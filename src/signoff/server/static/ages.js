// signoff dashboard: relative times ("3 minutes ago") stay true while the page is open (its live
// updates and forms are app.js's). They are reckoned by the server's clock (the runtime's, which
// stamped them), not this browser's, which may be off.
(function () {
  "use strict";
  const served = Number(document.body.dataset.now);
  const skew = Number.isFinite(served) ? served - Date.now() / 1000 : 0;
  const YEAR = 31557600; // a Julian year in seconds (365.25 days), as the server counts years
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
    else if (delta < 100 * YEAR) text = Math.round(delta / 86400) + " days";
    else if (delta < 10000 * YEAR) text = Math.floor(delta / YEAR) + " years";
    else text = "over 9999 years"; // as the server writes it: not "in 1.157e+295 days"
    return future ? "in " + text : text + " ago";
  }
  setInterval(() => {
    document.querySelectorAll("time[data-ts]").forEach((el) => { el.textContent = ago(Number(el.dataset.ts)); });
  }, 20000);
})();

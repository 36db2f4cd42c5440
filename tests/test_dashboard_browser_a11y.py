"""Accessibility basics of the dashboard in a real browser: every text is readable against its
background (WCAG 2 AA contrast), and every part of a page is in a landmark a screen reader can
go to by name."""

from __future__ import annotations

import httpx
from playwright.sync_api import Page, expect

from ._dashboard_browser import base, browser, page, start
from .test_server_common import PLAIN, auth

__all__ = ["base", "browser", "page"]  # the fixtures, used by name

# Each element's own text (not its children's) with the colour it is drawn in, the first
# opaque background behind it, its size and weight; the WCAG 2 contrast ratio of the two.
_CONTRASTS = """() => {
  const rgb = (text) => (text.match(/[\\d.]+/g) || []).map(Number);
  const lum = ([r, g, b]) => {
    const c = [r, g, b].map((v) => {
      v /= 255;
      return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4;
    });
    return 0.2126 * c[0] + 0.7152 * c[1] + 0.0722 * c[2];
  };
  const behind = (el) => {
    for (; el; el = el.parentElement) {
      const c = rgb(getComputedStyle(el).backgroundColor);
      if (c.length === 3 || (c.length === 4 && c[3] === 1)) return c.slice(0, 3);
    }
    return [255, 255, 255];
  };
  const out = [];
  document.querySelectorAll("body *").forEach((el) => {
    const own = Array.from(el.childNodes).some((n) => n.nodeType === 3 && n.textContent.trim());
    if (!own || !el.checkVisibility({ opacityProperty: true, visibilityProperty: true })) return;
    if (el.closest("button:disabled, [hidden]")) return;
    const style = getComputedStyle(el);
    const [a, b] = [lum(rgb(style.color).slice(0, 3)), lum(behind(el))];
    const ratio = (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
    const size = parseFloat(style.fontSize);
    const large = size >= 24 || (size >= 18.66 && Number(style.fontWeight) >= 700);
    if (ratio < (large ? 3 : 4.5)) {
      const text = el.textContent.trim().slice(0, 30);
      out.push(`${el.tagName.toLowerCase()}.${el.className} '${text}' ${ratio.toFixed(2)}`);
    }
  });
  return out;
}"""

# What a page holds outside the landmarks (banner, navigation, main, a named region...), and
# the landmarks of one role that share a name (or have none): a screen reader cannot tell
# them apart.
_LANDMARKS = """() => {
  const marks = "header, nav, main, footer, aside, section[aria-label], [role=region][aria-label]";
  const stray = Array.from(document.body.children).filter(
    (el) => !el.matches(marks) && el.textContent.trim() && el.checkVisibility()
  ).map((el) => el.tagName.toLowerCase() + "." + el.className);
  const names = {};
  document.querySelectorAll("nav").forEach((el) => {
    const name = el.getAttribute("aria-label") || "";
    names[name] = (names[name] || 0) + 1;
  });
  const alike = Object.entries(names).filter(([, n]) => n > 1).map(([name]) => `nav '${name}'`);
  return stray.concat(alike);
}"""


def test_text_is_readable_and_every_part_is_in_a_landmark(page: Page, base: str) -> None:
    """Grey text (labels, headings of tables, times, session links, counts) was #7d8494, 3.4 to
    3.7 against its backgrounds, and Approve's white on green 4.4 (axe-core: 21 texts of the
    queue, 33 of the tools page); the demo banner was in no landmark, and the audit's two
    navigations had no names to tell them apart."""
    approval = start(base)
    question = start(base, "helper")
    answered = start(base, "treasury")
    edited = start(base)  # approved with edited arguments: the audit shows both
    edit = {"order_id": "1042", "amount": 120, "reason": "partial refund"}
    vote = {"requestId": edited["pending"][0]["id"], "optionId": "approve", "editedInput": edit}
    r = httpx.post(
        f"{base}/v1/sessions/{edited['session_id']}/responses",
        json={"inputResponses": [vote]},
        headers=auth("alice-token"),
        timeout=10,
        verify=PLAIN,
    )
    assert r.status_code == 200, r.text
    pages = [
        "/_signoff/",
        f"/_signoff/sessions/{approval['session_id']}",
        f"/_signoff/sessions/{question['session_id']}",
        "/_signoff/sessions",
        "/_signoff/audit",
        "/_signoff/audit/tools",
        "/_signoff/tools",
        "/_signoff/new",
    ]
    card = page.locator(f"[data-request-id='{answered['pending'][0]['id']}']")
    card.get_by_role("button", name="Approve").click()
    expect(card.locator(".result-note.ok")).to_be_visible()
    found = {"/_signoff/ (a vote counted)": page.evaluate(_CONTRASTS)}
    for path in pages:
        page.goto(path)
        page.wait_for_timeout(400)  # a new card's arrival fades in
        page.locator("details.edited").evaluate_all("all => all.forEach((d) => { d.open = true; })")
        if path == "/_signoff/audit":  # the edit's two argument boxes are checked too
            expect(page.locator("details.edited[open] pre.json")).to_have_count(2)
        found[path] = page.evaluate(_CONTRASTS) + page.evaluate(_LANDMARKS)
    assert {path: bad for path, bad in found.items() if bad} == {}


def test_each_request_card_is_named_by_what_it_asks(page: Page, base: str) -> None:
    """A screen reader listed the queue's cards as "article", each alike, beside many buttons
    named just "Approve": nothing said which request a card (and its buttons) was about."""
    approval = start(base)
    question = start(base, "helper")
    page.goto("/_signoff/")
    named = {
        approval["pending"][0]["id"]: "issue_refund approval support",
        question["pending"][0]["id"]: "Which size should the replacement be? question helper",
    }
    for rid, name in named.items():
        card = page.get_by_role("article", name=name)
        expect(card).to_have_attribute("data-request-id", rid)
        expect(card.get_by_role("button").first).to_have_accessible_description(
            name.rsplit(" ", 2)[0]
        )


# The element the keyboard's focus is on, and its focus ring: style, width, colour, and the
# WCAG 2 contrast of that colour against the first opaque background around the element (the
# ring is drawn outside it).
_RING = """() => {
  const el = document.activeElement;
  if (!el || el === document.body) return null;
  const rgb = (text) => (text.match(/[\\d.]+/g) || []).map(Number);
  const lum = ([r, g, b]) => {
    const c = [r, g, b].map((v) => {
      v /= 255;
      return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4;
    });
    return 0.2126 * c[0] + 0.7152 * c[1] + 0.0722 * c[2];
  };
  let around = [255, 255, 255];
  for (let p = el.parentElement; p; p = p.parentElement) {
    const c = rgb(getComputedStyle(p).backgroundColor);
    if (c.length === 3 || (c.length === 4 && c[3] === 1)) { around = c.slice(0, 3); break; }
  }
  const style = getComputedStyle(el);
  const ring = rgb(style.outlineColor);
  const [a, b] = [lum(ring.slice(0, 3)), lum(around)];
  const name = el.name ? "[name=" + el.name + "]" : "";
  const text = (el.textContent || "").trim().slice(0, 20);
  const kind = el.className ? "." + el.className : "";
  const what = el.tagName.toLowerCase() + name + kind + ` '${text}'`;
  return {
    what,
    style: style.outlineStyle,
    width: parseFloat(style.outlineWidth),
    opaque: ring.length === 3 || ring[3] === 1,
    contrast: (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05),
  };
}"""


def test_the_keyboards_focus_is_clearly_ringed_on_every_control(page: Page, base: str) -> None:
    """A select or text box the keyboard reached only turned its border indigo, with a faint
    ring (indigo at 35%, 1.75:1 against the white card) a low-vision reviewer could not find;
    buttons and links had the browser's own ring. Tabbing through each page, every stop now has
    the same solid ring of 2px or more, 3:1 at least against what is around it (WCAG 2.4.7,
    2.4.11)."""
    approval = start(base)
    question = start(base, "helper")
    pages = [
        "/_signoff/",
        f"/_signoff/sessions/{approval['session_id']}",
        f"/_signoff/sessions/{question['session_id']}",
        "/_signoff/sessions",
        "/_signoff/new",
    ]
    seen: set[str] = set()
    faint: dict[str, list[str]] = {}
    for path in pages:
        page.goto(path)
        page.wait_for_timeout(400)  # a new card's arrival fades in
        page.locator("details.edit").evaluate_all("all => all.forEach((d) => { d.open = true; })")
        first = None
        for _ in range(80):
            page.keyboard.press("Tab")
            ring = page.evaluate(_RING)
            if ring is None or ring["what"] == first:
                break
            first = first or ring["what"]
            seen.add(ring["what"].partition("'")[0].split(".")[0].strip())
            shown = f"{ring['style']} {ring['width']}px, {ring['contrast']:.2f}:1"
            solid = ring["style"] == "solid" and ring["width"] >= 2 and ring["opaque"]
            if not solid or ring["contrast"] < 3:
                faint.setdefault(path, []).append(f"{ring['what']} {shown}")
    # every kind of control was reached: selects, the text boxes, buttons, links, a summary
    for control in ("select[name=agent]", "input[name=text]", "textarea[name=edited_input]"):
        assert control in seen, seen
    assert {"textarea[name=message]", "button", "a", "summary"} <= seen, seen
    assert faint == {}

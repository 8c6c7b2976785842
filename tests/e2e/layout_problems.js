() => {
  const problems = [];
  const width = document.documentElement.clientWidth;
  if (document.documentElement.scrollWidth > width + 1) {
    problems.push(`the page is ${document.documentElement.scrollWidth} px wide in a window of ${width}`);
  }
  const shown = (e) => e.offsetParent !== null && e.getClientRects().length > 0;
  // Inside a box in the window that scrolls or clips sideways: its own business. A clipping
  // box itself scrolled out of sight (a cell of a wide table) defers to the boxes around it.
  const clipped = (e) => {
    for (let p = e.parentElement; p; p = p.parentElement) {
      const o = getComputedStyle(p).overflowX;
      const inside = p.getBoundingClientRect().right <= width + 1;
      if (o === "auto" || o === "scroll") return inside;
      if (o === "hidden" && inside) return true;
    }
    return false;
  };
  for (const e of document.querySelectorAll("body *")) {
    if (!shown(e) || clipped(e)) continue;
    const right = e.getBoundingClientRect().right;
    if (right > width + 1) problems.push(`${e.tagName.toLowerCase()}#${e.id}.${e.className} ends at ${Math.round(right)} px`);
  }
  // What a header shows: its text less a label kept for screen readers alone (.sr-only).
  const visible = (e) => [...e.childNodes].filter((n) => !(n.classList && n.classList.contains("sr-only")));
  const textWidth = (e) => Math.max(0, ...visible(e).map((n) => {
    const range = document.createRange();
    range.selectNodeContents(n);
    return range.getBoundingClientRect().width;
  }));
  for (const table of document.querySelectorAll("table")) {
    if (!shown(table)) continue;
    const heads = [...table.querySelectorAll("thead th")];
    heads.forEach((th, column) => {
      const label = visible(th).map((n) => n.textContent).join("").trim();
      if (!label) return;
      const need = textWidth(th);
      const room = th.clientWidth - parseFloat(getComputedStyle(th).paddingLeft) - parseFloat(getComputedStyle(th).paddingRight);
      if (need > room + 1) problems.push(`header "${label}" is cut (${Math.round(room)} of ${Math.round(need)} px)`);
      for (const row of table.querySelectorAll("tbody tr")) {
        const cells = row.querySelectorAll("td, th");
        if (cells.length !== heads.length) continue;
        if (cells[column].getBoundingClientRect().width + 1 < need) {
          problems.push(`a cell of "${label}" is ${Math.round(cells[column].getBoundingClientRect().width)} px, narrower than its header`);
          break;
        }
      }
    });
  }
  // Parallel coordinates: no word over the band its lines cross, none over another word.
  for (const chart of document.querySelectorAll(".chart.parallel svg")) {
    if (!shown(chart)) continue;
    const axes = [...chart.querySelectorAll("line.axis")].map((l) => l.getBoundingClientRect());
    const top = Math.min(...axes.map((a) => a.top)), bottom = Math.max(...axes.map((a) => a.bottom));
    const words = [...chart.querySelectorAll("text")].map((t) => [t.textContent, t.getBoundingClientRect()]);
    words.forEach(([text, box], i) => {
      if (box.bottom > top + 1 && box.top < bottom - 1) problems.push(`parallel coordinates: "${text}" is written over its lines`);
      for (const [other, near] of words.slice(i + 1)) {
        if (box.left < near.right && near.left < box.right && box.top < near.bottom && near.top < box.bottom) {
          problems.push(`parallel coordinates: "${text}" and "${other}" are written over each other`);
        }
      }
    });
  }
  return [...new Set(problems)];
}

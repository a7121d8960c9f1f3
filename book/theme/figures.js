// Every figure of a page opens at full size: each image in the article is wrapped in a link to
// itself (on a phone a figure is drawn small; the image alone can be zoomed). Loaded on every
// page (_config.yml, html_js_files); nothing leaves the site. Images that are already links, and
// widgets' images, are left as they are.
//
// On a narrow screen a wide figure is drawn 640 px wide in a box of its own that scrolls
// sideways (book.css). When it does, a shadow marks the side with more to see, and a line
// under it says so: "swipe · tap to enlarge".
//
// An animation (matplotlib's player, div.animation) is a figure too: its frame opens at full
// size (the frame shown at the time), in the same box; its controls stay under it.
document.addEventListener("DOMContentLoaded", () => {
  const zh = document.documentElement.lang.startsWith("zh");
  const title = zh ? "打开原尺寸图片" : "Open the figure at full size";
  const hint = zh ? "左右滑动 · 点按放大" : "swipe \u2194 · tap to enlarge";

  // A data: address as a blob's address: a browser opens no data: address in a tab.
  const blobAddress = (data) => {
    const [head, body] = data.split(",");
    const bytes = Uint8Array.from(atob(body), c => c.charCodeAt(0));
    return URL.createObjectURL(new Blob([bytes], {type: head.slice(5).split(";")[0]}));
  };

  // Marks whether the box scrolls, and on which sides there is more to see.
  const cue = (box, link) => {
    const more = link.scrollWidth - link.clientWidth;
    box.classList.toggle("scrolls", more > 1);
    box.classList.toggle("more-left", link.scrollLeft > 1);
    box.classList.toggle("more-right", more - link.scrollLeft > 1);
  };
  const boxes = [];

  for (const img of document.querySelectorAll("article.bd-article img")) {
    if (img.closest("a, .widget-area, .jupyter-widgets")) continue;
    const link = document.createElement("a");
    link.className = "figure-full-size";
    link.title = title;
    link.target = "_blank";
    link.rel = "noopener";
    const box = document.createElement("div");
    box.className = "figure-box";
    const line = document.createElement("div");
    line.className = "figure-hint";
    line.textContent = hint;
    img.replaceWith(box);
    box.append(link);
    box.after(line);
    link.append(img);
    boxes.push([box, link]);
    link.addEventListener("scroll", () => cue(box, link), {passive: true});

    // The link leads to the image shown (an animation shows one per frame); once it has
    // loaded, its size says whether it is wide (a box of its own on narrow screens, book.css).
    let shown = null;
    const point = () => {
      if (!img.src || img.src === shown) return;
      shown = img.src;
      if (link.href.startsWith("blob:")) URL.revokeObjectURL(link.href);
      link.href = img.src.startsWith("data:") ? blobAddress(img.src) : img.src;
    };
    const loaded = () => {
      point();
      link.classList.toggle("wide", img.naturalWidth > 640);
      cue(box, link);
    };
    img.addEventListener("load", loaded);
    point();
    if (img.complete && img.naturalWidth) loaded();
  }

  const measure = () => boxes.forEach(([box, link]) => cue(box, link));
  window.addEventListener("resize", measure);
  window.addEventListener("load", measure);
});

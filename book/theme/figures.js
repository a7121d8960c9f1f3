// Every figure of a page opens at full size: each image in the article is wrapped in a link to
// itself (on a phone a figure is drawn small; the image alone can be zoomed). Loaded on every
// page (_config.yml, html_js_files); nothing leaves the site. An animation's frames and images
// that are already links are left as they are.
document.addEventListener("DOMContentLoaded", () => {
  const zh = document.documentElement.lang.startsWith("zh");
  const title = zh ? "打开原尺寸图片" : "Open the figure at full size";
  for (const img of document.querySelectorAll("article.bd-article img")) {
    if (img.closest("a, div.animation, .widget-area, .jupyter-widgets")) continue;
    const link = document.createElement("a");
    link.className = "figure-full-size";
    link.title = title;
    link.target = "_blank";
    link.rel = "noopener";
    link.href = img.src;
    if (img.src.startsWith("data:")) {   // a browser opens no data: address: hand it a blob's
      fetch(img.src).then(r => r.blob()).then(blob => { link.href = URL.createObjectURL(blob); });
    }
    img.replaceWith(link);
    link.append(img);
    // Wide figures get a box of their own on narrow screens (book.css).
    const measure = () => link.classList.toggle("wide", img.naturalWidth > 640);
    if (img.complete) measure(); else img.addEventListener("load", measure);
  }
});

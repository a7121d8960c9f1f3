// Loaded just before require.js and the Jupyter widgets' HTML manager (embed-amd.js), on the
// pages that have widgets. The manager's icon fonts lie beside it, in this site's
// _static/offline/html-manager/dist/; left alone, it would look for them relative to the page.
(function () {
  const dist = new URL("offline/html-manager/", document.currentScript.src).href;
  window.__jupyter_widgets_assets_path__ = dist + "dist/";
  // A global `require` object before require.js loads is its configuration: the manager's
  // modules (and so the fonts found from their address) are under _static/offline/.
  window.require = {paths: {"@jupyter-widgets/html-manager": dist.replace(/\/$/, "")}};
})();

// ipywidgets typesets its labels with MathJax 2's API (MathJax.Hub.Queue); the site serves
// MathJax 3, which has another. Where a page has both, translate the one call it makes. The
// widgets render on the page's `load` event; MathJax (a deferred script) is there before.
document.addEventListener("DOMContentLoaded", function () {
  const mathjax = window.MathJax;
  if (!mathjax || mathjax.Hub || !mathjax.startup) return;
  mathjax.Hub = {
    Queue: function (...commands) {
      for (const [name, , element] of commands) {
        if (name === "Typeset" && element) {
          mathjax.startup.promise.then(() => mathjax.typesetPromise([element]));
        }
      }
    },
  };
});

// Route by path: /, /experiment/<file>, /step/<relative output path>.
"use strict";

(async () => {
  const main = document.getElementById("main");
  const path = route().path;
  try {
    if (path.startsWith("/experiment/")) await experimentPage(main, decodeURIComponent(path.slice("/experiment/".length)));
    else if (path.startsWith("/step/")) await stepPage(main, path.slice("/step/".length).split("/").map(decodeURIComponent).join("/"));
    else await experimentsPage(main);
  } catch (error) {
    showError(main, error);
  }
})();

// The DAG, laid out left to right by dagre (vendored) and drawn as SVG; pan by dragging, zoom with the wheel.
// Node colours are updated in place on every poll; the layout is recomputed only when the node set changes.
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";
const MIN_DAG_SCALE = 0.8;  // a 12 px label is drawn at 9.6 px at least
const STATUS_COLOURS = {
  SUCCESS: ["#e7f6ed", "#1f9d55"], RUNNING: ["#e6efff", "#2f6fdf"], WAITING: ["#fff5dc", "#c98a0c"],
  FAILED: ["#fdecec", "#d64545"], DEP_FAILED: ["#fdf0e6", "#e07b39"], NEVER_RAN: ["#f1f3f6", "#9aa3af"],
  CORRUPT: ["#f1eafe", "#8b5cf6"],
};

function svg(tag, attrs, ...children) {
  const element = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs || {})) element.setAttribute(key, String(value));
  for (const child of children) element.append(child instanceof Node ? child : document.createTextNode(String(child)));
  return element;
}

class DagView {
  constructor(container, onNodeClick) {
    this.container = container;
    this.onNodeClick = onNodeClick;
    this.signature = null;
    this.nodes = new Map();
  }

  update(data) {
    const signature = JSON.stringify([data.nodes.map((node) => [node.id, node.label]), data.edges.length]);
    if (signature !== this.signature) {
      this.signature = signature;
      this.layout(data);
    }
    for (const node of data.nodes) this.colour(node);
  }

  layout(data) {
    const graph = new dagre.graphlib.Graph();
    graph.setGraph({ rankdir: "LR", nodesep: 18, ranksep: 70, marginx: 20, marginy: 20 });
    graph.setDefaultEdgeLabel(() => ({}));
    for (const node of data.nodes) {
      // Wide enough for the label (and, for a group, its counts line), so text never spills onto edges.
      const counts = node.counts ? Object.keys(node.counts).length : 0;
      const text = Math.max(7.2 * node.label.length, counts ? 60 + 80 * counts : 0);
      const width = Math.min(data.grouped ? 520 : 280, Math.max(120, text + 30));
      graph.setNode(String(node.id), { width, height: data.grouped ? 48 : 38 });
    }
    for (const edge of data.edges) graph.setEdge(String(edge.source), String(edge.target), { blocking: edge.blocking });
    dagre.layout(graph);
    // Never magnify a small DAG (it is centred in the box), and never shrink a large one past MIN_DAG_SCALE, where
    // its labels would be unreadable: it opens at its start (its first steps, left), the rest a drag or a wheel away.
    const box = this.container.getBoundingClientRect();
    const boxWidth = box.width || 800, boxHeight = box.height || 400;
    const graphWidth = graph.graph().width, graphHeight = graph.graph().height;
    const scale = Math.max(MIN_DAG_SCALE, Math.min(1, boxWidth / graphWidth, boxHeight / graphHeight));
    const width = boxWidth / scale, height = boxHeight / scale;
    const offsetX = graphWidth <= width ? (graphWidth - width) / 2 : 0;
    const offsetY = graphHeight <= height ? (graphHeight - height) / 2 : 0;
    const root = svg("svg", { viewBox: `${offsetX} ${offsetY} ${width} ${height}`, "data-testid": "dag", "data-scale": scale.toFixed(3) });
    root.append(svg("defs", {}, svg("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 7,
      markerHeight: 7, orient: "auto-start-reverse" }, svg("path", { d: "M 0 0 L 10 5 L 0 10 z", fill: "#8a94a6" }))));
    const scene = svg("g", {});
    root.append(scene);
    for (const edgeId of graph.edges()) {
      const edge = graph.edge(edgeId);
      const d = edge.points.map((point, index) => `${index ? "L" : "M"} ${point.x} ${point.y}`).join(" ");
      scene.append(svg("path", { d, class: edge.blocking ? "edge" : "edge pseudo", "marker-end": "url(#arrow)",
        "data-edge": `${edgeId.v}->${edgeId.w}` }));
    }
    this.nodes.clear();
    for (const node of data.nodes) scene.append(this.drawNode(node, graph.node(String(node.id)), data.grouped));
    this.container.replaceChildren(root, h("div", { class: "hint" }, "drag to pan · wheel to zoom · click a node"));
    this.enablePanZoom(root, offsetX, offsetY, width, height);
  }

  drawNode(node, box, grouped) {
    const group = svg("g", { class: "node", transform: `translate(${box.x - box.width / 2},${box.y - box.height / 2})`,
      "data-node": node.label });
    const rect = svg("rect", { width: box.width, height: box.height, rx: 7 });
    const title = svg("title", {}, node.label);
    const label = node.label.length > 36 ? `…${node.label.slice(-35)}` : node.label;
    group.append(title, rect, svg("text", { x: 12, y: grouped ? 19 : 23 }, label));
    if (grouped) group.append(svg("text", { x: 12, y: 37, class: "sub" }, ""));
    group.addEventListener("click", () => this.onNodeClick(node));
    this.nodes.set(node.id, group);
    return group;
  }

  colour(node) {
    const group = this.nodes.get(node.id);
    if (!group) return;
    const [fill, stroke] = STATUS_COLOURS[node.status] || STATUS_COLOURS.NEVER_RAN;
    const rect = group.querySelector("rect");
    rect.setAttribute("fill", fill);
    rect.setAttribute("stroke", stroke);
    group.setAttribute("data-status", node.status);
    group.querySelector("title").textContent = `${node.label}: ${node.status}`;
    const sub = group.querySelector(".sub");
    if (sub && node.counts) {
      sub.textContent = `${fmtNum(node.size)} steps · ` + STATUSES.filter((status) => node.counts[status])
        .map((status) => `${fmtNum(node.counts[status])} ${status.toLowerCase()}`).join(", ");
    }
  }

  enablePanZoom(root, x, y, width, height) {
    let view = { x, y, w: width, h: height };
    const apply = () => root.setAttribute("viewBox", `${view.x} ${view.y} ${view.w} ${view.h}`);
    root.addEventListener("wheel", (event) => {
      event.preventDefault();
      const scale = event.deltaY > 0 ? 1.15 : 1 / 1.15;
      const rect = root.getBoundingClientRect();
      const fx = (event.clientX - rect.left) / rect.width, fy = (event.clientY - rect.top) / rect.height;
      const nw = view.w * scale, nh = view.h * scale;
      view = { x: view.x + (view.w - nw) * fx, y: view.y + (view.h - nh) * fy, w: nw, h: nh };
      apply();
    }, { passive: false });
    let drag = null;
    root.addEventListener("pointerdown", (event) => { drag = { x: event.clientX, y: event.clientY, view: { ...view } }; });
    window.addEventListener("pointerup", () => { drag = null; });
    root.addEventListener("pointermove", (event) => {
      if (!drag) return;
      const rect = root.getBoundingClientRect();
      const k = Math.max(view.w / rect.width, view.h / rect.height);
      view = { ...drag.view, x: drag.view.x - (event.clientX - drag.x) * k, y: drag.view.y - (event.clientY - drag.y) * k };
      apply();
    });
  }
}

function graphLegend() {
  const line = (dashed) => svg("svg", { width: 34, height: 10 }, svg("line", { x1: 0, y1: 5, x2: 34, y2: 5,
    stroke: "#8a94a6", "stroke-width": 1.5, "stroke-dasharray": dashed ? "5 4" : "none" }));
  return h("div", { class: "legend" },
    h("span", {}, line(false), " dependency"), h("span", {}, line(true), " pseudo-dependency (hashed, not waited on)"),
    ...["SUCCESS", "RUNNING", "WAITING", "FAILED", "DEP_FAILED", "NEVER_RAN"].map((status) =>
      h("span", {}, dot(status), " ", status === "NEVER_RAN" ? "never ran" : status.toLowerCase())));
}
